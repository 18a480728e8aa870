"""Inside ms-swift's process: the harness's records of ms-swift's logs and its additions to the wandb run that
ms-swift opened (config, metric summaries)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.secrets import redact
from gkd_harness.harness.contract import (
    HARNESS_PREFIXES,
    HF_KEY_MAP,
    WANDB_CONFIG_KEY,
    WANDB_STEP_FILE,
    WANDB_SUMMARIES,
)
from gkd_harness.harness.store.wandb_file import GLOBAL_STEP_KEY


# ----------------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------------
def design_record(logs: Mapping[str, Any], step: int) -> Optional[Dict[str, Any]]:
    """The contract-named subset of one HF ``logs`` dict plus ``step``; ``None`` for a log without any."""
    rec: Dict[str, Any] = {}
    for k, v in logs.items():
        name = HF_KEY_MAP.get(k, k if k.startswith(HARNESS_PREFIXES) else None)
        if name is None or v is None:
            continue
        try:
            rec[name] = float(v)
        except (TypeError, ValueError):
            continue
    if not rec:
        return None
    rec["step"] = int(step)
    return rec


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _add_to_wandb_config(run: Any, tree: Mapping[str, Any]) -> None:
    """Merge ``tree`` into the run's harness config, nested under :data:`~gkd_harness.harness.contract.WANDB_CONFIG_KEY`
    (wandb's ``update`` replaces a key's whole value, so the subtree is merged here). Nested, not flat dotted
    keys: wandb stores it as ``harness.value.gkd.beta``, the form wandb-workspaces addresses as
    ``Config("harness.gkd.beta")`` and keeps through its own load-and-save."""
    current = run.config.get(WANDB_CONFIG_KEY)
    current = dict(current) if isinstance(current, Mapping) else {}
    run.config.update({WANDB_CONFIG_KEY: _merge(current, tree)}, allow_val_change=True)


def attach_to_wandb_run(harness_config: Mapping[str, Any], run_dir: Optional[str] = None) -> bool:
    """Inside ms-swift's process: add the harness config (nested under :data:`WANDB_CONFIG_KEY`) and metric
    summaries to the active wandb run; with ``run_dir`` (the run folder) also the evidence that lives beside the
    run folder (:func:`carry_run_evidence`: the sweep's plan, the data's sha256)."""
    try:
        import wandb
    except ImportError:
        return False
    run = wandb.run
    if run is None:
        return False
    tree = redact(dict(harness_config))
    flat = flatten(tree)
    from gkd_harness.harness.store.provenance import provenance

    prov = provenance(flat.get("loss.precision"), flat.get("loss.source"))
    _add_to_wandb_config(run, {**tree, "provenance": dict(prov)})
    for name, summary in WANDB_SUMMARIES.items():
        run.define_metric(name, summary=summary)
    if run_dir is not None:
        carry_run_evidence(run, Path(run_dir))
    return True


#: How far above a run folder its sweep folder (the one holding ``sweep_manifest.json``) is looked for.
_SWEEP_LEVELS = 4


def carry_run_evidence(run: Any, run_dir: Path) -> Optional[str]:
    """Make the wandb run carry what the sign-off needs beside its metrics, so every source yields the same
    evidence: a copy of the sweep's plan (``sweep_manifest.json``, the nearest one above ``run_dir``) in the run's
    files (``run.dir``: wandb uploads it with the run; offline it lies in ``offline-run-*/files/``), the run's
    point (its folder relative to that sweep folder, :data:`~gkd_harness.harness.contract.WANDB_POINT_KEY`) and
    summary.json's ``data_sha256`` in its harness config. Returns the point (None outside a planned sweep)."""
    from gkd_harness.harness.contract import DATA_SHA256_FIELD, WANDB_POINT_KEY
    from gkd_harness.harness.store.records import read_manifest, read_summary, write_manifest

    summary = read_summary(run_dir, check=False) or {}
    extra: Dict[str, Any] = {}
    data = summary.get("data_sha256")  # DATA_SHA256_FIELD
    if isinstance(data, Mapping):
        extra[DATA_SHA256_FIELD] = dict(data)
    point = None
    for sweep in list(run_dir.absolute().parents)[:_SWEEP_LEVELS]:
        manifest = read_manifest(sweep)
        if manifest is not None:
            point = str(run_dir.absolute().relative_to(sweep))
            write_manifest(Path(run.dir), manifest)
            extra[WANDB_POINT_KEY] = point
            break
    if extra:
        _add_to_wandb_config(run, extra)
    return point


def update_wandb_config(values: Mapping[str, Any]) -> None:
    """Add late-known values (dtypes seen at the loss boundary) to the active wandb run's harness config."""
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        _add_to_wandb_config(wandb.run, redact(dict(values)))


