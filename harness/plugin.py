"""The harness plugin: loaded by ms-swift through ``--external_plugins`` on every rank.

On import it reads its settings (a JSON file named by ``$GKD_HARNESS_PLUGIN_SETTINGS``, written by
``harness.train``) and

1. builds the loss: the selected variant (``harness.losses``), behind a dtype boundary that casts the
   student / teacher logits to ``model.student_dtype`` / ``model.teacher_dtype`` (the mixed FP32-student /
   BF16-teacher case of Megatron, made on purpose on the HF backend) and records the dtypes that arrived, and,
   unless ``monitor=off``, wrapped by :class:`harness.instrument.LossInstrument`;
2. rebinds ``gkd_loss`` where ms-swift's HF, Megatron and Ray GKD trainers imported it; a module that cannot
   import on this machine is skipped with a log line;
3. registers the ``gkd_harness`` trainer callback (``--callbacks gkd_harness``) that puts the instrument's
   metrics into the trainer's ``custom_metrics`` (so they reach ms-swift's ``logging.jsonl``, the console and
   wandb), keeps the instrument's step current, writes ``metrics.jsonl`` on global rank 0, records world size,
   dtypes and the last step in ``summary.json`` and adds the harness config to the wandb run.

Without the settings variable the module only defines things (importing it has no effect on ms-swift).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
from typing import Any, Callable, Dict, Optional

import torch

SETTINGS_ENV = "GKD_HARNESS_PLUGIN_SETTINGS"
CALLBACK_NAME = "gkd_harness"
#: Modules that did ``from swift.rlhf_trainers.gkd_loss import gkd_loss``.
TRAINER_MODULES = (
    "swift.rlhf_trainers.gkd_trainer",
    "swift.megatron.trainers.gkd_trainer",
    "swift.ray.megatron.loss.gkd",
)

logger = logging.getLogger("gkd_harness.plugin")
if not logger.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("[gkd-harness] %(message)s"))
    logger.addHandler(_h)
    logger.setLevel(logging.INFO)

#: Process-wide state of the installed plugin (None until :func:`install`).
STATE: Optional["PluginState"] = None


def _global_rank() -> int:
    rank = int(os.environ.get("RANK", "-1"))
    return max(rank, 0)


class DtypeBoundary:
    """Casts the loss inputs to configured dtypes and records what arrived and what the loss saw.

    ``student_dtype`` / ``teacher_dtype``: ``torch.dtype`` or None (leave as is). The cast of the student is
    part of the graph (gradients flow back through it); teacher values are constants.
    """

    def __init__(self, loss: Callable, student_dtype: Optional[torch.dtype], teacher_dtype: Optional[torch.dtype]):
        self.loss, self.student_dtype, self.teacher_dtype = loss, student_dtype, teacher_dtype
        self.arrived: Dict[str, str] = {}
        self.seen: Dict[str, str] = {}

    @staticmethod
    def _teacher_tensor(t) -> Optional[torch.Tensor]:
        return t.full_logits if t.full_logits is not None else t.topk_logprobs

    def __call__(self, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        t_in = self._teacher_tensor(teacher_output)
        if not self.arrived:
            self.arrived = {"student": _name(student_logits.dtype), "teacher": _name(t_in.dtype) if t_in is not None
                            else "none"}
        if self.student_dtype is not None and student_logits.dtype != self.student_dtype:
            student_logits = student_logits.to(self.student_dtype)
        if self.teacher_dtype is not None and t_in is not None and t_in.dtype != self.teacher_dtype:
            field = "full_logits" if teacher_output.full_logits is not None else "topk_logprobs"
            teacher_output = dataclasses.replace(teacher_output, **{field: t_in.to(self.teacher_dtype)})
        if not self.seen:
            t_out = self._teacher_tensor(teacher_output)
            self.seen = {"student": _name(student_logits.dtype), "teacher": _name(t_out.dtype) if t_out is not None
                         else "none"}
        return self.loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclasses.dataclass
class PluginState:
    settings: Dict[str, Any]
    boundary: DtypeBoundary
    instrument: Any  # LossInstrument or None
    rebound: Dict[str, str]
    dtypes_sent: bool = False  # dtypes already added to the wandb run


def load_settings(path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    path = path or os.environ.get(SETTINGS_ENV)
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def build_loss(settings: Dict[str, Any]):
    """``(DtypeBoundary, LossInstrument or None)``: the boundary is the drop-in ``gkd_loss`` to install."""
    from harness.losses import DTYPES_BY_NAME, make_gkd_loss, make_gkd_loss_terms

    precision, beta_form = settings["precision"], settings["beta_form"]
    mon = settings.get("monitor") or {}
    instrument = None
    if mon.get("enabled", True):
        from harness.instrument import LossInstrument, build_metrics

        capture_dir = os.path.join(settings["run_dir"], "captures") if mon.get("capture") else None
        instrument = LossInstrument(
            make_gkd_loss_terms(precision, beta_form), make_gkd_loss_terms("fp64", beta_form),
            build_metrics(param_grad=bool(mon.get("param_grad"))), spot_every=int(mon.get("spot_every") or 0),
            spot_max_tokens=int(mon.get("spot_max_tokens") or 256), param_grad=bool(mon.get("param_grad")),
            capture_dir=capture_dir, meta={"precision": precision, "beta_form": beta_form}, rank=_global_rank())
        # a resumed run continues its cumulative counts from the checkpoint's step
        for key, value in (settings.get("resume_totals") or {}).items():
            instrument.metrics[key].total = float(value)
        inner = instrument
    else:
        inner = make_gkd_loss(precision, beta_form)
    boundary = DtypeBoundary(inner, DTYPES_BY_NAME.get(settings.get("student_dtype")),
                             DTYPES_BY_NAME.get(settings.get("teacher_dtype")))
    return boundary, instrument


def rebind_gkd_loss(loss: Callable, modules=TRAINER_MODULES) -> Dict[str, str]:
    """Set ``module.gkd_loss = loss`` in each trainer module; ``{module: "rebound" | "skipped: <reason>"}``."""
    result = {}
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure means "not on this machine"
            result[name] = f"skipped: {type(e).__name__}: {e}"
            logger.info(f"gkd_loss not rebound in {name}: it cannot be imported here ({type(e).__name__}: {e})")
            continue
        if not hasattr(mod, "gkd_loss"):
            result[name] = "skipped: no gkd_loss attribute"
            logger.info(f"gkd_loss not rebound in {name}: the module has no gkd_loss")
            continue
        mod.gkd_loss = loss
        result[name] = "rebound"
        logger.info(f"gkd_loss rebound in {name}")
    return result


def _keep_harness_names_in_wandb() -> None:
    """HF's WandbCallback prefixes every key with ``train/``; keep the DESIGN names (``gkd/*``, ``spot/*``)."""
    from transformers.integrations import integration_utils as iu

    if getattr(iu.rewrite_logs, "_gkd_harness", False):
        return
    original = iu.rewrite_logs

    def rewrite_logs(d):
        keep = {k: v for k, v in d.items() if k.startswith(("gkd/", "spot/"))}
        out = original({k: v for k, v in d.items() if k not in keep})
        out.update(keep)
        return out

    rewrite_logs._gkd_harness = True
    iu.rewrite_logs = rewrite_logs


