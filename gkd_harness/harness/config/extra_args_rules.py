"""``run.extra_args``: raw ms-swift flags appended to the command, with the rules that keep them safe (torch-free;
called from :func:`gkd_harness.harness.config.validate.validate_config`).

* the list is ``--flag [value ...]`` groups (``--flag=value`` too);
* a flag the harness sets itself is refused, naming the config key to use instead (``--beta`` -> ``gkd.beta``),
  because the later copy would win in ms-swift while wandb and the report record the config's value;
* a flag or value that looks like a credential (``--hub_token hf_...``) is refused, as credential config keys are:
  it would reach swift.log, config.yaml and the wandb files;
* a flag that routes the GKD loss past ms-swift's ``gkd_loss`` / ``jsd_loss`` (:data:`LOSS_BYPASS`:
  ``--use_liger_kernel``, ``--use_ray``) is refused, unless its value is false: the harness would neither patch
  nor see the loss that trains;
* no control characters.

Whether ms-swift knows the flag and accepts its value is checked against the table of ms-swift's own argument
classes (:mod:`gkd_harness.harness.config.swift_flags`): here where the table is cached (``launch/setup_env.sh`` builds it),
and in the dry run and before every launch, which build it when missing (:mod:`gkd_harness.harness.launcher.extra_args`).
This module must not import ms-swift.
"""

from __future__ import annotations

import re
from typing import Dict, List, Sequence, Tuple

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.secrets import is_secret_key, looks_like_credential
from gkd_harness.harness.config.swift_flags import load_table, refusal

KEY = "run.extra_args"

#: ms-swift flags that ``gkd_harness.harness.launcher.swift_argv`` / ``rollout_argv`` set, and the config key that sets each
#: (``None``: the harness owns it outright).
HARNESS_FLAGS: Dict[str, str | None] = {
    "beta": "gkd.beta",
    "temperature": "gkd.temperature",
    "sft_alpha": "gkd.sft_alpha",
    "gkd_logits_topk": "gkd.topk",
    "lmbda": "gkd.lmbda",
    "seq_kd": "gkd.seq_kd",
    "model": "model.student",
    "teacher_model": "model.teacher",
    "model_type": "model.model_type",
    "teacher_model_type": "model.teacher_model_type",
    "template": "model.template",
    "torch_dtype": "model.torch_dtype",
    "dataset": "run.dataset",
    "val_dataset": "monitor.eval.dataset",
    "eval_steps": "monitor.eval.every_n_steps",
    "eval_strategy": "monitor.eval.every_n_steps",
    "per_device_eval_batch_size": "monitor.eval.batch_size",
    "max_steps": "run.max_steps",
    "train_iters": "run.max_steps",
    "per_device_train_batch_size": "run.per_device_batch_size",
    "micro_batch_size": "backend.micro_batch_size",
    "global_batch_size": "backend.global_batch_size",
    "gradient_accumulation_steps": "run.grad_accum",
    "learning_rate": "run.learning_rate",
    "lr": "run.learning_rate",
    "max_length": "run.max_length",
    "logging_steps": "run.logging_steps",
    "save_steps": "run.save_steps",
    "save_strategy": "run.save_steps",
    "save_only_model": "run.save_steps",
    "no_save_optim": "run.save_steps",
    "output_dir": "run.output_dir",
    "seed": "run.seed",
    "data_seed": "run.seed",
    "use_cpu": "run.device",
    "resume_from_checkpoint": "run.resume",
    "run_name": "tracking.wandb.group",
    "wandb_exp_name": "tracking.wandb.group",
    "report_to": "tracking.wandb.mode",
    "wandb_project": "tracking.wandb.project",
    "deepspeed": "backend.deepspeed",
    "gradient_checkpointing": "backend.gradient_checkpointing",
    "tensor_model_parallel_size": "backend.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "backend.pipeline_model_parallel_size",
    "context_parallel_size": "backend.context_parallel_size",
    "sequence_parallel": "backend.sequence_parallel",
    "bf16": "backend.bf16",
    "recompute_granularity": "backend.recompute_granularity",
    "use_vllm": "rollout.engine",
    "vllm_mode": "rollout.engine",
    "max_completion_length": "rollout.*",
    "rlhf_type": None,
    "external_plugins": None,
    "callbacks": None,
    "check_model": None,
    "use_hf": None,
    "split_dataset_ratio": None,
    "add_version": None,
    "logging_nan_inf_filter": None,
    "dataloader_num_workers": None,
}
_HARNESS_PREFIXES = (("vllm_", "rollout.*"),)
#: ms-swift 4.6.0 flags under which the GKD loss that trains is not ``gkd_loss`` where the plugin rebinds it, and why.
LOSS_BYPASS: Dict[str, str] = {
    # rlhf_trainers/gkd_trainer.py: _prepare_liger_loss, compute_loss -> _compute_liger_loss (never gkd_loss)
    "use_liger_kernel": "routes ms-swift's GKD loss to Liger's fused JSD (LigerFusedLinearJSDLoss), which never "
    "calls gkd_loss: the harness could neither patch nor monitor the loss that trains (and Liger rounds the logits "
    "to the input dtype before its FP32 cast, the seed's defect class)",
    # ray/megatron/loss/gkd.py: the loss runs in Ray worker actors (swift.ray.megatron.megatron_worker), not in the
    # process the plugin's callbacks watch; Ray is not installed here, so that path has never been exercised
    "use_ray": "runs Megatron's GKD loss in Ray worker actors (swift.ray.megatron.loss.gkd), a path on which the "
    "harness's rebinding and metrics have never been verified",
}
#: values that switch a boolean ms-swift flag off (``--use_liger_kernel false`` changes nothing)
_FALSE = frozenset({"false", "0", "no", "n", "f", "off"})
#: ``--tuner_type`` is set (``full``) but may be overridden: ``run.extra_args=[--tuner_type,lora,--lora_rank,8]``
#: trains LoRA adapters (ms-swift takes the last copy; nothing the harness records depends on it)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def flag_name(token: str) -> str:
    """``--attn-impl=sdpa`` -> ``attn_impl``: the field name ms-swift's parser maps the flag to."""
    return token[2:].partition("=")[0].replace("-", "_")


