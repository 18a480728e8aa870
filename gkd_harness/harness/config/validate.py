"""Range and cross-field rules of a :class:`~gkd_harness.harness.config.schema.TrainConfig`, run once before any model loads.

Types and structure are the schema's job (``gkd_harness.harness.config.schema``); this module checks what a type cannot say: β in
[0, 1], a positive temperature, finite numbers, existing model folders, matching vocabularies, a rollout engine
that fits ``gkd.lmbda``, no boundary cast on Megatron unless asked for, and hub ids that cannot be fetched while
offline, safe group / run / tag names (``name_rules``), guarded ``run.extra_args`` (``extra_args_rules``) and
the first rows of a local dataset (``dataset_rules``).
Every error is a :class:`~gkd_harness.harness.config.schema.ConfigError` naming the key. It reads only small files
(``config.json`` of local models) and imports neither torch nor ms-swift.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Optional

from gkd_harness.harness.config.candidate_rules import validate_candidate
from gkd_harness.harness.config.dataset_rules import hub_offline, validate_datasets
from gkd_harness.harness.config.extra_args_rules import validate_extra_args
from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.name_rules import NOT_NAME_KEYS, validate_names
from gkd_harness.harness.config.path_rules import check_local_dataset, check_output_dir, check_path_length
from gkd_harness.harness.config.rollout_rules import validate_rollout
from gkd_harness.harness.config.schema import (
    BACKENDS,
    DEVICES,
    EMBEDDED,
    WANDB_MODES,
    ConfigError,
    MegatronBackendConfig,
    TrainConfig,
    to_dict,
)
from gkd_harness.harness.config.secrets import find_secret_keys, secret_refusal
from gkd_harness.harness.contract import BETA_FORMS, DTYPE_NAMES, EMBEDDED_TOKENIZERS, PRECISIONS

#: the smallest vocabulary the byte-level embedded tokenizer can have (256 bytes + chat tokens + merges)
MIN_EMBEDDED_VOCAB = 300


def is_local_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists()


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of transformers
        return True
    hit = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(hit, str)


def local_vocab_size(path: str) -> Optional[int]:
    conf = Path(path).expanduser() / "config.json"
    if conf.is_file():
        data = json.loads(conf.read_text())
        vocab = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
        return int(vocab) if vocab else None
    return None


def model_vocab_size(cfg: TrainConfig, side: str) -> Optional[int]:
    """Vocabulary size of the student or teacher without loading it (None if unknown)."""
    value = getattr(cfg.model, side)
    if value == EMBEDDED:
        return cfg.model.embedded.vocab_size if cfg.model.embedded is not None else None
    return local_vocab_size(value)


def _check_model(cfg: TrainConfig, side: str, dry_run: bool) -> None:
    key, value = f"model.{side}", getattr(cfg.model, side)
    if not value:
        raise ConfigError(key, f"must be '{EMBEDDED}', a local model folder or a hub id, got {value!r}")
    if value == EMBEDDED:
        if cfg.model.embedded is None:
            raise ConfigError("model.embedded", f"must be set when {key}={EMBEDDED}")
        return
    if is_local_path(value):
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ConfigError(key, f"model folder {value} does not exist")
        if not (path / "config.json").is_file():
            raise ConfigError(key, f"{value} has no config.json (not a model folder)")
    elif hub_offline() and not dry_run and not _in_hub_cache(value):
        raise ConfigError(
            key,
            f"{value!r} is not a local folder and not in the Hugging Face cache, and "
            "HF_HUB_OFFLINE is set: point the key at a local copy (configs/local/default.yaml)",
        )


def _finite(key: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value}")


def _at_least(key: str, value: Optional[int], low: int, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if value is None or value < low:
        raise ConfigError(key, f"must be an integer >= {low}{' or null' if nullable else ''}, got {value}")


def _embedded(cfg: TrainConfig) -> None:
    spec = cfg.model.embedded
    if spec is None:
        return
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "num_samples",
    ):
        _at_least(f"model.embedded.{name}", getattr(spec, name), 1)
    if spec.vocab_size < MIN_EMBEDDED_VOCAB:
        raise ConfigError(
            "model.embedded.vocab_size", f"must be >= {MIN_EMBEDDED_VOCAB} (256 bytes + chat tokens + merges)"
        )
    if spec.num_heads % spec.num_kv_heads:
        raise ConfigError("model.embedded.num_kv_heads", "must divide model.embedded.num_heads")
    if not spec.teacher_noise >= 0:
        raise ConfigError("model.embedded.teacher_noise", f"must be >= 0, got {spec.teacher_noise}")
    if not spec.init_std > 0:
        raise ConfigError("model.embedded.init_std", f"must be > 0, got {spec.init_std}")
    if spec.tokenizer not in EMBEDDED_TOKENIZERS:
        raise ConfigError(
            "model.embedded.tokenizer", f"must be one of {list(EMBEDDED_TOKENIZERS)}, got {spec.tokenizer!r}"
        )
    if spec.teacher not in ("near_copy", "trained"):
        raise ConfigError("model.embedded.teacher", f"must be near_copy or trained, got {spec.teacher!r}")
    if spec.teacher == "trained":
        _at_least("model.embedded.teacher_steps", spec.teacher_steps, 1)
        _at_least("model.embedded.teacher_corpus", spec.teacher_corpus, 1)
        if not spec.teacher_lr > 0:
            raise ConfigError("model.embedded.teacher_lr", f"must be > 0, got {spec.teacher_lr}")
    if spec.student_start not in ("random", "near_teacher"):
        raise ConfigError("model.embedded.student_start", f"must be random or near_teacher, got {spec.student_start!r}")
    if spec.student_start == "near_teacher":
        if spec.teacher != "trained":
            raise ConfigError("model.embedded.student_start", "near_teacher needs model.embedded.teacher=trained")
        if not spec.student_noise > 0:
            raise ConfigError(
                "model.embedded.student_noise", f"must be > 0 with student_start=near_teacher, got {spec.student_noise}"
            )


def validate_config(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` (a ValueError naming the key) for the first invalid value in ``cfg``."""
    for key, value in flatten(cfg).items():
        _finite(key, value)
    for key in find_secret_keys(to_dict(cfg)):
        raise ConfigError(key, secret_refusal(key))
    flat = flatten(cfg)
    for key in sorted(NOT_NAME_KEYS - {"run.extra_args", "rollout.vllm.server.base_url"}):
        check_path_length(key, flat.get(key))  # before any stat of it ("File name too long")

    if cfg.loss.precision not in PRECISIONS:
        raise ConfigError("loss.precision", f"must be one of {list(PRECISIONS)}, got {cfg.loss.precision!r}")
    if cfg.loss.beta_form not in BETA_FORMS:
        raise ConfigError("loss.beta_form", f"must be one of {list(BETA_FORMS)}, got {cfg.loss.beta_form!r}")
    validate_candidate(cfg)

    gkd = cfg.gkd
    if not 0.0 <= gkd.beta <= 1.0:
        raise ConfigError("gkd.beta", f"must lie in [0, 1], got {gkd.beta}")
    if not gkd.temperature > 0:
        raise ConfigError("gkd.temperature", f"must be > 0, got {gkd.temperature}")
    if gkd.sft_alpha < 0:
        raise ConfigError("gkd.sft_alpha", f"must be >= 0, got {gkd.sft_alpha}")
    if gkd.seq_kd:
        raise ConfigError("gkd.seq_kd", "sequential KD is not implemented by ms-swift's GKD trainer; set false")

    # models
    for side in ("student", "teacher"):
        _check_model(cfg, side, cfg.run.dry_run)
    for key in ("student_dtype", "teacher_dtype", "torch_dtype"):
        value = getattr(cfg.model, key)
        if value is not None and value not in DTYPE_NAMES:
            raise ConfigError(f"model.{key}", f"must be one of {list(DTYPE_NAMES)} or null, got {value!r}")
    _embedded(cfg)
    v_s, v_t = model_vocab_size(cfg, "student"), model_vocab_size(cfg, "teacher")
    if v_s is not None and v_t is not None and v_s != v_t and not cfg.model.vocab_alignment:
        raise ConfigError(
            "model.teacher",
            f"vocab size {v_t} differs from model.student's {v_s}; set "
            "model.vocab_alignment=true to let ms-swift pad the smaller vocabulary",
        )
    if gkd.topk is not None:
        _at_least("gkd.topk", gkd.topk, 1)
        known = [v for v in (v_s, v_t) if v is not None]
        if known and gkd.topk > min(known):
            raise ConfigError("gkd.topk", f"must be <= the vocabulary size {min(known)}, got {gkd.topk}")

    # backend
    backend = cfg.backend
    if backend.name not in BACKENDS:
        raise ConfigError("backend.name", f"must be one of {list(BACKENDS)}, got {backend.name!r}")
    _at_least("backend.nproc_per_node", backend.nproc_per_node, 1, nullable=True)
    _at_least("backend.nnodes", backend.nnodes, 1, nullable=True)
    if backend.node_rank is not None and not 0 <= backend.node_rank < (backend.nnodes or 1 << 30):
        raise ConfigError("backend.node_rank", f"must be in [0, backend.nnodes), got {backend.node_rank}")
    if backend.master_port is not None and not 0 < backend.master_port < 65536:
        raise ConfigError("backend.master_port", f"must be a TCP port, got {backend.master_port}")
    if isinstance(backend, MegatronBackendConfig):
        for key in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "micro_batch_size",
        ):
            _at_least(f"backend.{key}", getattr(backend, key), 1)
        _at_least("backend.global_batch_size", backend.global_batch_size, 1, nullable=True)
        if (cfg.model.student_dtype or cfg.model.teacher_dtype) and not cfg.model.megatron_boundary_cast:
            key = "model.student_dtype" if cfg.model.student_dtype else "model.teacher_dtype"
            raise ConfigError(
                key,
                "a boundary cast on the Megatron backend measures a configuration Megatron never "
                "produces (its student logits arrive FP32, the teacher's BF16): set "
                "model.student_dtype=null model.teacher_dtype=null, or "
                "model.megatron_boundary_cast=true to cast anyway",
            )

    # run
    run = cfg.run
    for key in ("max_steps", "per_device_batch_size", "grad_accum", "logging_steps", "max_length"):
        _at_least(f"run.{key}", getattr(run, key), 1)
    if not run.learning_rate >= 0:
        raise ConfigError("run.learning_rate", f"must be >= 0, got {run.learning_rate}")
    if not run.output_dir:
        raise ConfigError("run.output_dir", "must be set")
    check_output_dir(run.output_dir)
    if run.device not in DEVICES:
        raise ConfigError("run.device", f"must be one of {list(DEVICES)}, got {run.device!r}")
    _at_least("run.save_steps", run.save_steps, 1, nullable=True)
    check_local_dataset("run.dataset", run.dataset)
    check_local_dataset("monitor.eval.dataset", cfg.monitor.eval.dataset)
    local = re.sub(r"#\d+$", "", run.dataset or "")  # ms-swift's `path#N` (N rows sampled) names `path`
    if run.dataset is not None and is_local_path(local) and not Path(local).expanduser().exists():
        raise ConfigError("run.dataset", f"{run.dataset} does not exist")
    if run.dataset is None and cfg.model.student != EMBEDDED:
        raise ConfigError("run.dataset", "must be set when model.student is not the embedded model")
    validate_extra_args(run.extra_args, megatron=isinstance(cfg.backend, MegatronBackendConfig))

    # monitor
    mon = cfg.monitor
    if mon.spot_check.every_n_steps < 0:
        raise ConfigError("monitor.spot_check.every_n_steps", "must be >= 0 (0 = never)")
    _at_least("monitor.spot_check.max_tokens", mon.spot_check.max_tokens, 1)
    _at_least("monitor.capture_max_tokens", mon.capture_max_tokens, 1)
    for key, on in (("monitor.spot_check.param_grad", mon.spot_check.param_grad), ("monitor.capture", mon.capture)):
        if on and (not mon.enabled or mon.spot_check.every_n_steps == 0):
            raise ConfigError(key, "needs monitor.enabled=true and monitor.spot_check.every_n_steps > 0")

    # tracking
    if cfg.tracking.wandb.mode not in WANDB_MODES:
        raise ConfigError("tracking.wandb.mode", f"must be one of {list(WANDB_MODES)}, got {cfg.tracking.wandb.mode!r}")

    validate_names(cfg)
    validate_rollout(cfg)
    validate_datasets(cfg)  # last: reads the first rows of a local jsonl


__all__ = ["validate_config", "model_vocab_size", "is_local_path", "ConfigError", "EMBEDDED"]
