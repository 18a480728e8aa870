"""The harness plugin: loaded by ms-swift through ``--external_plugins`` on every rank.

On import it reads its settings (a JSON file named by ``$GKD_HARNESS_PLUGIN_SETTINGS``, written by
``harness.launcher.cli``) and

1. builds the loss: the selected variant (``harness.losses``), behind a dtype boundary that casts the
   student / teacher logits to ``model.student_dtype`` / ``model.teacher_dtype`` (the mixed FP32-student /
   BF16-teacher case of Megatron, made on purpose on the HF backend) and records the dtypes that arrived, and,
   unless ``monitor=off``, wrapped by :class:`harness.rank.instrument.LossInstrument`;
2. rebinds ``gkd_loss`` where ms-swift's HF, Megatron and Ray GKD trainers imported it; a module that cannot
   import on this machine is skipped with a log line;
3. registers the ``gkd_harness`` trainer callback (``--callbacks gkd_harness``) that puts the instrument's
   metrics into the trainer's ``custom_metrics`` (so they reach ms-swift's ``logging.jsonl``, the console and
   wandb), keeps the instrument's step current, and on the rank that owns the wandb run (global rank 0 on HF,
   the last rank on Megatron: the last pipeline stage, which computes the loss) writes ``metrics.jsonl``,
   records world size, dtypes and the last step in ``summary.json`` and adds the harness config to the wandb run;
4. keeps the harness's metric names (``gkd/*``, ``spot/*``, ``rollout/*``) in wandb on both backends (HF's and
   Megatron's ``rewrite_logs`` would prefix or flatten them), and logs NaN/Inf as themselves: HF's
   ``logging_nan_inf_filter`` is turned off, and with ``monitor.fail_on_nonfinite`` the run stops with
   :class:`harness.rank.instrument.NonFiniteError` naming the step at the first non-finite loss or grad_norm.

Nothing here queries a CUDA device on import or install: the metrics' device is bound at train begin or on the
first loss call (ms-swift imports plugins before it sets each rank's device).

Without the settings variable the module only defines things (importing it has no effect on ms-swift).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import math
import os
import sys
from typing import Any, Callable, Dict, Optional

import torch
from harness.contract import CALLBACK_NAME, SETTINGS_ENV

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
    fail_on_nonfinite: bool = True  # stop at the first non-finite loss call / logged loss / grad_norm


def load_settings(path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    path = path or os.environ.get(SETTINGS_ENV)
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def settings_config(settings: Dict[str, Any]):
    """The typed config inside the plugin settings (``harness.launcher.cli.plugin_settings`` serialised it)."""
    from harness.config.schema import from_dict

    return from_dict(settings["config"])


def build_loss(settings: Dict[str, Any]):
    """``(DtypeBoundary, LossInstrument or None)``: the boundary is the drop-in ``gkd_loss`` to install."""
    from harness.losses import DTYPES_BY_NAME, make_gkd_loss, make_gkd_loss_terms

    cfg = settings_config(settings)
    precision, beta_form = cfg.loss.precision, cfg.loss.beta_form
    mon = cfg.monitor
    instrument = None
    if mon.enabled:
        from harness.rank.instrument import LossInstrument, build_metrics

        capture_dir = os.path.join(settings["run_dir"], "captures") if mon.capture else None
        instrument = LossInstrument(
            make_gkd_loss_terms(precision, beta_form), make_gkd_loss_terms("fp64", beta_form),
            build_metrics(param_grad=mon.spot_check.param_grad), spot_every=mon.spot_check.every_n_steps,
            spot_max_tokens=mon.spot_check.max_tokens, param_grad=mon.spot_check.param_grad,
            capture_dir=capture_dir, meta={"precision": precision, "beta_form": beta_form}, rank=_global_rank(),
            fail_on_nonfinite=mon.fail_on_nonfinite)
        # a resumed run continues its cumulative counts from the checkpoint's step
        for key, value in (settings.get("resume_totals") or {}).items():
            instrument.metrics[key].total = float(value)
        inner = instrument
    else:
        inner = make_gkd_loss(precision, beta_form)
    boundary = DtypeBoundary(inner, DTYPES_BY_NAME.get(cfg.model.student_dtype),
                             DTYPES_BY_NAME.get(cfg.model.teacher_dtype))
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


def _keep_harness_names(rewrite: Callable) -> Callable:
    """Wrap a ``rewrite_logs(dict) -> dict`` so the harness's keys (``gkd/*``, ``spot/*``, ``rollout/*``) pass
    through unchanged; every other key is renamed by ``rewrite`` as before."""
    if getattr(rewrite, "_gkd_harness", False):
        return rewrite
    from harness.contract import HARNESS_PREFIXES

    def rewrite_logs(d):
        keep = {k: v for k, v in d.items() if isinstance(k, str) and k.startswith(HARNESS_PREFIXES)}
        out = rewrite({k: v for k, v in d.items() if k not in keep})
        out.update(keep)
        return out

    rewrite_logs._gkd_harness = True
    rewrite_logs.__wrapped__ = rewrite
    return rewrite_logs


#: ms-swift's Megatron report callbacks, each with ``from .utils import rewrite_logs`` (``gkd/x`` -> ``train/gkd_x``).
MEGATRON_REPORT_MODULES = ("swift.megatron.callbacks.wandb", "swift.megatron.callbacks.tensorboard",
                           "swift.megatron.callbacks.swanlab")


def _keep_harness_names_in_wandb() -> Dict[str, str]:
    """The DESIGN names in wandb on both backends: HF's WandbCallback prefixes every key with ``train/``, and
    ms-swift's Megatron report callbacks rename ``gkd/x`` to ``train/gkd_x``; the harness's keys are kept as they
    are (``train/loss``, ``train/grad_norm`` keep the backends' own naming, which agrees). Megatron modules that
    cannot be imported here (no Transformer Engine) are skipped."""
    result = {}
    from transformers.integrations import integration_utils as iu

    iu.rewrite_logs = _keep_harness_names(iu.rewrite_logs)
    result["transformers"] = "kept"
    for name in MEGATRON_REPORT_MODULES:
        if "swift.megatron.callbacks" not in sys.modules:  # register_callbacks could not import it: no Megatron
            result[name] = "skipped: swift.megatron.callbacks not importable"
            continue
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - not importable on this machine
            result[name] = f"skipped: {type(e).__name__}"
            continue
        mod.rewrite_logs = _keep_harness_names(mod.rewrite_logs)
        result[name] = "kept"
    return result


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
    from harness.store.run_folder import RunFolder

    return RunFolder(STATE.settings["run_dir"])


def _record_start(world_size: int, is_writer: bool) -> None:
    """Summary fields and the harness config on the wandb run; only on the rank that owns the wandb run."""
    if not is_writer:
        return
    _run_folder().update_summary(world_size=world_size, train_pid=os.getpid(), plugin={"rebound": STATE.rebound})
    try:
        from harness.store.run_folder import package_versions
        from harness.rank.wandb_run import attach_to_wandb_run

        attach_to_wandb_run({**STATE.settings["config"], "experiment": STATE.settings.get("experiment"),
                             "world_size": world_size,
                             "versions": package_versions()})
    except Exception as e:  # noqa: BLE001 - tracking never kills training
        logger.warning(f"could not add the harness config to the wandb run: {e}")


def _check_finite_logs(logs: Dict[str, Any], step: int) -> None:
    """With ``monitor.fail_on_nonfinite``: stop at a non-finite logged loss or grad_norm (every rank sees them)."""
    if not STATE.fail_on_nonfinite:
        return
    for key in ("loss", "grad_norm"):
        value = logs.get(key)
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(value):
            from harness.rank.instrument import NonFiniteError

            raise NonFiniteError(f"non-finite {key} ({value}) at step {step}; monitor.fail_on_nonfinite=true stops "
                                 f"the run")


def _record_log(logs: Dict[str, Any], step: int, is_writer: bool) -> None:
    """One ``metrics.jsonl`` record and the summary's last step / dtypes; only on the rank that owns the wandb run."""
    if not is_writer:
        return
    from harness.store.run_folder import MetricsWriter
    from harness.rank.wandb_run import design_record, update_wandb_config

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
                inst.where.bind_rank_device(args.device)  # the rank's device, known by now (never at import)
                self.trainer.custom_metrics["train"].update(inst.metrics)
                model = self.trainer.model
                inst.params = lambda: [p for p in model.parameters() if p.requires_grad]
                inst.step = state.global_step + 1
            if getattr(args, "logging_nan_inf_filter", False):
                # HF replaces a NaN/Inf step loss by the window's mean (0.0 right after a log): log it as it is
                args.logging_nan_inf_filter = False
                logger.info("logging_nan_inf_filter turned off: NaN/Inf losses are logged as themselves")
            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            _record_start(world, is_writer=state.is_world_process_zero)

        def on_step_begin(self, args, state, control, **kwargs):
            if STATE.instrument is not None:
                STATE.instrument.step = state.global_step + 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "train_runtime" not in logs:
                _record_log(logs, state.global_step, is_writer=state.is_world_process_zero)
                _check_finite_logs(logs, state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            # Reporting callbacks (wandb's among them) come first in the trainer's list, so they are done here.
            _finish_wandb_run()

    return HarnessCallback


def _megatron_writer() -> bool:
    """The rank that owns ms-swift's Megatron wandb run: the last rank (on the last pipeline stage)."""
    from swift.utils import is_last_rank

    return bool(is_last_rank())


def _make_megatron_callback():
    from swift.megatron.callbacks.base import MegatronCallback

    class HarnessMegatronCallback(MegatronCallback):
        """Megatron-backend callback: step tracking and run-folder records (metrics computed at log time).

        ms-swift's Megatron wandb callback owns the run on the last rank (``is_last_rank``), which is also on the
        last pipeline stage, the one that computes the loss: that rank writes the run folder's records.
        """

        def on_train_begin(self):
            import torch.distributed as dist
            from swift.utils import get_current_device

            if STATE.instrument is not None:
                STATE.instrument.where.bind_rank_device(get_current_device())  # set per rank by now
            world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            _record_start(world, is_writer=_megatron_writer())

        def on_step_begin(self):
            if STATE.instrument is not None:
                STATE.instrument.step = int(self.state.iteration) + 1

        def on_log(self, logs):
            if STATE.instrument is not None:  # every rank: the metrics' all-reduce is a collective
                from swift.trainers.mixin import SwiftMixin

                logs.update(SwiftMixin.compute_custom_metrics(STATE.instrument.metrics))
            _record_log(logs, int(self.state.iteration), is_writer=_megatron_writer())
            _check_finite_logs(logs, int(self.state.iteration))

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
    STATE = PluginState(settings=settings, boundary=boundary, instrument=instrument, rebound=rebound,
                        fail_on_nonfinite=settings_config(settings).monitor.fail_on_nonfinite)
    register_callbacks()
    _keep_harness_names_in_wandb()
    try:
        _record_sft_term()
    except Exception as e:  # noqa: BLE001
        logger.info(f"SFT term not recorded: {e}")
    try:  # vLLM CPU-lane switches and rollout counters; a no-op unless harness.launcher.rollout_argv.rollout_env set them
        from harness.rank.rollout_patches import install_rollout_patches

        logger.info(f"rollout patches: {install_rollout_patches()}")
    except Exception as e:  # noqa: BLE001
        logger.info(f"rollout patches not applied: {e}")
    logger.info(f"installed loss precision={settings_config(settings).loss.precision} "
                f"beta_form={settings_config(settings).loss.beta_form} "
                f"monitor={'on' if instrument is not None else 'off'} rank={_global_rank()}")
    return STATE


def ensure_installed() -> Optional[PluginState]:
    """Install from ``$GKD_HARNESS_PLUGIN_SETTINGS`` once per process (no-op without the variable)."""
    if STATE is None:
        settings = load_settings()
        if settings is not None:
            install(settings)
    return STATE


if __name__ != "harness.rank.plugin":
    # ms-swift imports this file by path under a private module name: delegate to the package module so a
    # process has exactly one plugin state, whoever imports it.
    from harness.rank import plugin as _package_module

    _package_module.ensure_installed()
