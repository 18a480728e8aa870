"""Typed harness config -> ms-swift command lines.

* :func:`hf_argv`: ``swift rlhf --rlhf_type gkd ...`` (HF backend, optional DeepSpeed; on CPU ``--use_cpu true``
  so that multi-process DDP really uses gloo across ranks).
* :func:`megatron_argv`: ``megatron rlhf --rlhf_type gkd ...`` (TP/PP/CP, sequence parallel, colocated rollout).
* :func:`build_argv`: dispatch on ``backend.name``.

Both load ``harness/rank/plugin.py`` through ``--external_plugins`` and enable its callback with
``--callbacks gkd_harness``. The process layout (how many data-parallel ranks there are) comes from
``gkd_harness.harness.launcher.node.NodeLayout``, the same object that sets the torchrun variables: ``gkd_harness.harness.launcher.plan`` is the
only caller.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from gkd_harness.harness.config.schema import ConfigError, HFBackendConfig, MegatronBackendConfig, TrainConfig
from gkd_harness.harness.contract import CALLBACK_NAME, PLUGIN_MODULE, SWIFT_DIR
from gkd_harness.harness.launcher.argv_format import cli_value as _fmt
from gkd_harness.harness.launcher.node import NodeLayout
from gkd_harness.harness.launcher.rollout_argv import rollout_args
from gkd_harness.harness.launcher.swift_version import version_args


#: The plugin file ms-swift loads in every rank (found, not imported: gkd-train never imports the rank side).
def _plugin_path() -> str:
    spec = importlib.util.find_spec(PLUGIN_MODULE)
    if spec is None or spec.origin is None:
        raise ImportError(f"{PLUGIN_MODULE}: not found (is gkd-harness installed?)")
    return spec.origin


PLUGIN_PATH = _plugin_path()


def _hf_backend(cfg: TrainConfig) -> HFBackendConfig:
    """``cfg.backend`` as the HF backend's settings (the schema builds the class that ``backend.name`` names)."""
    if not isinstance(cfg.backend, HFBackendConfig):
        raise ConfigError("backend.name", f"{cfg.backend.name!r} is not the hf backend")
    return cfg.backend


def _megatron_backend(cfg: TrainConfig) -> MegatronBackendConfig:
    """``cfg.backend`` as the Megatron backend's settings."""
    if not isinstance(cfg.backend, MegatronBackendConfig):
        raise ConfigError("backend.name", f"{cfg.backend.name!r} is not the megatron backend")
    return cfg.backend


@dataclass(frozen=True)
class ResolvedInputs:
    """Concrete model / data locations for one run (embedded assets already built, or named as configured)."""

    student: str
    teacher: str
    dataset: str
    val_dataset: Optional[str] = None  # the held-out split of monitor.eval (None: no evaluation)


def _shared_args(cfg: TrainConfig, inputs: ResolvedInputs) -> List[str]:
    """What ``swift rlhf`` and ``megatron rlhf`` both get first: GKD, the models, the dataset (no split: the held-out
    evaluation brings its own file), full fine-tuning."""
    return [
        "--rlhf_type",
        "gkd",
        *_model_args(cfg, inputs),
        "--check_model",
        "false",
        "--use_hf",
        "true",
        "--dataset",
        inputs.dataset,
        "--split_dataset_ratio",
        "0",
        "--tuner_type",
        "full",
    ]


def _gkd_args(cfg: TrainConfig) -> List[str]:
    gkd = cfg.gkd
    args = ["--beta", _fmt(gkd.beta), "--temperature", _fmt(gkd.temperature), "--sft_alpha", _fmt(gkd.sft_alpha)]
    if gkd.topk is not None:
        args += ["--gkd_logits_topk", str(gkd.topk)]
    return args


