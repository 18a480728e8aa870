"""Load a sweep from wandb offline run files (``offline-run-*/run-*.wandb``), for machines without a wandb
server and for tests.

Every attempt of one run is one run: files that share a wandb run id (a resumed run), or that sit in the same
run folder (a run folder holds ``summary.json``, ``metrics.jsonl`` or ``config.yaml``; its wandb files lie in
``<run folder>/wandb/wandb/offline-run-*/``, or ``<run folder>/wandb/offline-run-*/``), are merged into one
run, attempts ordered by start time; the later attempt wins per step, and for config and summary keys.
Archived attempts (``previous_attempts/``) are not read, as the run-folder loader does not read them.

Copies are not attempts. Files of one wandb run id owned by different places (two run folders, or two wandb
folders outside any run folder), and a second file of the same attempt (same run id and start time), are
copies of one run: each copy stays its own run under the run's name, so the tables mark it (``copy_of``) as
the run-folder loader does, and ``gkd-analyze`` refuses the sweep unless ``--allow-mixed`` is given
(:func:`gkd_harness.analysis.sweep.records.mixed_sweep_problems`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gkd_harness.analysis.sweep.plan import read_plan
from gkd_harness.analysis.sweep.records import Sweep, UnusableInput
from gkd_harness.analysis.sweep.wandb_api import row_step, runs_from_wandb, with_carried_plan
from gkd_harness.analysis.sweep.wandb_file import read_records
from gkd_harness.harness.contract import ARCHIVE_DIR, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE

__all__ = ["OfflineRun", "MergedRun", "find_offline_runs", "group_attempts", "load_wandb_offline"]

_RUN_MARKERS = (SUMMARY_FILE, METRICS_FILE, CONFIG_FILE)
_LATEST_RUN = "latest-run"  # wandb's link to the newest offline-run-* folder of a wandb folder
#: How far above the folder holding ``offline-run-*`` a run folder is looked for: ``<run>/wandb/`` (1),
#: ``<run>/wandb/wandb/`` (2, gkd-train's WANDB_DIR=<run>/wandb), ``<run>/swift/wandb/`` (2, Megatron's
#: dir=--output_dir), one more level for a wandb folder nested once more.
_OWNER_LEVELS = 3


def _item_key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _item_value(item) -> Any:
    """A record item's JSON value; wandb writes NaN/Infinity as JSON's non-standard tokens, read as floats."""
    try:
        return json.loads(item.value_json)
    except (json.JSONDecodeError, ValueError):
        return item.value_json


class OfflineRun:
    """One wandb offline run file, with the public API's run interface (``name``, ``id``, ``group``,
    ``job_type``, ``state``, ``config``, ``summary``, ``scan_history()``) plus ``start_time`` (s, 0 unknown)."""

    def __init__(self, path: os.PathLike):
        self.path = Path(path)
        self.path_str = str(self.path)
        #: the run's files (``offline-run-*/files/``): what the run carries besides its records
        self.files_dir = self.path.parent / "files"
        self.id = self.name = self.group = self.job_type = self.project = None
        self.config: Dict[str, Any] = {}
        self.summary: Dict[str, Any] = {}
        self._history: List[Dict[str, Any]] = []
        self.tags: List[str] = []
        self.problems: List[str] = []
        self.start_time = 0.0
        exit_code = None
        for rec in read_records(self.path):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r = rec.run
                self.id = r.run_id or self.id
                self.name = r.display_name or self.name or r.run_id
                self.group = r.run_group or self.group
                self.job_type = r.job_type or self.job_type
                self.project = r.project or self.project
                self.tags = list(r.tags) or self.tags
                if r.HasField("start_time"):
                    self.start_time = r.start_time.seconds + r.start_time.nanos * 1e-9
                self._update_config(r.config)
            elif kind == "config":
                self._update_config(rec.config)
            elif kind == "history":
                row = {_item_key(it): _item_value(it) for it in rec.history.item}
                if rec.history.HasField("step"):
                    row.setdefault("_step", rec.history.step.num)
                self._history.append(row)
            elif kind == "summary":
                for it in rec.summary.update:
                    self.summary[_item_key(it)] = _item_value(it)
                for it in rec.summary.remove:
                    self.summary.pop(_item_key(it), None)
            elif kind == "exit":
                exit_code = rec.exit.exit_code
        if self.id is None:
            # Only the file header: the process died before wandb flushed anything. Keep it as a crashed run;
            # the file name still carries the run id (run-<id>.wandb).
            self.id = self.name = self.path.stem.replace("run-", "", 1)
            self.problems.append(f"{self.path.name} holds no records (killed before wandb flushed)")
            self.state = "crashed"
            return
        self.state = "running" if exit_code is None else ("finished" if exit_code == 0 else "failed")

    def _update_config(self, cfg) -> None:
        for it in cfg.update:
            key = _item_key(it)
            if key == "_wandb":
                continue
            self.config[key] = _item_value(it)
        for it in cfg.remove:
            self.config.pop(_item_key(it), None)

    def scan_history(self) -> Iterator[dict]:
        return iter(self._history)


class MergedRun:
    """Several attempts of one run (``attempts`` ordered oldest first) seen as one, same interface as
    :class:`OfflineRun`: identity, state and ``path_str`` of the last attempt; config and summary merged with
    the later attempt winning; history rows of each step from the latest attempt that logged the step."""

    def __init__(self, attempts: list, run_folder: Optional[Path] = None):
        self.attempts = attempts
        last = attempts[-1]
        self.id, self.state, self.start_time = last.id, last.state, last.start_time
        self.files_dir = last.files_dir
        self.path_str = str(run_folder) if run_folder is not None else last.path_str
        for attr in ("name", "group", "job_type", "project"):
            setattr(self, attr, next((getattr(a, attr) for a in reversed(attempts) if getattr(a, attr)), None))
        self.tags: List[str] = next((a.tags for a in reversed(attempts) if a.tags), [])
        self.config, self.summary = {}, {}
        for a in attempts:
            self.config.update(a.config)
            self.summary.update(a.summary)
        self.problems = [p for a in attempts for p in a.problems]
        self.problems.append(
            f"{len(attempts)} wandb attempts merged (later attempt wins per step): "
            + ", ".join(a.path.parent.name for a in attempts)
        )

    def scan_history(self) -> Iterator[dict]:
        owner = {}  # step -> index of the latest attempt that logged it
        for i, a in enumerate(self.attempts):
            for row in a.scan_history():
                step = row_step(row)
                if step is not None:
                    owner[step] = i
        for i, a in enumerate(self.attempts):
            for row in a.scan_history():
                step = row_step(row)
                if step is None or owner.get(step) == i:
                    yield row


def find_offline_runs(root: os.PathLike) -> list:
    """All ``run-*.wandb`` files under ``root`` (sorted), except archived attempts under ``previous_attempts/``
    and wandb's ``latest-run`` (a link to one ``offline-run-*`` folder; a copy that follows links makes it a
    second copy of that folder)."""
    return sorted(
        p for p in Path(root).rglob("run-*.wandb") if not {ARCHIVE_DIR, _LATEST_RUN} & set(p.relative_to(root).parts)
    )


def _run_folder(path: Path, root: Optional[Path] = None) -> Optional[Path]:
    """The harness run folder owning the wandb file ``path`` (``.../offline-run-*/run-*.wandb``): the nearest
    of the :data:`_OWNER_LEVELS` folders above the one holding ``offline-run-*`` that has a run marker, not
    above ``root`` (the sweep folder); None outside any run folder."""
    stop = Path(root).absolute() if root is not None else None
    for folder in list(path.parent.parent.parents)[:_OWNER_LEVELS]:
        if any((folder / m).is_file() for m in _RUN_MARKERS):
            return folder
        if stop is not None and folder.absolute() == stop:
            break
    return None


def _owner(run: "OfflineRun", root: Optional[Path]) -> Path:
    """Where one attempt lives: its run folder, else the wandb folder holding its ``offline-run-*`` folder."""
    return _run_folder(run.path, root) or run.path.parent.parent


def _copies(members: list, root: Optional[Path]) -> list:
    """Split one run's files into copies: by owner (:func:`_owner`), and within an owner a second file of the
    same attempt (same run id and start time) starts another copy. Returns lists of attempts, in owner order."""
    by_owner: Dict[Path, List[OfflineRun]] = {}
    for r in members:
        by_owner.setdefault(_owner(r, root), []).append(r)
    out = []
    for owner in sorted(by_owner, key=str):
        layers: List[List[OfflineRun]] = []
        seen: Dict[Tuple[Any, Any], int] = {}
        for r in sorted(by_owner[owner], key=lambda a: a.path_str):
            key = (r.id, r.start_time) if r.start_time else (r.id, r.path.parent.name)
            k = seen.get(key, 0)
            seen[key] = k + 1
            if k == len(layers):
                layers.append([])
            layers[k].append(r)
        out += layers
    return out


def group_attempts(runs: list, root: Optional[os.PathLike] = None) -> list:
    """Group :class:`OfflineRun` s into runs: same run id, or same run folder (transitively); copies of one run
    (:func:`_copies`) stay apart, each its own run with a problem naming the other copies.

    Returns a list of runs: an :class:`OfflineRun` where a run has one attempt, else a :class:`MergedRun`
    (attempts ordered by start time, then by their ``offline-run-<time>-<id>`` folder name). A run inside a
    harness run folder gets that folder as its ``path_str`` (where ``captures/`` are), else its file. Run
    folders are searched up to ``root`` (the sweep folder)."""
    root = Path(root) if root is not None else None
    parent = list(range(len(runs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_by_key: Dict[Tuple[str, Any], int] = {}
    for i, r in enumerate(runs):
        folder = _run_folder(r.path, root)
        for key in (("id", r.id), ("folder", folder)):
            if key[1] is None:
                continue
            j = first_by_key.setdefault(key, i)
            parent[find(i)] = find(j)
    groups: Dict[int, List[OfflineRun]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(find(i), []).append(r)
    out = []
    for members in groups.values():
        copies = _copies(members, root)
        for copy in copies:
            run = _one_run(copy, root)
            if len(copies) > 1:
                where = [
                    str(_owner(c[0], root))
                    + ("" if _owner(c[0], root) != _owner(copy[0], root) else f" ({c[0].path.parent.name})")
                    for c in copies
                ]
                run.problems.append(f"wandb run id {copy[-1].id}: {len(copies)} copies ({', '.join(where)})")
            out.append(run)
    return out


def _one_run(members: list, root: Optional[Path]):
    """The attempts of one copy as one run (an :class:`OfflineRun` or a :class:`MergedRun`)."""
    if len(members) == 1:
        folder = _run_folder(members[0].path, root)
        if folder is not None:
            members[0].path_str = str(folder)
        return members[0]
    members.sort(key=lambda a: (a.start_time or 0.0, a.path.parent.name))
    folders = {_run_folder(a.path, root) for a in members} - {None}
    return MergedRun(members, next(iter(folders)) if len(folders) == 1 else None)


def load_wandb_offline(root: os.PathLike, group: Optional[str] = None) -> Sweep:
    """Load the wandb offline runs under ``root`` (optionally only one ``group``) into a :class:`Sweep`."""
    root = Path(root)
    if not root.exists():
        raise UnusableInput(f"folder {root} does not exist")
    files = find_offline_runs(root)
    if not files:
        raise UnusableInput(f"no wandb offline run files (run-*.wandb) under {root}")
    runs = group_attempts([OfflineRun(f) for f in files], root)
    if group is not None:
        # A run whose files hold no records has no known group: keep it (marked), it may be this sweep's.
        runs = [r for r in runs if r.group == group or r.group is None]
    records = runs_from_wandb(runs)
    if not records:
        raise UnusableInput(
            f"no training runs in the wandb offline files under {root}" + (f" for group {group!r}" if group else "")
        )
    # the sweep folder's own manifest when the files lie in it, else the copies the runs carry
    return with_carried_plan(
        records, source=f"wandb-offline:{root}", plan=read_plan(root) if root.is_dir() else None, root=root
    )
