"""Load a sweep from wandb: run objects -> :class:`~gkd_harness.analysis.sweep.records.RunRecord`, and the public API query.

Histories come from ``scan_history`` (every logged row); the sampled ``history()`` would miscount
negative-loss calls. :func:`runs_from_wandb` also converts the offline runs of :mod:`gkd_harness.analysis.sweep.offline`,
which offer the same interface.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

from gkd_harness.analysis.sweep.records import RunRecord, Sweep, UnusableInput, int_step, tabulate
from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.contract import TRAIN_GLOBAL_STEP

__all__ = ["runs_from_wandb", "load_wandb_sweep", "row_step", "WANDB_STATE"]

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
        config = flatten(dict(r.config))
        config = {k[:-6] if k.endswith(".value") else k: v for k, v in config.items()}
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
    return tabulate(records, source=f"wandb:{path}/{group}")
