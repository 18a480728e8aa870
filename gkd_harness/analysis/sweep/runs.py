"""Load a sweep from local run folders (the default source of ``gkd-analyze``).

A run folder holds ``config.yaml``, ``metrics.jsonl`` and ``summary.json`` as written by ``gkd-train`` (the run
folder contract, ``docs/signoff.md``). A sweep point that failed before the harness wrote anything (a config
error) leaves only Hydra's ``.hydra/`` folder, with ``job_return.json`` saying FAILED: it is a failed run.

Problems that make the input unusable (missing sweep, a run folder without ``summary.json``, unparseable
JSON, a metrics line without ``step``) raise :class:`~gkd_harness.analysis.sweep.records.UnusableInput` naming the file.
``metrics.jsonl`` is read in one pass into columns by :mod:`gkd_harness.analysis.sweep.metrics` (typed records: a record of
the wrong type makes the run ``tampered``); NaN and ±Inf written by Python's ``json`` (``NaN``, ``Infinity``) are
read as themselves.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from gkd_harness.analysis.sweep.metrics import read_metrics_file
from gkd_harness.analysis.sweep.plan import apply_plan, missing_points, read_plan
from gkd_harness.analysis.sweep.records import (
    CONFIG_COLUMNS,
    TRAINING_KEYS,
    RecordConflict,
    RunRecord,
    Sweep,
    UnusableInput,
    tabulate,
)
from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.user_files import UserFileError, read_text
from gkd_harness.harness.contract import (
    ARCHIVE_DIR,
    CAPTURES_DIR,
    CONFIG_FILE,
    DATA_SHA256_FIELD,
    HYDRA_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    SWIFT_DIR,
    WANDB_DIR,
)
from gkd_harness.harness.store.records import RecordError, metrics_path, read_config, read_summary

__all__ = ["find_run_folders", "load_run_folder", "load_sweep", "planned_points"]

_SKIP_DIRS = {WANDB_DIR, SWIFT_DIR, CAPTURES_DIR, HYDRA_DIR, "__pycache__", ".submitit", "report", ARCHIVE_DIR}
_HYDRA_VERDICT = "job_return.json"  # written by gkd_harness.launch.sweep's Hydra callback for every sweep point
_MARKERS = (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE)
#: The config keys of a run's identity that summary.json and config.yaml must give alike.
IDENTITY_KEYS = frozenset(CONFIG_COLUMNS + TRAINING_KEYS)


def planned_points(sweep: os.PathLike) -> tuple:
    """``(point names, where)``: what the sweep plans now (:func:`gkd_harness.analysis.sweep.plan.read_plan`:
    ``sweep_manifest.json``, else Hydra's ``multirun.yaml``); ``([], None)`` when the folder holds neither."""
    plan = read_plan(sweep)
    return (list(plan.points), plan.where) if plan is not None else ([], None)


def _read_json(path: Path) -> Any:
    try:  # a regular file of bounded size (a FIFO blocked gkd-analyze forever; issue 48, item 6)
        return json.loads(read_text(path))
    except FileNotFoundError:
        raise UnusableInput(f"{path}: file missing") from None
    except UserFileError as e:
        raise UnusableInput(str(e)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnusableInput(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise UnusableInput(f"{path}: not valid JSON (nested too deeply)") from None


def find_run_folders(sweep: os.PathLike) -> list:
    """Run folders under ``sweep`` (a folder holding ``summary.json``, ``metrics.jsonl`` or ``config.yaml``, or a
    Hydra job folder whose ``.hydra/job_return.json`` exists).

    ``sweep`` itself counts when it is a run folder. Tool folders (``wandb/``, ``swift/``, ``captures/``,
    ``.hydra/``, ``previous_attempts/``) are not searched. Raises :class:`UnusableInput` when the folder is
    missing or holds no run.
    """
    root = Path(sweep)
    if not root.exists():
        raise UnusableInput(f"sweep folder {root} does not exist")
    if not root.is_dir():
        raise UnusableInput(f"sweep {root} is not a folder")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        hydra_verdict = HYDRA_DIR in dirnames and (Path(dirpath) / HYDRA_DIR / _HYDRA_VERDICT).exists()
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for d in dirnames:  # os.walk does not enter a linked folder: a linked run folder is said, never skipped
            link = Path(dirpath) / d
            if link.is_symlink() and any((link / m).exists() for m in _MARKERS):
                raise UnusableInput(
                    f"run folder {link} is a symbolic link (to {os.readlink(link)}): copy the run folder into the "
                    "sweep, or analyse the folder it links to"
                )
        if hydra_verdict or any(m in filenames for m in _MARKERS):
            found.append(Path(dirpath))
            dirnames[:] = []  # a run folder's subfolders are its own (captures, swift, wandb)
    if not found:
        raise _NoRunFolders(f"no run folders under {root}: expected sub-folders with summary.json and metrics.jsonl")
    return found


class _NoRunFolders(UnusableInput):
    """The sweep folder exists and holds no run folder (every planned point may still be missing)."""


def _provenance(summary: dict) -> dict:
    """summary.json's ``provenance`` (harness commit, dirty flag, sha256 of the loss code) as version entries."""
    prov = summary.get("provenance")
    if not isinstance(prov, dict):
        return {}
    return {k: prov.get(k) for k in ("harness_commit", "harness_dirty", "loss_sha256", "rank_sha256") if k in prov}


def load_run_folder(path: os.PathLike) -> RunRecord:
    """Read one run folder. Raises :class:`UnusableInput` on missing/corrupt files."""
    path = Path(path)
    verdict_path = path / HYDRA_DIR / _HYDRA_VERDICT
    hydra_verdict = _read_json(verdict_path) if verdict_path.exists() else None
    hydra_failed = isinstance(hydra_verdict, dict) and hydra_verdict.get("status") == "FAILED"
    hydra_error = hydra_verdict.get("error") if isinstance(hydra_verdict, dict) else None
    try:
        read = read_summary(path)
        resolved = read_config(path)
    except RecordError as e:
        raise UnusableInput(str(e)) from None
    if read is None:
        if hydra_failed:
            # The point failed before the harness wrote anything (e.g. a config error): a failed run.
            return RunRecord(
                name=path.name,
                status="failed",
                error=hydra_error,
                config={},
                history=[],
                path=str(path),
                problems=["failed before summary.json was written"],
            )
        raise UnusableInput(f"run folder {path}: summary.json missing (every run writes it at start)")
    summary: dict = dict(read)
    status = str(summary.get("status"))
    config = flatten(summary.get("config") or {})
    if hydra_failed and status != "failed":
        summary = dict(summary, error=summary.get("error") or hydra_error)
        status = "failed"
    conflicts = []
    for k, v in flatten(resolved or {}).items():
        if k in IDENTITY_KEYS and k in config and _differ(config[k], v):
            conflicts.append(RecordConflict(path.name, k, (config[k], v)))
        config.setdefault(k, v)
    problems = []
    history: Any
    if metrics_path(path).exists():
        history = read_metrics_file(metrics_path(path), completed=status == "completed")
        if history.unusable:
            raise UnusableInput(history.unusable)
    elif status == "completed":
        raise UnusableInput(f"run folder {path}: metrics.jsonl missing although summary.json says completed")
    else:
        history = []
        problems.append("no metrics.jsonl")
    return RunRecord(
        name=str(summary.get("run_name") or path.name),
        status=status,
        error=summary.get("error"),
        group=summary.get("group"),
        config=config,
        history=history,
        path=str(path),
        dtypes_seen=dict(summary.get("dtypes_seen") or {}),
        versions={**dict(summary.get("versions") or {}), **_provenance(summary)},
        last_step=summary.get("last_step"),
        wall_s=summary.get("wall_s"),
        problems=problems,
        data_sha256=dict(summary.get(DATA_SHA256_FIELD) or {}),
        experiment=summary.get("experiment") if isinstance(summary.get("experiment"), str) else None,
        conflicts=conflicts,
    )


def _differ(a: Any, b: Any) -> bool:
    """Whether two recorded values of one config key differ (``1`` and ``1.0`` do not)."""
    try:
        return float(a) != float(b)
    except (TypeError, ValueError):
        return str(a) != str(b)


def load_sweep(sweep: os.PathLike) -> Sweep:
    """Load every run folder under ``sweep`` into a :class:`~gkd_harness.analysis.sweep.records.Sweep`.

    Example (a notebook)::

        from gkd_harness.analysis.load import load_sweep
        sw = load_sweep("outputs/multirun/smoke")
        sw.runs[["run", "loss.precision", "gkd.beta", "outcome"]]
        sw.run_history(sw.runs["run"][0])["train/loss"]
    """
    root = Path(sweep)
    plan = read_plan(root) if root.is_dir() else None
    planned = list(plan.points) if plan is not None else []
    try:
        folders = find_run_folders(sweep)
    except _NoRunFolders:
        if not planned:
            raise
        folders = []  # the sweep planned points and none started (every array task cancelled): all missing
    have = {str(p.relative_to(root)) for p in folders if p != root} | {p.name for p in folders}
    # one run folder at a time: each run's columns are freed once tabulate has its history frame, so the peak
    # holds the frames and the concatenated history, never every run's records besides them
    records = itertools.chain((load_run_folder(p) for p in folders), missing_points(plan, have))
    return apply_plan(tabulate(records, source=f"local:{root}"), plan, root)