def _record_sft_term() -> None:
    """Wrap the HF GKD trainer's ``compute_loss`` to record the SFT term (``gkd/sft_loss``) when sft_alpha > 0."""
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    if getattr(GKDTrainer.compute_loss, "_gkd_harness", False):
        return
    original = GKDTrainer.compute_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if STATE is None or STATE.instrument is None or not getattr(self.args, "sft_alpha", 0):
            return original(self, model, inputs, return_outputs, num_items_in_batch)
        loss, outputs = original(self, model, inputs, True, num_items_in_batch)
        sft = getattr(outputs, "loss", None) if outputs is not None else None
        if sft is not None:
            STATE.instrument.record_sft(sft.detach())
        return (loss, outputs) if return_outputs else loss

    compute_loss._gkd_harness = True
    GKDTrainer.compute_loss = compute_loss


def _run_folder():
    from harness.tracking import RunFolder

    return RunFolder(STATE.settings["run_dir"])


def _record_start(world_size: int) -> None:
    if _global_rank() != 0:
        return
    _run_folder().update_summary(world_size=world_size, train_pid=os.getpid(), plugin={"rebound": STATE.rebound})
    try:
        from harness.tracking import attach_to_wandb_run, package_versions

        attach_to_wandb_run({**STATE.settings.get("harness_config", {}), "world_size": world_size,
                             "versions": package_versions()})
    except Exception as e:  # noqa: BLE001 - tracking never kills training
        logger.warning(f"could not add the harness config to the wandb run: {e}")


def _record_log(logs: Dict[str, Any], step: int) -> None:
    if _global_rank() != 0:
        return
    from harness.tracking import MetricsWriter, design_record, update_wandb_config

    rec = design_record(logs, step)
    if rec is not None:
        MetricsWriter(_run_folder().metrics_path).write(rec)
    fields: Dict[str, Any] = {"last_step": int(step)}
    if STATE.boundary.seen:
        fields.update(dtypes_seen=STATE.boundary.seen, dtypes_arrived=STATE.boundary.arrived)
        if not STATE.dtypes_sent:
            STATE.dtypes_sent = True
            try:
                update_wandb_config({"dtypes_seen": STATE.boundary.seen, "dtypes_arrived": STATE.boundary.arrived})
            except Exception as e:  # noqa: BLE001
                logger.warning(f"could not add dtypes to the wandb run: {e}")
    _run_folder().update_summary(**fields)


