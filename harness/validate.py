"""Validation of a harness config before any model loads; every error names the offending key.

:func:`validate_config` checks types and ranges of the DESIGN keys (β ∈ [0, 1], T > 0, top-k ≥ 1 and ≤ the
vocabulary, known precision / β form / dtypes / backend, existing model paths, matching vocabularies unless
``model.vocab_alignment`` is set) and delegates the rollout group to ``harness.rollout.validate_rollout``.
It reads only small files (``config.json`` of local models); nothing is loaded.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from harness.losses import BETA_FORMS, DTYPES_BY_NAME, PRECISIONS

EMBEDDED = "embedded"
DTYPES = tuple(DTYPES_BY_NAME)
BACKENDS = ("hf", "megatron")
DEVICES = ("auto", "cpu", "cuda")
_MISSING = object()


class ConfigError(ValueError):
    """An invalid config value; ``key`` is the dotted config key."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


def get(cfg: Any, dotted: str, default: Any = _MISSING) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"`` on a DictConfig or nested dict; ``default`` (or ConfigError) if absent."""
    node = cfg
    for part in dotted.split("."):
        try:
            if node is None or part not in node:
                raise KeyError
            node = node[part]
        except Exception:  # noqa: BLE001 - KeyError, OmegaConf missing value, interpolation errors
            if default is _MISSING:
                raise ConfigError(dotted, "missing") from None
            return default
    return node


def _number(cfg, key, kind=float, default=_MISSING):
    value = get(cfg, key, default)
    if isinstance(value, bool) or value is None:
        raise ConfigError(key, f"must be a number, got {value!r}")
    try:
        out = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"must be a number, got {value!r}") from None
    if kind is int and out != value:
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if kind is float and math.isnan(out):
        raise ConfigError(key, "must not be NaN")
    return out


def _bool(cfg, key, default=_MISSING):
    value = get(cfg, key, default)
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value


def _choice(cfg, key, choices, default=_MISSING):
    value = get(cfg, key, default)
    if value not in choices:
        raise ConfigError(key, f"must be one of {list(choices)}, got {value!r}")
    return value


def is_local_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists()


def model_vocab_size(cfg: Any, key: str) -> Optional[int]:
    """Vocabulary size of ``model.student`` / ``model.teacher`` without loading it (None if unknown)."""
    value = get(cfg, key)
    if value == EMBEDDED:
        from harness.embedded import EmbeddedSpec

        return EmbeddedSpec.from_mapping(get(cfg, "model.embedded", None)).vocab_size
    path = Path(str(value)).expanduser()
    conf = path / "config.json"
    if conf.is_file():
        data = json.loads(conf.read_text())
        vocab = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
        return int(vocab) if vocab else None
    return None


def _check_model(cfg: Any, key: str) -> None:
    value = get(cfg, key)
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"must be '{EMBEDDED}', a local model folder or a hub id, got {value!r}")
    if value == EMBEDDED:
        return
    if is_local_path(value):
        path = Path(value).expanduser()
        if not path.is_dir():
            raise ConfigError(key, f"model folder {value} does not exist")
        if not (path / "config.json").is_file():
            raise ConfigError(key, f"{value} has no config.json (not a model folder)")


