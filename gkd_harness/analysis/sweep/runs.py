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

import json
import os
from pathlib import Path
from typing import Any

from gkd_harness.analysis.sweep.metrics import read_metrics_file
from gkd_harness.analysis.sweep.plan import apply_plan, planned_by, read_plan
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
from gkd_harness.harness.contract import (
    ARCHIVE_DIR,
    CAPTURES_DIR,
    CONFIG_FILE,
    HYDRA_DIR,
    METRICS_FILE,
    RUN_STATUSES,
    SUMMARY_FILE,
    SWIFT_DIR,
    WANDB_DIR,
)

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
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UnusableInput(f"{path}: file missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnusableInput(f"{path}: not valid JSON ({e})") from None


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


def _read_config_yaml(path: Path) -> dict:
    import yaml

    try:
        resolved = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as e:
        raise UnusableInput(f"{path}: not valid YAML ({e})") from None
    if not isinstance(resolved, dict):
        raise UnusableInput(f"{path}: expected a mapping")
    return flatten(resolved)


def _provenance(summary: dict) -> dict:
    """summary.json's ``provenance`` (harness commit, dirty flag, sha256 of the loss code) as version entries."""
    prov = summary.get("provenance")
    if not isinstance(prov, dict):
        return {}
    return {k: prov.get(k) for k in ("harness_commit", "harness_dirty", "loss_sha256", "rank_sha256") if k in prov}


def load_run_folder(path: os.PathLike) -> RunRecord:
    """Read one run folder. Raises :class:`UnusableInput` on missing/corrupt files."""
    path = Path(path)
    summary_path = path / SUMMARY_FILE
    verdict_path = path / HYDRA_DIR / _HYDRA_VERDICT
    hydra_verdict = _read_json(verdict_path) if verdict_path.exists() else None
    hydra_failed = isinstance(hydra_verdict, dict) and hydra_verdict.get("status") == "FAILED"
    hydra_error = hydra_verdict.get("error") if isinstance(hydra_verdict, dict) else None
    if not summary_path.exists():
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
    summary = _read_json(summary_path)
    if not isinstance(summary, dict):
        raise UnusableInput(f"{summary_path}: expected a JSON object")
    status = summary.get("status")
    if status not in RUN_STATUSES:
        raise UnusableInput(f"{summary_path}: 'status' must be {'|'.join(RUN_STATUSES)}, got {status!r}")
    config = summary.get("config") or {}
    if not isinstance(config, dict):
        raise UnusableInput(f"{summary_path}: 'config' must be an object")
    config = flatten(config)
    if hydra_failed and status != "failed":
        summary = dict(summary, error=summary.get("error") or hydra_error)
        status = "failed"
    cfg_yaml = path / CONFIG_FILE
    conflicts = []
    if cfg_yaml.exists():
        for k, v in _read_config_yaml(cfg_yaml).items():
            if k in IDENTITY_KEYS and k in config and _differ(config[k], v):
                conflicts.append(RecordConflict(path.name, k, (config[k], v)))
            config.setdefault(k, v)
    metrics_path = path / METRICS_FILE
    problems = []
    history: Any
    if metrics_path.exists():
        history = read_metrics_file(metrics_path, completed=status == "completed")
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
    records = [load_run_folder(p) for p in folders]
    have = {str(p.relative_to(root)) for p in folders if p != root} | {p.name for p in folders}
    for name in planned:
        if name not in have and plan is not None:
            launch = planned_by(plan, name)
            records.append(
                RunRecord(
                    name=name,
                    status="missing",
                    config={},
                    history=[],
                    path=None,
                    error=f"planned by launch {launch} of {len(plan.launches)} ({plan.where}) but has no run folder",
                    problems=["never started, cancelled while pending, or its folder was deleted"],
                )
            )
    return apply_plan(tabulate(records, source=f"local:{root}"), plan, root)
