"""The harness plugin: loaded by ms-swift through ``--external_plugins`` on every rank.

On import it reads its settings (a JSON file named by ``$GKD_HARNESS_PLUGIN_SETTINGS``, written by
``gkd_harness.harness.launcher.run``; :class:`gkd_harness.harness.contract.PluginSettings`, parsed once) and

1. builds the loss: the selected variant (``gkd_harness.harness.losses``), behind a dtype boundary that casts the
   student / teacher logits to ``model.student_dtype`` / ``model.teacher_dtype`` (the mixed FP32-student /
   BF16-teacher case of Megatron, made on purpose on the HF backend) and records the dtypes that arrived, and,
   unless ``monitor=off``, wrapped by :class:`gkd_harness.harness.rank.instrument.LossInstrument`;
2. rebinds ``gkd_loss`` where ms-swift's HF, Megatron and Ray GKD trainers imported it; a module that cannot
   import on this machine is skipped with a warning, and at train begin (``gkd_harness.harness.rank.call_site.check_rebound``,
   called by the callbacks) the active backend's call site must hold the configured loss, or the run stops at once
   naming the module and its import error (``LossNotInstalledError``): never a "completed" run on upstream's loss;
3. registers the ``gkd_harness`` trainer callback (``--callbacks gkd_harness``) that puts the instrument's
   metrics into the trainer's ``custom_metrics`` (so they reach ms-swift's ``logging.jsonl``, the console and
   wandb), keeps the instrument's step current, and on the rank that owns the wandb run (global rank 0 on HF,
   the last rank on Megatron: the last pipeline stage, which computes the loss) writes ``metrics.jsonl``,
   records world size, dtypes and the last step in ``summary.json`` and adds the harness config to the wandb run;
4. keeps the harness's metric names (``gkd/*``, ``spot/*``, ``rollout/*``) in wandb on both backends (HF's and
   Megatron's ``rewrite_logs`` would prefix or flatten them), and logs NaN/Inf as themselves: HF's
   ``logging_nan_inf_filter`` is turned off, and with ``monitor.fail_on_nonfinite`` the run stops with
   :class:`gkd_harness.harness.rank.instrument.NonFiniteError` naming the step at the first non-finite loss or grad_norm.

Nothing here queries a CUDA device on import or install: the metrics' device is bound at train begin or on the
first loss call (ms-swift imports plugins before it sets each rank's device).

Without the settings variable the module only defines things (importing it has no effect on ms-swift).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Dict, Optional

from gkd_harness.harness.config.schema import from_dict
from gkd_harness.harness.contract import CANDIDATE, CAPTURES_DIR, PLUGIN_MODULE, SETTINGS_ENV, PluginSettings
from gkd_harness.harness.rank import state
from gkd_harness.harness.rank.boundary import DtypeBoundary
from gkd_harness.harness.rank.call_site import ACTIVE_CALL_SITE, TRAINER_MODULES, LossNotInstalledError, check_rebound  # noqa: F401 - re-exported
from gkd_harness.harness.rank.callbacks import register_callbacks
from gkd_harness.harness.rank.state import PluginState, global_rank, logger
from gkd_harness.harness.rank.wandb_run import keep_harness_names_in_wandb


def load_settings(path: Optional[str] = None) -> Optional[PluginSettings]:
    """The settings file named by ``path`` or ``$GKD_HARNESS_PLUGIN_SETTINGS``; None without either."""
    path = path or os.environ.get(SETTINGS_ENV)
    return PluginSettings.read(path) if path else None


def build_loss(settings: PluginSettings, cfg):
    """``(DtypeBoundary, LossInstrument or None)`` for the typed config ``cfg`` of ``settings``: the boundary is the
    drop-in ``gkd_loss`` to install."""
    from gkd_harness.harness.losses import DTYPES_BY_NAME, make_gkd_loss, make_gkd_loss_terms

    precision, beta_form = cfg.loss.precision, cfg.loss.beta_form
    mon = cfg.monitor
    if precision == CANDIDATE:  # a fix loaded from loss.source, installed exactly like a built-in variant
        from gkd_harness.harness.loss.candidate import candidate_terms, load_candidate, run_source

        run_loss = load_candidate(run_source(cfg.loss.source, settings.run_dir), cfg.loss.name).gkd_loss
        run_terms = candidate_terms(run_loss, mon.spot_check.max_tokens)
    else:
        run_loss, run_terms = make_gkd_loss(precision, beta_form), make_gkd_loss_terms(precision, beta_form)
    instrument = None
    if mon.enabled:
        from gkd_harness.harness.rank.instrument import LossInstrument, build_metrics

        capture_dir = os.path.join(settings.run_dir, CAPTURES_DIR) if mon.capture else None
        instrument = LossInstrument(
            run_terms,
            make_gkd_loss_terms("fp64", beta_form),
            build_metrics(param_grad=mon.spot_check.param_grad),
            spot_every=mon.spot_check.every_n_steps,
            spot_max_tokens=mon.spot_check.max_tokens,
            param_grad=mon.spot_check.param_grad,
            capture_dir=capture_dir,
            meta={"precision": precision, "beta_form": beta_form},
            rank=global_rank(),
            fail_on_nonfinite=mon.fail_on_nonfinite,
            capture_max_tokens=mon.capture_max_tokens,
        )
        # a resumed run continues its cumulative counts from the checkpoint's step
        for key, value in settings.resume_totals.items():
            instrument.metrics[key].total = float(value)
        inner: Callable[..., Any] = instrument
    else:
        inner = run_loss
    if mon.eval.every_n_steps:  # the held-out evaluation sees the logits as they reach the loss
        from gkd_harness.harness.rank.evaluation import EvalTap

        inner = EvalTap(inner, run_loss, beta_form)
    boundary = DtypeBoundary(
        inner, DTYPES_BY_NAME.get(cfg.model.student_dtype), DTYPES_BY_NAME.get(cfg.model.teacher_dtype)
    )
    return boundary, instrument


def rebind_gkd_loss(loss: Callable, modules=TRAINER_MODULES) -> Dict[str, str]:
    """Set ``module.gkd_loss = loss`` in each trainer module; ``{module: "rebound" | "skipped: <reason>"}``."""
    result = {}
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure means "not on this machine"
            result[name] = f"skipped: {type(e).__name__}: {e}"
            logger.warning(f"gkd_loss not rebound in {name}: it cannot be imported here ({type(e).__name__}: {e})")
            continue
        if not hasattr(mod, "gkd_loss"):
            result[name] = "skipped: no gkd_loss attribute"
            logger.warning(f"gkd_loss not rebound in {name}: the module has no gkd_loss")
            continue
        setattr(mod, "gkd_loss", loss)
        result[name] = "rebound"
        logger.info(f"gkd_loss rebound in {name}")
    return result


def _record_sft_term() -> None:
    """Wrap the HF GKD trainer's ``compute_loss`` to record the SFT term (``gkd/sft_loss``) when sft_alpha > 0."""
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    if getattr(GKDTrainer.compute_loss, "_gkd_harness", False):
        return
    original = GKDTrainer.compute_loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        st = state.STATE
        if st is None or st.instrument is None or not getattr(self.args, "sft_alpha", 0):
            return original(self, model, inputs, return_outputs, num_items_in_batch)
        loss, outputs = original(self, model, inputs, True, num_items_in_batch)
        sft = getattr(outputs, "loss", None) if outputs is not None else None
        if sft is not None:
            st.instrument.record_sft(sft.detach())
        return (loss, outputs) if return_outputs else loss

    setattr(compute_loss, "_gkd_harness", True)
    GKDTrainer.compute_loss = compute_loss


