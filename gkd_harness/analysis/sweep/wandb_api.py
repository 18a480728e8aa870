"""Load a sweep from wandb: run objects -> :class:`~gkd_harness.analysis.sweep.records.RunRecord`, and the public API query.

Histories come from ``scan_history`` (every logged row); the sampled ``history()`` would miscount
negative-loss calls. :func:`runs_from_wandb` also converts the offline runs of :mod:`gkd_harness.analysis.sweep.offline`,
which offer the same interface.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Mapping, Optional

from gkd_harness.analysis.sweep.plan import apply_plan, carried_plan, missing_points
from gkd_harness.analysis.sweep.records import RunRecord, Sweep, UnusableInput, int_step, tabulate
from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.contract import (
    DATA_KEYS,
    DATA_SHA256_FIELD,
    SWEEP_MANIFEST_FILE,
    TRAIN_GLOBAL_STEP,
    WANDB_CONFIG_KEY,
    WANDB_POINT_KEY,
)
from gkd_harness.harness.store.records import Manifest, RecordError, read_manifest

__all__ = ["runs_from_wandb", "load_wandb_sweep", "row_step", "WANDB_STATE", "harness_config", "carried_manifest"]

#: wandb run state -> harness status.
WANDB_STATE = {
    "finished": "completed",
    "failed": "failed",
    "crashed": "failed",
    "killed": "failed",
    "running": "running",
    "preempted": "failed",
    "pending": "running",
}
_STEP_KEYS = ("step", TRAIN_GLOBAL_STEP, "_step")
_NONFINITE_STRINGS = {
    "NaN": math.nan,
    "nan": math.nan,
    "Infinity": math.inf,
    "inf": math.inf,
    "-Infinity": -math.inf,
    "-inf": -math.inf,
}


def row_step(row: Mapping) -> Optional[Any]:
    """The step of one history row: ``step``, else ``train/global_step``, else wandb's ``_step``; None if none."""
    return next((row[k] for k in _STEP_KEYS if row.get(k) is not None), None)


def _value(v: Any) -> Any:
    """A logged value as itself; NaN/Infinity that arrive as strings become floats (never 0 or None)."""
    if isinstance(v, str) and v in _NONFINITE_STRINGS:
        return _NONFINITE_STRINGS[v]
    return v


#: summary.json ``provenance`` fields that are part of a run's identity (the run-folder loader reads the same).
PROVENANCE_KEYS = ("harness_commit", "harness_dirty", "loss_sha256", "rank_sha256")


def harness_config(config: Mapping) -> dict:
    """A wandb run's config as the run folder's flat config: wandb's ``{"value": ...}`` wrappers dropped and the
    harness's subtree (:data:`~gkd_harness.harness.contract.WANDB_CONFIG_KEY`) at the top (``harness.run.seed``
    -> ``run.seed``; the harness's key wins over a same-named key of ms-swift's own config)."""
    flat = flatten(dict(config))
    prefix = WANDB_CONFIG_KEY + "."
    wrapped = prefix + "value."
    flat = {k[:-6] if k.endswith(".value") else k: v for k, v in flat.items()}
    flat = {prefix + k[len(wrapped) :] if k.startswith(wrapped) else k: v for k, v in flat.items()}
    out = {k: v for k, v in flat.items() if not k.startswith(prefix)}
    out.update({k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)})
    return out


def carried_manifest(run: Any) -> Optional[Manifest]:
    """The copy of the sweep's manifest a wandb run carries in its files (``gkd_harness.harness.rank.wandb_run.
    carry_run_evidence``): an offline run's ``files/`` folder, or the public API's ``run.file``; None when it
    carries none."""
    files = getattr(run, "files_dir", None)
    if files is not None:
        try:
            return read_manifest(files)
        except RecordError:
            return None
    getter = getattr(run, "file", None)
    if getter is None:
        return None
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="gkd-manifest-") as tmp:
            getter(SWEEP_MANIFEST_FILE).download(root=tmp, replace=True)
            return read_manifest(tmp)
    except Exception:  # noqa: BLE001 - a run without the file (older runs), or no network: no carried plan
        return None