def _model_args(cfg: TrainConfig, inputs: ResolvedInputs) -> List[str]:
    model = cfg.model
    args = ["--model", inputs.student, "--teacher_model", inputs.teacher]
    if model.model_type:
        args += ["--model_type", model.model_type, "--teacher_model_type", model.teacher_model_type or model.model_type]
    if model.template:
        args += ["--template", model.template]
    if model.torch_dtype:
        args += ["--torch_dtype", model.torch_dtype]
    return args


def _save_args(cfg: TrainConfig) -> List[str]:
    """``run.save_steps`` null: no checkpoints; N: a full checkpoint (with optimizer state) every N steps."""
    if not cfg.run.save_steps:
        return ["--save_strategy", "no"]
    return ["--save_strategy", "steps", "--save_steps", str(cfg.run.save_steps), "--save_only_model", "false"]


def _megatron_save_args(cfg: TrainConfig) -> List[str]:
    """ms-swift's Megatron checkpoints (``checkpoint-<N>`` under ``<run>/swift``; ms-swift saves one every
    ``--save_steps`` and always one at the last step, ``megatron/callbacks/default_flow.py``).

    ``run.save_steps`` N: every N steps, with the optimizer and RNG state, so ``run.resume=true`` (a requeue)
    continues from the newest (``gkd_harness.harness.launcher.resume``: ``--mcore_model DIR --finetune false``). Null: weights
    only (``--no_save_optim true``), at the last step; with ``run.resume=true`` the optimizer is kept too, so a run
    cut short after that save can still continue.
    """
    if cfg.run.save_steps:
        return ["--save_steps", str(cfg.run.save_steps)]
    return [] if cfg.run.resume else ["--no_save_optim", "true"]


def _eval_args(cfg: TrainConfig, inputs: ResolvedInputs, megatron: bool = False) -> List[str]:
    """ms-swift's own evaluation on the held-out split every ``monitor.eval.every_n_steps`` steps (the plugin adds
    the ``eval/*`` metrics and the final evaluation, gkd_harness.harness.rank.evaluation); nothing when it is off."""
    every = cfg.monitor.eval.every_n_steps
    if not every or not inputs.val_dataset:
        return []
    if megatron:
        return ["--val_dataset", inputs.val_dataset, "--eval_steps", str(every)]
    return [
        "--val_dataset",
        inputs.val_dataset,
        "--eval_strategy",
        "steps",
        "--eval_steps",
        str(every),
        "--per_device_eval_batch_size",
        str(cfg.monitor.eval.batch_size),
    ]


def _report_to(wandb_mode: str) -> str:
    return "none" if wandb_mode == "disabled" else "wandb"


def _common_tail(cfg: TrainConfig, wandb_mode: str) -> List[str]:
    return [
        *_gkd_args(cfg),
        *rollout_args(cfg),
        "--external_plugins",
        PLUGIN_PATH,
        "--callbacks",
        CALLBACK_NAME,
        "--report_to",
        _report_to(wandb_mode),
    ]