def install(settings: PluginSettings) -> PluginState:
    """Build the loss, rebind it everywhere, register callbacks and wandb naming; idempotent per process."""
    cfg = from_dict(settings.config)
    boundary, instrument = build_loss(settings, cfg)
    rebound = rebind_gkd_loss(boundary)
    state.STATE = PluginState(settings=settings, config=cfg, boundary=boundary, instrument=instrument, rebound=rebound)
    register_callbacks()
    keep_harness_names_in_wandb()
    try:
        _record_sft_term()
    except Exception as e:  # noqa: BLE001
        logger.info(f"SFT term not recorded: {e}")
    if cfg.monitor.eval.every_n_steps:
        try:
            from gkd_harness.harness.rank.evaluation import find_tap, install_hf_hooks

            tap = find_tap(boundary)
            if tap is not None:
                install_hf_hooks(tap)
        except Exception as e:  # noqa: BLE001 - the HF trainer cannot import here (Megatron-only machine)
            logger.info(f"HF evaluation hook not installed: {type(e).__name__}: {e}")
    try:  # vLLM CPU-lane switches and rollout counters; a no-op unless the launcher's rollout_env set them
        from gkd_harness.harness.rank.rollout_patches import install_rollout_patches

        logger.info(f"rollout patches: {install_rollout_patches()}")
    except Exception as e:  # noqa: BLE001
        logger.info(f"rollout patches not applied: {e}")
    logger.info(
        f"installed loss precision={cfg.loss.precision} beta_form={cfg.loss.beta_form} "
        f"monitor={'on' if instrument is not None else 'off'} rank={global_rank()}"
    )
    return state.STATE


def ensure_installed() -> Optional[PluginState]:
    """Install from ``$GKD_HARNESS_PLUGIN_SETTINGS`` once per process (no-op without the variable)."""
    if state.STATE is None:
        settings = load_settings()
        if settings is not None:
            install(settings)
    return state.STATE


if __name__ != PLUGIN_MODULE:
    # ms-swift imports this file by path under a private module name: delegate to the package module so a
    # process has exactly one plugin state, whoever imports it.
    from gkd_harness.harness.rank import plugin as _package_module

    _package_module.ensure_installed()