def flag_groups(extra_args: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``["--lora_rank", "8", "--x=1"]`` -> ``[("--lora_rank", ["8"]), ("--x=1", [])]``; raises
    :class:`ConfigError` when the list does not start with a flag."""
    groups: List[Tuple[str, List[str]]] = []
    for i, tok in enumerate(extra_args):
        if not isinstance(tok, str):
            raise ConfigError(KEY, f"item {i} must be a string, got {tok!r}")
        if _CONTROL_RE.search(tok):
            raise ConfigError(KEY, f"item {i} contains a control character")
        if tok.startswith("--") and len(tok) > 2:
            groups.append((tok, []))
        elif not groups:
            raise ConfigError(KEY, f"must start with an ms-swift flag (--name), got {tok!r}")
        else:
            groups[-1][1].append(tok)
    return groups


def harness_key(name: str) -> str | None | bool:
    """The config key that sets ms-swift flag ``name`` (``None``: the harness owns it; ``False``: a free flag)."""
    if name in HARNESS_FLAGS:
        return HARNESS_FLAGS[name]
    for prefix, key in _HARNESS_PREFIXES:
        if name.startswith(prefix):
            return key
    return False


def validate_extra_args(extra_args: Sequence[str], megatron: bool = False) -> None:
    """Raises :class:`ConfigError` naming ``run.extra_args`` for a harness-set, credential-looking or malformed
    flag, and, where the table of ms-swift's flags is cached, for a flag or value ms-swift refuses."""
    for flag, values in flag_groups(list(extra_args)):
        name = flag_name(flag)
        values = values + ([flag.partition("=")[2]] if "=" in flag else [])
        if is_secret_key(name) or any(looks_like_credential(v, hex40=True) for v in values):
            raise ConfigError(
                KEY,
                f"--{name} looks like a credential: pass it through the environment "
                "(HF_TOKEN, WANDB_API_KEY), never on the command line, where it would reach the logs",
            )
        if name in LOSS_BYPASS and not (values and values[-1].strip().lower() in _FALSE):
            raise ConfigError(KEY, f"--{name} {LOSS_BYPASS[name]}; drop the flag")
        key = harness_key(name)
        if key is None:
            raise ConfigError(KEY, f"--{name} is set by the harness and cannot be overridden")
        if key:
            raise ConfigError(KEY, f"--{name} is set by the harness: use the config key {key} instead")
    table = load_table(megatron) if extra_args else None
    why = None if table is None else refusal(list(extra_args), table, harness_key)
    if why:
        raise ConfigError(KEY, why)


__all__ = ["validate_extra_args", "flag_groups", "flag_name", "harness_key", "HARNESS_FLAGS", "LOSS_BYPASS"]