def replay_rows(rows: Sequence[Mapping[str, Any]], explicit_step: bool) -> int:
    """Log ``rows`` (``metrics.jsonl`` records: metric names and ``step``) to the active wandb run, as the backend
    logged them first: HF's ``WandbCallback`` without a step and with ``train/global_step`` (wandb's ``_step`` is its
    log counter), ms-swift's Megatron callback with ``step=`` the iteration (``explicit_step``). A resumed attempt's
    wandb run is rewound to the last row its killed predecessor's file holds; these are the rows between that one and
    the checkpoint (``gkd_harness.harness.launcher.resume.wandb_resume``). Returns the rows logged (0 without a run)."""
    try:
        import wandb
    except ImportError:
        return 0
    run = wandb.run
    if run is None:
        return 0
    for row in rows:
        step = int(row["step"])
        values = {k: v for k, v in row.items() if k != "step"}
        if explicit_step:
            run.log(values, step=step)
        else:
            run.log({**values, GLOBAL_STEP_KEY: step})
    return len(rows)


def _keep_harness_names(rewrite: Callable) -> Callable:
    """Wrap a ``rewrite_logs(dict) -> dict`` so the harness's keys (``gkd/*``, ``spot/*``, ``rollout/*``) pass
    through unchanged; every other key is renamed by ``rewrite`` as before."""
    if getattr(rewrite, "_gkd_harness", False):
        return rewrite
    from gkd_harness.harness.contract import HARNESS_PREFIXES

    def rewrite_logs(d):
        keep = {k: v for k, v in d.items() if isinstance(k, str) and k.startswith(HARNESS_PREFIXES)}
        out = rewrite({k: v for k, v in d.items() if k not in keep})
        out.update(keep)
        return out

    setattr(rewrite_logs, "_gkd_harness", True)
    setattr(rewrite_logs, "__wrapped__", rewrite)
    return rewrite_logs


def record_wandb_step_at_save(callback_cls: Any) -> bool:
    """Wrap ``callback_cls.on_save`` (transformers' ``WandbCallback``) to write, into the checkpoint folder just
    saved, the wandb run's id and its last committed step (:data:`~gkd_harness.harness.contract.WANDB_STEP_FILE`).

    HF's callback logs without an explicit step, so wandb's ``_step`` is not the global step; a resumed attempt
    rewinds the wandb run to this step (``gkd_harness.harness.launcher.resume.wandb_rewind_step``), so the history
    holds the resumed values of the steps after the checkpoint, not the first attempt's. Idempotent.
    """
    original = callback_cls.on_save
    if getattr(original, "_gkd_harness", False):
        return True

    def on_save(self, args, state, control, **kwargs):
        out = original(self, args, state, control, **kwargs)
        run = getattr(getattr(self, "_wandb", None), "run", None)
        if run is not None and state.is_world_process_zero:
            record_wandb_step(Path(args.output_dir) / f"checkpoint-{state.global_step}", run.id, int(run.step) - 1)
        return out

    setattr(on_save, "_gkd_harness", True)
    setattr(on_save, "__wrapped__", original)
    callback_cls.on_save = on_save
    return True


def record_wandb_step(checkpoint: Path, run_id: str, wandb_step: int) -> bool:
    """Write ``{"run_id", "wandb_step"}`` into ``checkpoint`` (an existing folder); False when it is not there."""
    if not checkpoint.is_dir():
        return False
    (checkpoint / WANDB_STEP_FILE).write_text(json.dumps({"run_id": run_id, "wandb_step": wandb_step}))
    return True


#: ms-swift's Megatron report callbacks, each with ``from .utils import rewrite_logs`` (``gkd/x`` -> ``train/gkd_x``).
MEGATRON_REPORT_MODULES = (
    "swift.megatron.callbacks.wandb",
    "swift.megatron.callbacks.tensorboard",
    "swift.megatron.callbacks.swanlab",
)


def keep_harness_names_in_wandb() -> Dict[str, str]:
    """The contract names in wandb on both backends: HF's WandbCallback prefixes every key with ``train/``, and
    ms-swift's Megatron report callbacks rename ``gkd/x`` to ``train/gkd_x``; the harness's keys are kept as they
    are (``train/loss``, ``train/grad_norm`` keep the backends' own naming, which agrees). Megatron modules that
    cannot be imported here (no Transformer Engine) are skipped. Also records HF's wandb step at each checkpoint
    (:func:`record_wandb_step_at_save`)."""
    result = {}
    from transformers.integrations import integration_utils as iu

    iu.rewrite_logs = _keep_harness_names(iu.rewrite_logs)
    result["transformers"] = "kept"
    # a resumed run rewinds wandb to the checkpoint's step: HF's must be recorded (Megatron logs step=iteration)
    result["transformers_wandb_step"] = "recorded" if record_wandb_step_at_save(iu.WandbCallback) else "skipped"
    for name in MEGATRON_REPORT_MODULES:
        if "swift.megatron.callbacks" not in sys.modules:  # register_callbacks could not import it: no Megatron
            result[name] = "skipped: swift.megatron.callbacks not importable"
            continue
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - not importable on this machine
            result[name] = f"skipped: {type(e).__name__}"
            continue
        setattr(mod, "rewrite_logs", _keep_harness_names(mod.rewrite_logs))
        result[name] = "kept"
    return result