def _status(summary: Mapping, state: Any) -> str:
    """The harness's own status where it wrote one, but a crashed/failed wandb state always wins."""
    status = summary.get("status") if summary.get("status") in ("completed", "failed", "running") else None
    wb = WANDB_STATE.get(str(state or ""), "running")
    return wb if status is None or wb == "failed" else status


def runs_from_wandb(runs: Iterable[Any], include_job_types=None) -> list:
    """Convert wandb run objects into :class:`RunRecord` s.

    Each object needs ``name``, ``group``, ``job_type``, ``state``, ``config``, ``summary`` and
    ``scan_history()`` (the public API's ``wandb.apis.public.Run``, or ``gkd_harness.analysis.sweep.offline.OfflineRun``).
    Analysis runs (``job_type == "analysis"``) are skipped.
    """
    out = []
    for r in runs:
        job_type = getattr(r, "job_type", None)
        if job_type == "analysis" or (include_job_types and job_type not in include_job_types):
            continue
        config = harness_config(r.config)
        summary = dict(r.summary)
        history = []
        for row in r.scan_history():
            step = row_step(row)
            if step is None:
                continue
            item = {k: _value(v) for k, v in row.items() if not k.startswith("_") and v is not None}
            item["step"] = int_step(step, f"wandb run {r.name}")
            history.append(item)
        dtypes = {}
        for side in ("student", "teacher"):
            v = config.get(f"dtypes_seen.{side}", summary.get(f"dtypes_seen.{side}"))
            if v is None and isinstance(summary.get("dtypes_seen"), Mapping):
                v = summary["dtypes_seen"].get(side)
            if v is not None:
                dtypes[side] = v
        versions = {
            k.split("versions.", 1)[1]: v for k, v in config.items() if k.startswith("versions.") or ".versions." in k
        }
        versions.update({k: config[f"provenance.{k}"] for k in PROVENANCE_KEYS if f"provenance.{k}" in config})
        data = {k: config[f"{DATA_SHA256_FIELD}.{k}"] for k in DATA_KEYS if f"{DATA_SHA256_FIELD}.{k}" in config}
        out.append(
            RunRecord(
                name=str(r.name),
                status=_status(summary, getattr(r, "state", None)),
                config=config,
                history=history,
                error=summary.get("error"),
                group=getattr(r, "group", None),
                path=getattr(r, "path_str", None),
                dtypes_seen=dtypes,
                versions=versions,
                last_step=summary.get("last_step"),
                problems=list(getattr(r, "problems", []) or []),
                point=config.get(WANDB_POINT_KEY) if isinstance(config.get(WANDB_POINT_KEY), str) else None,
                manifest=carried_manifest(r),
                data_sha256=data,
                experiment=config.get("experiment") if isinstance(config.get("experiment"), str) else None,
            )
        )
    return out


def load_wandb_sweep(path: str, group: str, api: Any = None) -> Sweep:
    """Load a sweep from wandb's public API: ``path`` = ``entity/project``, runs filtered by ``group``."""
    if api is None:
        import wandb

        api = wandb.Api()
    try:
        runs = list(api.runs(path, filters={"group": group}))
    except Exception as e:  # network, auth, unknown project
        raise UnusableInput(f"wandb {path} group {group!r}: cannot list runs ({e})") from None
    records = runs_from_wandb(runs)
    if not records:
        raise UnusableInput(f"wandb {path} group {group!r}: no runs")
    return with_carried_plan(records, source=f"wandb:{path}/{group}")


def with_carried_plan(records: list, source: str, plan: Any = None, root: Any = None) -> Sweep:
    """Tabulate the runs of a wandb source with the sweep's plan: ``plan`` (a manifest file beside the runs),
    else the one the runs carry (:func:`gkd_harness.analysis.sweep.plan.carried_plan`); the planned points no run
    carries are ``missing``, as in the run-folder loader."""
    problems: list = []
    if plan is None:
        plan, problems = carried_plan([r.manifest for r in records if r.manifest is not None])
    have = {r.point or r.name for r in records}
    if root is not None:
        have |= {os.path.relpath(r.path, root) for r in records if isinstance(r.path, str) and r.path}
    records = records + missing_points(plan, have, what="wandb run")
    for r in records:
        r.problems = list(r.problems) + problems
    return apply_plan(tabulate(records, source=source), plan, root)