def hf_argv(
    cfg: TrainConfig,
    inputs: ResolvedInputs,
    run_dir: str | Path,
    device: str,
    wandb_mode: str,
    run_name: Optional[str] = None,
    swift_version: Optional[str] = None,
) -> List[str]:
    """``swift rlhf --rlhf_type gkd`` argv for the HF backend.

    Args:
        cfg: validated typed config (``cfg.backend`` is an :class:`HFBackendConfig`).
        inputs: resolved student / teacher / dataset locations.
        run_dir: the run folder; ms-swift's own output goes to ``run_dir/swift``.
        device: ``cpu`` adds ``--use_cpu true`` (gloo DDP across ranks; without it every rank trains alone).
        wandb_mode: the mode after the online->offline fallback (``disabled`` -> ``--report_to none``).
        swift_version: the ms-swift version the argv is for (None: the installed one; ``version_args``).
    """
    backend = _hf_backend(cfg)
    run = cfg.run
    argv = [
        "swift",
        "rlhf",
        *_shared_args(cfg, inputs),
        "--max_steps",
        str(run.max_steps),
        "--per_device_train_batch_size",
        str(run.per_device_batch_size),
        "--gradient_accumulation_steps",
        str(run.grad_accum),
        "--learning_rate",
        _fmt(run.learning_rate),
        "--max_length",
        str(run.max_length),
        "--logging_steps",
        str(run.logging_steps),
        # NaN/Inf losses are logged as themselves (transformers' default filter logs a NaN step as 0.0)
        "--logging_nan_inf_filter",
        "false",
        *_save_args(cfg),
        "--output_dir",
        str(Path(run_dir) / SWIFT_DIR),
        "--add_version",
        "false",
        "--seed",
        str(run.seed),
        "--data_seed",
        str(run.seed),
        # no dataloader workers, and no persistent ones (4.5.x keeps them on: gkd_harness.harness.launcher.swift_version)
        *version_args(swift_version, megatron=False),
        *_eval_args(cfg, inputs),
        *_common_tail(cfg, wandb_mode),
    ]
    if run_name:
        argv += ["--run_name", run_name]
    if device == "cpu":
        argv += ["--use_cpu", "true"]
    if backend.deepspeed:
        argv += ["--deepspeed", backend.deepspeed]
    argv += ["--gradient_checkpointing", _fmt(backend.gradient_checkpointing)]
    return argv + list(run.extra_args)