def validate_config(cfg: Any) -> None:
    """Raise :class:`ConfigError` (a ValueError naming the key) for the first invalid value in ``cfg``."""
    _choice(cfg, "loss.precision", PRECISIONS)
    _choice(cfg, "loss.beta_form", BETA_FORMS)

    beta = _number(cfg, "gkd.beta")
    if not 0.0 <= beta <= 1.0:
        raise ConfigError("gkd.beta", f"must lie in [0, 1], got {beta}")
    temperature = _number(cfg, "gkd.temperature")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ConfigError("gkd.temperature", f"must be > 0, got {temperature}")
    sft_alpha = _number(cfg, "gkd.sft_alpha", default=0.0)
    if sft_alpha < 0 or not math.isfinite(sft_alpha):
        raise ConfigError("gkd.sft_alpha", f"must be >= 0, got {sft_alpha}")
    if _bool(cfg, "gkd.seq_kd", default=False):
        raise ConfigError("gkd.seq_kd", "sequential KD is not implemented by ms-swift's GKD trainer; set false")

    # models
    for key in ("model.student", "model.teacher"):
        _check_model(cfg, key)
    for key in ("model.student_dtype", "model.teacher_dtype"):
        value = get(cfg, key, None)
        if value is not None and value not in DTYPES:
            raise ConfigError(key, f"must be one of {list(DTYPES)} or null, got {value!r}")
    torch_dtype = get(cfg, "model.torch_dtype", None)
    if torch_dtype is not None and torch_dtype not in DTYPES:
        raise ConfigError("model.torch_dtype", f"must be one of {list(DTYPES)} or null, got {torch_dtype!r}")
    if EMBEDDED in (get(cfg, "model.student"), get(cfg, "model.teacher")):
        from harness.embedded import EmbeddedSpec

        try:
            spec = EmbeddedSpec.from_mapping(get(cfg, "model.embedded", None))
        except TypeError as e:
            raise ConfigError("model.embedded", str(e)) from None
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "num_samples"):
            if not isinstance(getattr(spec, name), int) or getattr(spec, name) < 1:
                raise ConfigError(f"model.embedded.{name}", f"must be an integer >= 1, got {getattr(spec, name)!r}")
        if spec.vocab_size < 300:
            raise ConfigError("model.embedded.vocab_size", "must be >= 300 (256 bytes + chat tokens + merges)")
        if spec.num_heads % spec.num_kv_heads:
            raise ConfigError("model.embedded.num_kv_heads", "must divide model.embedded.num_heads")
        if not spec.teacher_noise >= 0:
            raise ConfigError("model.embedded.teacher_noise", f"must be >= 0, got {spec.teacher_noise}")
        if not spec.init_std > 0:
            raise ConfigError("model.embedded.init_std", f"must be > 0, got {spec.init_std}")

    v_s, v_t = model_vocab_size(cfg, "model.student"), model_vocab_size(cfg, "model.teacher")
    if v_s is not None and v_t is not None and v_s != v_t and not get(cfg, "model.vocab_alignment", False):
        raise ConfigError("model.teacher", f"vocab size {v_t} differs from model.student's {v_s}; set "
                          "model.vocab_alignment=true to let ms-swift pad the smaller vocabulary")

    topk = get(cfg, "gkd.topk", None)
    if topk is not None:
        topk = _number(cfg, "gkd.topk", int)
        if topk < 1:
            raise ConfigError("gkd.topk", f"must be >= 1 or null (full vocabulary), got {topk}")
        vocab = min(v for v in (v_s, v_t) if v is not None) if (v_s or v_t) else None
        if vocab is not None and topk > vocab:
            raise ConfigError("gkd.topk", f"must be <= the vocabulary size {vocab}, got {topk}")

    # backend
    backend = _choice(cfg, "backend.name", BACKENDS)
    nproc = get(cfg, "backend.nproc_per_node", None)
    if nproc is not None and _number(cfg, "backend.nproc_per_node", int) < 1:
        raise ConfigError("backend.nproc_per_node", f"must be >= 1 or null, got {nproc}")
    if backend == "megatron":
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                    "micro_batch_size"):
            if _number(cfg, f"backend.{key}", int, default=1) < 1:
                raise ConfigError(f"backend.{key}", "must be >= 1")

    # run
    for key in ("run.max_steps", "run.per_device_batch_size", "run.grad_accum", "run.logging_steps"):
        if _number(cfg, key, int, default=1) < 1:
            raise ConfigError(key, f"must be an integer >= 1, got {get(cfg, key)}")
    _number(cfg, "run.seed", int)
    lr = _number(cfg, "run.learning_rate", default=1e-4)
    if not lr >= 0:
        raise ConfigError("run.learning_rate", f"must be >= 0, got {lr}")
    if not str(get(cfg, "run.output_dir", "") or ""):
        raise ConfigError("run.output_dir", "must be set")
    _choice(cfg, "run.device", DEVICES, default="auto")
    save_steps = get(cfg, "run.save_steps", None)
    if save_steps is not None and _number(cfg, "run.save_steps", int) < 1:
        raise ConfigError("run.save_steps", f"must be null or an integer >= 1, got {save_steps}")
    _bool(cfg, "run.resume", default=False)
    dataset = get(cfg, "run.dataset", None)
    if dataset is not None and is_local_path(str(dataset)) and not Path(str(dataset)).expanduser().exists():
        raise ConfigError("run.dataset", f"{dataset} does not exist")
    if dataset is None and get(cfg, "model.student") != EMBEDDED:
        raise ConfigError("run.dataset", "must be set when model.student is not the embedded model")

    # monitor
    enabled = _bool(cfg, "monitor.enabled", default=True)
    every = _number(cfg, "monitor.spot_check.every_n_steps", int, default=0)
    if every < 0:
        raise ConfigError("monitor.spot_check.every_n_steps", "must be >= 0 (0 = never)")
    if _number(cfg, "monitor.spot_check.max_tokens", int, default=256) < 1:
        raise ConfigError("monitor.spot_check.max_tokens", "must be >= 1")
    # param-grad checks and captures happen on spot-check steps of the instrumented loss
    for key in ("monitor.spot_check.param_grad", "monitor.capture"):
        if _bool(cfg, key, default=False) and (not enabled or every == 0):
            raise ConfigError(key, "needs monitor.enabled=true and monitor.spot_check.every_n_steps > 0")

    # tracking
    from harness.tracking import WANDB_MODES

    _choice(cfg, "tracking.wandb.mode", WANDB_MODES)
    tags = get(cfg, "tracking.wandb.tags", [])
    if tags is not None and (isinstance(tags, (str, bytes)) or not hasattr(tags, "__iter__")):
        raise ConfigError("tracking.wandb.tags", f"must be a list, got {tags!r}")

    # rollout (vLLM helper's module; raises ValueError naming the key)
    from harness.rollout import validate_rollout

    validate_rollout(cfg)


def validated(cfg: Any) -> Any:
    """``validate_config(cfg)`` and return ``cfg`` (for chaining)."""
    validate_config(cfg)
    return cfg


__all__ = ["ConfigError", "validate_config", "validated", "get", "model_vocab_size", "EMBEDDED"]

