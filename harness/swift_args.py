"""Harness config -> ms-swift command lines.

* :func:`hf_argv`: ``swift rlhf --rlhf_type gkd ...`` (HF backend, optional DeepSpeed; on CPU ``--use_cpu true``
  so that multi-process DDP really uses gloo across ranks).
* :func:`megatron_argv`: ``megatron rlhf --rlhf_type gkd ...`` (TP/PP/CP, sequence parallel, colocated rollout).
* :func:`build_argv`: dispatch on ``backend.name``.

Both load ``harness/plugin.py`` through ``--external_plugins`` and enable its callback with
``--callbacks gkd_harness``. Rollout arguments (``--use_vllm``, ``--lmbda``, ``--vllm_*``) come from
``harness.rollout.rollout_args``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from harness.validate import get

PLUGIN_PATH = str(Path(__file__).with_name("plugin.py"))
CALLBACK_NAME = "gkd_harness"


@dataclass(frozen=True)
class ResolvedInputs:
    """Concrete model / data locations for one run (embedded assets already built)."""

    student: str
    teacher: str
    dataset: str


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _gkd_args(cfg: Any) -> List[str]:
    args = ["--beta", _fmt(float(get(cfg, "gkd.beta"))), "--temperature", _fmt(float(get(cfg, "gkd.temperature"))),
            "--sft_alpha", _fmt(float(get(cfg, "gkd.sft_alpha", 0.0)))]
    topk = get(cfg, "gkd.topk", None)
    if topk is not None:
        args += ["--gkd_logits_topk", str(int(topk))]
    return args


def _rollout_args(cfg: Any) -> List[str]:
    from harness.rollout import rollout_args

    args = list(rollout_args(cfg))
    if "--lmbda" not in args:
        args += ["--lmbda", _fmt(float(get(cfg, "gkd.lmbda", 0.0)))]
    return args


def _model_args(cfg: Any, inputs: ResolvedInputs) -> List[str]:
    args = ["--model", inputs.student, "--teacher_model", inputs.teacher]
    model_type = get(cfg, "model.model_type", None)
    if model_type:
        args += ["--model_type", str(model_type),
                 "--teacher_model_type", str(get(cfg, "model.teacher_model_type", None) or model_type)]
    template = get(cfg, "model.template", None)
    if template:
        args += ["--template", str(template)]
    torch_dtype = get(cfg, "model.torch_dtype", None)
    if torch_dtype:
        args += ["--torch_dtype", str(torch_dtype)]
    return args


def _save_args(cfg: Any) -> List[str]:
    """``run.save_steps`` null: no checkpoints; N: a full checkpoint (with optimizer state) every N steps."""
    save_steps = get(cfg, "run.save_steps", None)
    if not save_steps:
        return ["--save_strategy", "no"]
    return ["--save_strategy", "steps", "--save_steps", str(int(save_steps)), "--save_only_model", "false"]


def _report_to(cfg: Any, wandb_mode: Optional[str]) -> str:
    mode = wandb_mode or get(cfg, "tracking.wandb.mode", "disabled")
    return "none" if mode == "disabled" else "wandb"


def hf_argv(cfg: Any, inputs: ResolvedInputs, run_dir: str | Path, device: str = "cpu",
            wandb_mode: Optional[str] = None, run_name: Optional[str] = None) -> List[str]:
    """``swift rlhf --rlhf_type gkd`` argv for the HF backend.

    Args:
        cfg: validated harness config.
        inputs: resolved student / teacher / dataset locations.
        run_dir: the run folder; ms-swift's own output goes to ``run_dir/swift``.
        device: ``cpu`` adds ``--use_cpu true`` (gloo DDP across ranks; without it every rank trains alone).
        wandb_mode: the mode after the online->offline fallback (``disabled`` -> ``--report_to none``).
    """
    seed = int(get(cfg, "run.seed"))
    argv = ["swift", "rlhf", "--rlhf_type", "gkd", *_model_args(cfg, inputs),
            "--check_model", "false", "--use_hf", "true",
            "--dataset", inputs.dataset, "--split_dataset_ratio", "0",
            "--tuner_type", "full",
            "--max_steps", str(int(get(cfg, "run.max_steps"))),
            "--per_device_train_batch_size", str(int(get(cfg, "run.per_device_batch_size", 1))),
            "--gradient_accumulation_steps", str(int(get(cfg, "run.grad_accum", 1))),
            "--learning_rate", _fmt(float(get(cfg, "run.learning_rate", 1e-4))),
            "--max_length", str(int(get(cfg, "run.max_length", 512))),
            "--logging_steps", str(int(get(cfg, "run.logging_steps", 1))),
            *_save_args(cfg),
            "--output_dir", str(Path(run_dir) / "swift"), "--add_version", "false",
            "--seed", str(seed), "--data_seed", str(seed),
            "--dataloader_num_workers", "0",
            *_gkd_args(cfg), *_rollout_args(cfg),
            "--external_plugins", PLUGIN_PATH, "--callbacks", CALLBACK_NAME,
            "--report_to", _report_to(cfg, wandb_mode)]
    if run_name:
        argv += ["--run_name", str(run_name)]
    if device == "cpu":
        argv += ["--use_cpu", "true"]
    deepspeed = get(cfg, "backend.deepspeed", None)
    if deepspeed:
        argv += ["--deepspeed", str(deepspeed)]
    if get(cfg, "backend.gradient_checkpointing", False):
        argv += ["--gradient_checkpointing", "true"]
    else:
        argv += ["--gradient_checkpointing", "false"]
    argv += [str(a) for a in (get(cfg, "run.extra_args", None) or [])]
    return argv


def megatron_argv(cfg: Any, inputs: ResolvedInputs, run_dir: str | Path, wandb_mode: Optional[str] = None,
                  data_parallel_size: Optional[int] = None, run_name: Optional[str] = None) -> List[str]:
    """``megatron rlhf --rlhf_type gkd`` argv (Megatron backend: TP/PP/CP, colocated rollout).

    ``global_batch_size`` defaults to ``micro_batch_size * data_parallel_size * run.grad_accum`` where the
    data-parallel size is ``nproc_per_node * nnodes / (TP * PP * CP)`` (``data_parallel_size`` overrides it).
    """
    tp = int(get(cfg, "backend.tensor_model_parallel_size", 1))
    pp = int(get(cfg, "backend.pipeline_model_parallel_size", 1))
    cp = int(get(cfg, "backend.context_parallel_size", 1))
    mbs = int(get(cfg, "backend.micro_batch_size", 1))
    gbs = get(cfg, "backend.global_batch_size", None)
    if gbs is None:
        if data_parallel_size is None:
            world = int(get(cfg, "backend.nproc_per_node", None) or 1) * int(get(cfg, "backend.nnodes", None) or 1)
            data_parallel_size = max(1, world // (tp * pp * cp))
        gbs = mbs * data_parallel_size * int(get(cfg, "run.grad_accum", 1))
    seed = int(get(cfg, "run.seed"))
    argv = ["megatron", "rlhf", "--rlhf_type", "gkd", *_model_args(cfg, inputs),
            "--check_model", "false", "--use_hf", "true",
            "--dataset", inputs.dataset, "--split_dataset_ratio", "0",
            "--tuner_type", "full",
            "--tensor_model_parallel_size", str(tp), "--pipeline_model_parallel_size", str(pp),
            "--context_parallel_size", str(cp),
            "--sequence_parallel", _fmt(bool(get(cfg, "backend.sequence_parallel", False))),
            "--micro_batch_size", str(mbs), "--global_batch_size", str(int(gbs)),
            "--train_iters", str(int(get(cfg, "run.max_steps"))),
            "--lr", _fmt(float(get(cfg, "run.learning_rate", 1e-4))),
            "--max_length", str(int(get(cfg, "run.max_length", 512))),
            "--logging_steps", str(int(get(cfg, "run.logging_steps", 1))),
            "--output_dir", str(Path(run_dir) / "swift"), "--add_version", "false", "--no_save_optim", "true",
            "--seed", str(seed),
            "--bf16", _fmt(bool(get(cfg, "backend.bf16", True))),
            *_gkd_args(cfg), *_rollout_args(cfg),
            "--external_plugins", PLUGIN_PATH, "--callbacks", CALLBACK_NAME,
            "--report_to", _report_to(cfg, wandb_mode)]
    if _report_to(cfg, wandb_mode) == "wandb":
        project = get(cfg, "tracking.wandb.project", None)
        if project:
            argv += ["--wandb_project", str(project)]
        if run_name:
            argv += ["--wandb_exp_name", str(run_name)]
    granularity = get(cfg, "backend.recompute_granularity", None)
    if granularity:
        argv += ["--recompute_granularity", str(granularity)]
    argv += [str(a) for a in (get(cfg, "run.extra_args", None) or [])]
    return argv


def build_argv(cfg: Any, inputs: ResolvedInputs, run_dir: str | Path, device: str = "cpu",
               wandb_mode: Optional[str] = None, run_name: Optional[str] = None) -> List[str]:
    """The ms-swift command line for ``backend.name``."""
    if get(cfg, "backend.name") == "megatron":
        return megatron_argv(cfg, inputs, run_dir, wandb_mode=wandb_mode, run_name=run_name)
    return hf_argv(cfg, inputs, run_dir, device=device, wandb_mode=wandb_mode, run_name=run_name)