def megatron_batch_sizes(
    backend: MegatronBackendConfig, layout: NodeLayout, grad_accum: int, on_policy: bool = False
) -> tuple[int, int]:
    """(data-parallel size, global batch size) of a Megatron job.

    The data-parallel size is all processes on all nodes over TP × PP × CP. ``backend.global_batch_size`` null
    means ``micro_batch_size × data-parallel size × run.grad_accum``, and, when ``on_policy`` (``gkd.lmbda`` > 0:
    ms-swift splits each data-parallel rank's rollout batch over its TP × PP × CP group, rollout_mixin.py
    ``_get_local_rollout_batch``), times the smallest factor that makes each data-parallel rank's batch a
    multiple of TP × PP × CP. The layout's own checks: :func:`check_megatron_layout`.
    """
    model_parallel = _model_parallel(backend)
    dp = max(1, layout.world_size // model_parallel)
    gbs = backend.global_batch_size
    if gbs is None:
        per_rank = backend.micro_batch_size * grad_accum
        if on_policy:
            per_rank *= model_parallel // math.gcd(per_rank, model_parallel)
        gbs = per_rank * dp
    return dp, gbs


def _model_parallel(backend: MegatronBackendConfig) -> int:
    return backend.tensor_model_parallel_size * backend.pipeline_model_parallel_size * backend.context_parallel_size


_MP_KEYS = "backend.tensor_model_parallel_size x backend.pipeline_model_parallel_size x backend.context_parallel_size"


def check_megatron_layout(cfg: TrainConfig, layout: NodeLayout) -> tuple[int, int]:
    """ms-swift 4.6.0's own constraints on a Megatron layout, checked before launch (its batch check in
    ``MegatronArguments._init_distributed`` runs only after ``torch.distributed`` starts, and the rollout split's
    assert only at the first on-policy step). Returns (data-parallel size, global batch size).

    - the processes (``backend.nproc_per_node`` x ``backend.nnodes``) divide by TP x PP x CP;
    - the global batch divides by micro batch x data-parallel size (one micro-batch at least);
    - on-policy (``gkd.lmbda`` > 0): each data-parallel rank's batch (global / DP) divides by TP x PP x CP;
    - ``monitor.spot_check.param_grad=true`` with ``--gradient_accumulation_fusion true`` in ``run.extra_args`` is
      refused: megatron-core's fused weight-gradient kernels (apex / Transformer Engine) write ``main_grad`` in the
      backward, so the check's backward would add to training's gradients (without the flag gkd-train passes
      ``--gradient_accumulation_fusion false`` with the check on: ms-swift turns fusion on wherever apex imports);
    - ``monitor.spot_check.param_grad=true`` with ``backend.recompute_granularity`` full / selective is refused:
      megatron-core's activation checkpointing raises under the check's ``torch.autograd.grad`` (null passes
      ``--recompute_granularity none`` then, :func:`megatron_argv`).

    Raises:
        ConfigError: naming the keys of the impossible layout.
    """
    backend = _megatron_backend(cfg)
    if _param_grad_on(cfg) and _flag_true(cfg.run.extra_args, FUSION_FLAG):
        raise ConfigError(
            "monitor.spot_check.param_grad",
            f"true cannot be combined with {FUSION_FLAG} true in run.extra_args on backend=megatron: "
            "with ms-swift's gradient accumulation fusion the backward writes main_grad itself, so the "
            "check's extra backward would reach the optimizer's gradients; drop that flag (gkd-train "
            f"passes {FUSION_FLAG} false with the check on) or turn the check off",
        )
    if _param_grad_on(cfg) and backend.recompute_granularity not in (None, "none"):
        raise ConfigError(
            "backend.recompute_granularity",
            f"{backend.recompute_granularity} cannot be combined with monitor.spot_check.param_grad=true "
            "on backend=megatron: megatron-core's activation checkpointing does not support the "
            "check's torch.autograd.grad; use none (or null), or turn the check off",
        )
    mp, world = _model_parallel(backend), layout.world_size
    if world % mp:
        raise ConfigError(
            "backend.tensor_model_parallel_size",
            f"{_MP_KEYS} = {mp} does not divide the {world} processes (backend.nproc_per_node x "
            "backend.nnodes); ms-swift needs world size = data-parallel x TP x PP x CP",
        )
    on_policy = cfg.gkd.lmbda > 0
    dp, gbs = megatron_batch_sizes(backend, layout, cfg.run.grad_accum, on_policy=on_policy)
    micro = backend.micro_batch_size
    if gbs < micro * dp or gbs % (micro * dp):
        raise ConfigError(
            "backend.global_batch_size",
            f"{gbs} is not a positive multiple of backend.micro_batch_size {micro} x data-parallel "
            f"size {dp} ({world} processes over {_MP_KEYS} = {mp})",
        )
    if on_policy and (gbs // dp) % mp:
        raise ConfigError(
            "backend.global_batch_size",
            f"{gbs} over data-parallel size {dp} gives {gbs // dp} samples per rollout group, which "
            f"ms-swift splits over {_MP_KEYS} = {mp} ranks (gkd.lmbda={cfg.gkd.lmbda} > 0): use a "
            f"multiple of {dp * mp}, or null for the default",
        )
    return dp, gbs


#: ms-swift's Megatron flag under which the backward writes ``main_grad`` itself (fused weight-gradient accumulation)
FUSION_FLAG = "--gradient_accumulation_fusion"


def _flag_true(extra_args, flag: str) -> bool:
    """``flag`` set to a true value in ``extra_args`` (``--flag true``, ``--flag=true``, or ``--flag`` alone)."""
    args = list(extra_args)
    for i, a in enumerate(args):
        if a == flag:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            return nxt.startswith("--") or nxt.lower() not in ("false", "0", "no")
        if a.startswith(flag + "="):
            return a.split("=", 1)[1].lower() not in ("false", "0", "no")
    return False


def _param_grad_on(cfg: TrainConfig) -> bool:
    """``monitor.spot_check.param_grad`` in effect (monitoring on, spot checks on)."""
    mon = cfg.monitor
    return bool(mon.enabled and mon.spot_check.every_n_steps and mon.spot_check.param_grad)


def megatron_batch_note(cfg: TrainConfig, layout: NodeLayout) -> str:
    """The plan's line on the global batch (after :func:`check_megatron_layout`)."""
    backend = _megatron_backend(cfg)
    dp, gbs = megatron_batch_sizes(backend, layout, cfg.run.grad_accum, on_policy=cfg.gkd.lmbda > 0)
    if backend.global_batch_size is not None:
        return f"global batch {gbs} (backend.global_batch_size)"
    base = backend.micro_batch_size * dp * cfg.run.grad_accum
    note = (
        f"global batch {gbs} = micro batch {backend.micro_batch_size} x data-parallel {dp} x "
        f"grad accum {cfg.run.grad_accum}"
    )
    if gbs != base:
        note += f" x {gbs // base} (each data-parallel rank's rollout batch a multiple of TP x PP x CP)"
    return note


def megatron_argv(
    cfg: TrainConfig,
    inputs: ResolvedInputs,
    run_dir: str | Path,
    layout: NodeLayout,
    wandb_mode: str,
    run_name: Optional[str] = None,
    swift_version: Optional[str] = None,
) -> List[str]:
    """``megatron rlhf --rlhf_type gkd`` argv (Megatron backend: TP/PP/CP, colocated rollout)."""
    backend = _megatron_backend(cfg)
    run = cfg.run
    _, gbs = check_megatron_layout(cfg, layout)
    argv = [
        "megatron",
        "rlhf",
        *_shared_args(cfg, inputs),
        "--tensor_model_parallel_size",
        str(backend.tensor_model_parallel_size),
        "--pipeline_model_parallel_size",
        str(backend.pipeline_model_parallel_size),
        "--context_parallel_size",
        str(backend.context_parallel_size),
        "--sequence_parallel",
        _fmt(backend.sequence_parallel),
        "--micro_batch_size",
        str(backend.micro_batch_size),
        "--global_batch_size",
        str(gbs),
        "--train_iters",
        str(run.max_steps),
        "--lr",
        _fmt(run.learning_rate),
        "--max_length",
        str(run.max_length),
        "--logging_steps",
        str(run.logging_steps),
        "--output_dir",
        str(Path(run_dir) / SWIFT_DIR),
        "--add_version",
        "false",
        *_megatron_save_args(cfg),
        "--seed",
        str(run.seed),
        "--bf16",
        _fmt(backend.bf16),
        *version_args(swift_version, megatron=True),
        *_eval_args(cfg, inputs, megatron=True),
        *_common_tail(cfg, wandb_mode),
    ]
    if _report_to(wandb_mode) == "wandb":
        argv += ["--wandb_project", cfg.tracking.wandb.project]
        if run_name:
            argv += ["--wandb_exp_name", run_name]
    if backend.recompute_granularity:
        argv += ["--recompute_granularity", backend.recompute_granularity]
    elif _param_grad_on(cfg):  # ms-swift's default (selective) would stop the parameter-gradient spot check
        argv += ["--recompute_granularity", "none"]
    if _param_grad_on(cfg):  # ms-swift turns fusion on where apex imports: the check's backward would write main_grad
        argv += [FUSION_FLAG, "false"]
    return argv + list(run.extra_args)


def build_argv(
    cfg: TrainConfig,
    inputs: ResolvedInputs,
    run_dir: str | Path,
    layout: NodeLayout,
    device: str,
    wandb_mode: str,
    run_name: Optional[str] = None,
    swift_version: Optional[str] = None,
) -> List[str]:
    """The ms-swift command line for ``backend.name`` (for ``swift_version``, the installed one when None)."""
    if isinstance(cfg.backend, MegatronBackendConfig):
        return megatron_argv(
            cfg, inputs, run_dir, layout, wandb_mode=wandb_mode, run_name=run_name, swift_version=swift_version
        )
    return hf_argv(
        cfg, inputs, run_dir, device=device, wandb_mode=wandb_mode, run_name=run_name, swift_version=swift_version
    )


__all__ = [
    "PLUGIN_PATH",
    "CALLBACK_NAME",
    "ResolvedInputs",
    "hf_argv",
    "megatron_argv",
    "megatron_batch_sizes",
    "check_megatron_layout",
    "megatron_batch_note",
    "build_argv",
]