def _finish_wandb_run() -> None:
    """Close this process's wandb run synchronously, so its files are complete when ms-swift exits.

    Without it the run is closed by wandb's own service only after it notices the process is gone (measured:
    over a minute later), so a reader right after ``gkd-train`` returns can find a file with a header only.
    """
    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return
    try:
        wandb.finish()
    except Exception as e:  # noqa: BLE001 - tracking never kills training
        logger.warning(f"wandb.finish() failed: {e}")


def _make_hf_callback():
    from swift.callbacks import TrainerCallback

    class HarnessCallback(TrainerCallback):
        """HF-backend callback: metrics into ``custom_metrics``, step tracking, run-folder records."""

        def on_train_begin(self, args, state, control, **kwargs):
            import torch.distributed as dist

            inst = STATE.instrument
            if inst is not None:
                self.trainer.custom_metrics["train"].update(inst.metrics)
                model = self.trainer.model
                inst.params = lambda: [p for p in model.parameters() if p.requires_grad]
                inst.step = state.global_step + 1
            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            _record_start(world)

        def on_step_begin(self, args, state, control, **kwargs):
            if STATE.instrument is not None:
                STATE.instrument.step = state.global_step + 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "train_runtime" not in logs:
                _record_log(logs, state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            # Reporting callbacks (wandb's among them) come first in the trainer's list, so they are done here.
            _finish_wandb_run()

    return HarnessCallback


def _make_megatron_callback():
    from swift.megatron.callbacks.base import MegatronCallback

    class HarnessMegatronCallback(MegatronCallback):
        """Megatron-backend callback: step tracking and run-folder records (metrics computed at log time)."""

        def on_train_begin(self):
            import torch.distributed as dist

            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            _record_start(world)

        def on_step_begin(self):
            if STATE.instrument is not None:
                STATE.instrument.step = int(self.state.iteration) + 1

        def on_log(self, logs):
            if STATE.instrument is not None:
                from swift.trainers.mixin import SwiftMixin

                logs.update(SwiftMixin.compute_custom_metrics(STATE.instrument.metrics))
            _record_log(logs, int(self.state.iteration))

        def on_train_end(self):
            _finish_wandb_run()

    return HarnessMegatronCallback


def register_callbacks() -> Dict[str, str]:
    """Put the harness callback into ms-swift's HF and Megatron callback maps under ``gkd_harness``."""
    result = {}
    for name, make, mod_name in (("hf", _make_hf_callback, "swift.callbacks"),
                                 ("megatron", _make_megatron_callback, "swift.megatron.callbacks")):
        try:
            mod = importlib.import_module(mod_name)
            cb_map = mod.callbacks_map if name == "hf" else mod.megatron_callbacks_map
            cb_map[CALLBACK_NAME] = make()
            result[name] = "registered"
        except Exception as e:  # noqa: BLE001
            result[name] = f"skipped: {type(e).__name__}: {e}"
            logger.info(f"{name} callback not registered: {type(e).__name__}: {e}")
    return result


def install(settings: Dict[str, Any]) -> PluginState:
    """Build the loss, rebind it everywhere, register callbacks and wandb naming; idempotent per process."""
    global STATE
    boundary, instrument = build_loss(settings)
    rebound = rebind_gkd_loss(boundary)
    STATE = PluginState(settings=settings, boundary=boundary, instrument=instrument, rebound=rebound)
    register_callbacks()
    _keep_harness_names_in_wandb()
    try:
        _record_sft_term()
    except Exception as e:  # noqa: BLE001
        logger.info(f"SFT term not recorded: {e}")
    try:  # vLLM CPU-lane switches and rollout counters; a no-op unless harness.rollout.rollout_env set them
        from harness.rollout import install_rollout_patches

        logger.info(f"rollout patches: {install_rollout_patches()}")
    except Exception as e:  # noqa: BLE001
        logger.info(f"rollout patches not applied: {e}")
    logger.info(f"installed loss precision={settings['precision']} beta_form={settings['beta_form']} "
                f"monitor={'on' if instrument is not None else 'off'} rank={_global_rank()}")
    return STATE


def ensure_installed() -> Optional[PluginState]:
    """Install from ``$GKD_HARNESS_PLUGIN_SETTINGS`` once per process (no-op without the variable)."""
    if STATE is None:
        settings = load_settings()
        if settings is not None:
            install(settings)
    return STATE


if __name__ != "harness.plugin":
    # ms-swift imports this file by path under a private module name: delegate to the package module so a
    # process has exactly one plugin state, whoever imports it.
    from harness import plugin as _package_module

    _package_module.ensure_installed()
