"""Sweep discipline for ``gkd-train -m``: resume summary, progress, one status line per point.

Registered as a Hydra callback in ``configs/hydra/default.yaml`` (``hydra.callbacks.sweep_status``); works the
same with every launcher (basic, submitit_local, submitit_slurm) because it only reads run folders:

- ``on_multirun_start`` (launching process): lists the sweep's points exactly as Hydra's basic sweeper expands
  them, prints how many already completed (gkd_harness.harness.launcher.cli skips those) and how many will (re)run, and starts a
  progress printer thread (points done / failed, the running point's step out of ``run.max_steps``).
  Before the first point starts it writes the sweep's manifest, ``<sweep folder>/sweep_manifest.json`` (the
  planned point names, the group, the launcher; names of an earlier manifest in the same folder are kept), so
  ``gkd-analyze`` can name every planned point that has no run folder (a cancelled SLURM array task).
- ``on_job_start`` / ``on_job_end`` (the process that runs the point; a submitit worker for submitit launchers):
  writes Hydra's own verdict for the point to ``<run folder>/.hydra/job_return.json`` when the point *owns* that
  folder, so a point that failed before it wrote ``summary.json`` (e.g. a config error in a fresh folder) still
  reports ``failed`` with its error. A point owns its folder when the folder held no other attempt's run when the
  point started (:func:`holds_a_run`), or when the point itself started a run there (its ``summary.json``
  changed). A point that was *refused* (its folder is busy, or holds a run of another config), or *invalid*
  (validation refused its config) while its folder holds another attempt's run, owns nothing there: nothing is
  written into that folder; the refusal goes to the sweep's console and to ``<sweep folder>/refused_points.log``
  (the final table shows the point as ``refused``). A point skipped because the same config completed there
  earlier leaves the earlier verdict as it is.
- ``on_multirun_end``, or at interpreter exit when Hydra re-raises a failed point after the whole batch ran:
  prints one line per point (status, steps, error), read back from the run folders.

A point's status, in order of trust: ``job_return.json`` says FAILED -> ``failed``; otherwise ``summary.json``'s
status; otherwise ``missing`` (never ran, or killed before writing anything).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gkd_harness.harness.contract import HYDRA_DIR, SWEEP_MANIFEST_FILE
from gkd_harness.harness.launcher.job_result import EXIT_CONFIG, PointFailed
from gkd_harness.harness.launcher.progress import ProgressDisplay, Running, Snapshot, render
from gkd_harness.harness.launcher.sweep_points import point_name, sweep_points
from gkd_harness.harness.store.files import RunFolderError
from gkd_harness.harness.store.fingerprint import code_change_line
from gkd_harness.harness.store.metrics_io import tail_step
from gkd_harness.harness.store.records import (
    manifest_from_mapping,
    metrics_path,
    read_manifest,
    read_quietly,
    read_summary,
    summary_path,
)
from gkd_harness.harness.store.records import write_manifest as write_manifest_record

STATUS_FILE = "job_return.json"
MULTIRUN_FILE = "multirun.yaml"  # Hydra's record of a sweep's config
REFUSED_LOG = "refused_points.log"


#: The keys a plan declares for each point (from the sweep's config and the point's own overrides): what the
#: sign-off needs to know before any run exists (the seeds to pair, the steps and the final held-out evaluation).
DECLARED_KEYS = ("run.seed", "run.max_steps", "run.logging_steps", "monitor.eval.every_n_steps")
MANIFEST_SCHEMA = 2


def _base_values(config: Any) -> dict:
    """:data:`DECLARED_KEYS` as the sweep's config gives them (attributes, read once; None where a value only
    resolves inside a job)."""

    def read(get: Any) -> Any:
        try:
            return get()
        except Exception:  # noqa: BLE001 - an interpolation that only resolves inside a job, a missing group
            return None

    run, monitor = read(lambda: config.run), read(lambda: config.monitor)
    values = (
        read(lambda: run.seed),
        read(lambda: run.max_steps),
        read(lambda: run.logging_steps),
        read(lambda: monitor.eval.every_n_steps),
    )
    return dict(zip(DECLARED_KEYS, values))


def declared_point(job_overrides: list[str], config: Any) -> dict:
    """What the plan declares for one point: :data:`DECLARED_KEYS` from the sweep's config, each replaced by the
    point's own ``key=value`` override where it has one, and ``overrides`` (the point's override list; the keys
    it sweeps are what may differ between runs)."""
    out: dict = {}
    for key, v in _base_values(config).items():
        out[key] = int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    for line in job_overrides:
        key, sep, value = str(line).lstrip("+~").partition("=")
        if sep and key in DECLARED_KEYS:
            try:
                out[key] = int(float(value))
            except ValueError:
                out[key] = None
    out["overrides"] = [str(x) for x in job_overrides]
    return out


def write_manifest(
    sweep_dir: Path,
    names: list[str],
    group: str,
    launcher: str,
    declared: dict | None = None,
    signoff: dict | None = None,
) -> tuple[Path, dict]:
    """Append this launch to the sweep's plan, ``sweep_manifest.json`` (atomically); returns its path and this
    launch's entry.

    The plan is append-only: ``launches`` keeps every launch (``id`` 1, 2, ..., ``at``, ``launcher``, ``points``,
    and what it ``adds`` to the plan, ``drops`` from it (points of earlier launches that are not in this one and
    never ran) and ``keeps`` (points of earlier launches that are not in this one but ran: they stay planned, their
    runs are evidence)). ``points`` is the plan now: this launch's points and the kept ones. ``declared``: point
    name -> :func:`declared_point`; ``signoff``: criteria values the experiment preset declares
    (``hydra.callbacks.sweep_status.plan``, e.g. the non-inferiority margin), merged by gkd-analyze over the
    shipped criteria. A manifest of the first layout (``points`` only) counts as launch 1."""

    sweep_dir = Path(sweep_dir)
    found = read_quietly(read_manifest, sweep_dir)
    earlier: dict = found.to_mapping() if found is not None else {}
    before = [str(n) for n in (earlier.get("points") or [])]
    launches = [dict(x) for x in (earlier.get("launches") or []) if isinstance(x, dict)]
    if before and not launches:  # the first layout: one launch whose declarations were not recorded
        launches = [{"id": 1, "at": earlier.get("written_at"), "launcher": earlier.get("launcher"), "points": before}]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    new = [str(n) for n in dict.fromkeys(names)]
    keeps = [n for n in before if n not in new and holds_a_run(sweep_dir / n)]
    entry = {
        "id": len(launches) + 1,
        "at": now,
        "launcher": launcher,
        "points": new,
        "adds": [n for n in new if n not in before],
        "drops": [n for n in before if n not in new and n not in keeps],
        "keeps": keeps,
        "signoff": dict(signoff or {}),
    }
    got = earlier.get("declared")
    old_declared: dict = got if isinstance(got, dict) else {}
    plan_declared = {n: old_declared[n] for n in keeps if n in old_declared}
    plan_declared.update({n: v for n, v in (declared or {}).items() if n in new})
    body = {
        "schema": MANIFEST_SCHEMA,
        "group": group,
        "launcher": launcher,
        "points": [n for n in before if n in keeps] + new,
        "declared": plan_declared,
        "signoff": dict(signoff or {}),
        "launches": [*launches, entry],
        "written_at": now,
    }
    sweep_dir.mkdir(parents=True, exist_ok=True)
    return write_manifest_record(sweep_dir, manifest_from_mapping(body)), entry


def launch_line(entry: dict) -> str | None:
    """What a relaunch adds to or drops from the plan, in one line; None for the first launch."""
    if int(entry.get("id") or 1) <= 1:
        return None

    def few(names: list) -> str:
        return ", ".join(names[:4]) + (f" ... ({len(names)})" if len(names) > 4 else "")

    parts = [f"launch {entry['id']} of this sweep's plan"]
    parts.append(f"adds {len(entry['adds'])} point(s)" + (f" ({few(entry['adds'])})" if entry["adds"] else ""))
    parts.append(
        f"drops {len(entry['drops'])} planned earlier that never ran"
        + (f" ({few(entry['drops'])})" if entry["drops"] else "")
    )
    if entry["keeps"]:
        parts.append(f"keeps {len(entry['keeps'])} that ran earlier ({few(entry['keeps'])})")
    return ", ".join(parts)


_GRID_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


class _NoManifest(Exception):
    """A sweep whose points are not known in advance plans no manifest."""


def sweeper_name(config: Any) -> str:
    """The sweeper's ``_target_`` (``hydra.sweeper``), Hydra's basic grid sweeper when none is named."""
    return str((config.hydra.get("sweeper") or {}).get("_target_") or _GRID_SWEEPER)


def is_grid_sweeper(config: Any) -> bool:
    """Whether the sweep's points are the grid of its overrides (Hydra's basic sweeper), known before any runs."""
    return sweeper_name(config) == _GRID_SWEEPER


def discovered_points(sweep_dir: Path) -> list[Path]:
    """The point folders a sweep made so far, oldest first (a sweeper plugin names its points as it goes): every
    folder of ``sweep_dir`` with a ``summary.json`` or Hydra's verdict for a point, and ``sweep_dir`` itself
    when a point without overrides ran there."""
    try:
        folders = [sweep_dir, *(d for d in Path(sweep_dir).iterdir() if d.is_dir() and not d.name.startswith("."))]
    except OSError:
        return []
    found = [d for d in folders if summary_path(d).exists() or (d / HYDRA_DIR / STATUS_FILE).exists()]
    return sorted(found, key=lambda d: (d.stat().st_mtime_ns, d.name))


@dataclass
class PointStatus:
    """What one sweep point's run folder says.

    Attributes:
        name: the point's run name (Hydra override_dirname; also its folder name).
        run_dir: the point's run folder.
        status: ``completed`` | ``failed`` | ``running`` | ``missing`` | ``refused`` (in this multirun; see
            :meth:`SweepStatusCallback.statuses`).
        step: last logged global step (``metrics.jsonl``), or None.
        max_steps: ``run.max_steps`` from ``summary.json``'s config, or None.
        error: first line of the error for failed points.
        wall_s: ``summary.json``'s wall time, when finished.
    """

    name: str
    run_dir: Path
    status: str = "missing"
    step: int | None = None
    max_steps: int | None = None
    error: str | None = None
    wall_s: float | None = None


def _plain(x: Any) -> Any:
    """A DictConfig (Hydra hands callback arguments as one) as plain dicts and lists."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(x, (DictConfig, ListConfig)):
            return OmegaConf.to_container(x, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return x


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds anything of an earlier attempt besides Hydra's verdict (``.hydra/job_return.json``)
    and empty files (the log file Hydra opens for every job): a ``summary.json``, metrics, a config, a subfolder."""
    try:
        entries = list(Path(run_dir).iterdir())
    except OSError:
        return False
    for p in entries:
        if p.name == HYDRA_DIR and p.is_dir():
            if any(q.name != STATUS_FILE for q in p.iterdir()):
                return True
        elif p.is_dir() or p.is_symlink() or p.stat().st_size > 0:
            return True
    return False


def _summary_bytes(run_dir: Path) -> bytes | None:
    try:
        return summary_path(run_dir).read_bytes()
    except OSError:
        return None


def read_point(name: str, run_dir: Path) -> PointStatus:
    """Status of one point from its run folder (see the module docstring for the order of trust)."""
    point = PointStatus(name=name, run_dir=run_dir)
    summary = read_quietly(read_summary, run_dir)
    verdict = _read_json(run_dir / HYDRA_DIR / STATUS_FILE)
    if summary:
        point.status = str(summary.get("status", "missing"))
        point.error = summary.get("error")
        point.wall_s = summary.get("wall_s")
        point.max_steps = (summary.get("config") or {}).get("run.max_steps")
        point.step = summary.get("last_step")
    if verdict and verdict.get("status") == "FAILED":
        point.status = "failed"
        point.error = point.error or verdict.get("error")
    step = tail_step(metrics_path(run_dir))
    if step is not None:
        point.step = step
    if point.error:
        point.error = str(point.error).strip().splitlines()[-1][:200] if str(point.error).strip() else None
    return point


def format_point(point: PointStatus, resumed: bool = False) -> str:
    """One summary line: status, steps, wall time, name, error."""
    steps = f"{point.step if point.step is not None else '-'}/{point.max_steps if point.max_steps else '?'}"
    wall = f"{point.wall_s:.0f}s" if isinstance(point.wall_s, (int, float)) else "-"
    status = point.status + (" (skipped: completed earlier)" if resumed and point.status == "completed" else "")
    line = f"  {status:<38} steps {steps:<9} wall {wall:<7} {point.name or '(no overrides)'}"
    if point.error and point.status in ("failed", "refused"):
        line += f"  error: {point.error}"
    return line


class SweepStatusCallback(Callback):
    """Hydra callback: resume summary, progress printer, final per-point status table.

    Args:
        progress_interval_s: seconds between progress polls (0 disables the progress printer).
        stream: where to print (default stdout).
    """

    def __init__(
        self,
        progress_interval_s: float = 30,
        stream: TextIO | None = None,
        plan: Any = None,
        launch_id: str | None = None,
    ) -> None:
        self.progress_interval_s = float(progress_interval_s)
        self.stream = stream
        #: criteria values the experiment preset declares (``hydra.callbacks.sweep_status.plan``)
        self.plan = _plain(plan) if plan is not None else {}
        #: this multirun's id: its refusals are told apart from another launch's in the same folder
        self.launch_tag = launch_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._launch_id = 0
        self._points: list[tuple[str, Path]] = []
        self._completed_before: set[str] = set()
        self._group = ""
        self._sweep_dir = Path(".")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._reported = False
        #: the sweeper chooses its points as it goes (not a grid): the points are the run folders found
        self._discovered = False
        #: a dry run's copy of the sweep folder's earlier multirun.yaml (put back at the end)
        self._kept_multirun: bytes | None = None
        #: run folder -> (held another attempt's run at on_job_start, its summary.json bytes then)
        self._at_start: dict[Path, tuple[bool, bytes | None]] = {}

    # submitit launchers pickle the Hydra context (callbacks included) into every job: ship settings only
    def __getstate__(self) -> dict:
        return {"progress_interval_s": self.progress_interval_s, "plan": self.plan, "launch_id": self.launch_tag}

    def __setstate__(self, state: dict) -> None:
        SweepStatusCallback.__init__(self, **state)

    # -- printing
    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def statuses(self) -> list[PointStatus]:
        """Each point's status read from its folder; a point refused in this multirun is ``refused``, with the
        refusal as its error (its folder holds another attempt's run, which says nothing about this one)."""
        refused = self.refused_points()
        if self._discovered:
            self._points = [(d.name, d) for d in discovered_points(self._sweep_dir)]
        points = [read_point(name, run_dir) for name, run_dir in self._points]
        for p in points:
            if p.name in refused:
                p.status, p.error = "refused", refused[p.name]
        return points

    # -- Hydra hooks
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = Path(str(config.hydra.sweep.dir))
        self._group = str(config.tracking.wandb.group or "")
        self._discovered = False
        # a dry run never changes a sweep folder: Hydra rewrites its multirun.yaml after this hook, so the earlier
        # sweep's is kept here and put back at the end
        self._kept_multirun = None
        if (config.get("run") or {}).get("dry_run", False):
            try:
                self._kept_multirun = (self._sweep_dir / MULTIRUN_FILE).read_bytes()
            except OSError:
                pass
        try:
            if not is_grid_sweeper(config):
                raise ValueError(f"{sweeper_name(config)} chooses its points as it goes")
            names = [point_name(job, config) for job in sweep_points(config)]
        except Exception as e:  # noqa: BLE001 - a sweeper plugin (Optuna, Nevergrad) or an override the grid lacks
            # the points are the run folders the sweep makes: the progress and the final table list those
            self._discovered = True
            self._print(
                f"[sweep {self._group}] points not known in advance ({e}); the table lists the points as they run"
            )
            names = []
        self._points = [(n, self._sweep_dir / n) for n in names]
        try:
            if self._discovered:
                raise _NoManifest()
            launcher = str((config.hydra.get("launcher") or {}).get("_target_") or "basic")
            if not (config.get("run") or {}).get("dry_run", False):  # a dry run plans nothing
                jobs = sweep_points(config)
                declared = {n: declared_point(job, config) for n, job in zip(names, jobs)}
                _, entry = write_manifest(self._sweep_dir, names, self._group, launcher, declared, self.plan)
                self._launch_id = int(entry["id"])
                line = launch_line(entry)
                if line:
                    self._print(f"[sweep {self._group}] {line}")
        except _NoManifest:
            pass
        except (OSError, RunFolderError) as e:
            self._print(
                f"[sweep {self._group}] cannot write {SWEEP_MANIFEST_FILE} ({e}); gkd-analyze will fall "
                "back to multirun.yaml"
            )
        before = self.statuses()
        self._completed_before = {p.name for p in before if p.status == "completed"}
        failed = sum(p.status == "failed" for p in before)
        todo = len(before) - len(self._completed_before)
        self._print(
            f"[sweep {self._group}] {len(before)} points in {self._sweep_dir}: "
            f"{len(self._completed_before)} completed earlier (skipped), {failed} failed earlier (rerun), "
            f"{todo} to run"
        )
        self._stop.clear()
        self._started = time.monotonic()
        self._started_wall = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._reported = False
        atexit.register(self._report)
        if self.progress_interval_s > 0:
            self._thread = threading.Thread(target=self._progress_loop, name="sweep-progress", daemon=True)
            self._thread.start()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """What the point's folder held before the point ran (the process that runs the point)."""
        run_dir = Path(str(config.hydra.runtime.output_dir))
        self._at_start[run_dir] = (holds_a_run(run_dir), _summary_bytes(run_dir))

    def _owns(self, run_dir: Path, ret: Any) -> bool:
        """Whether this point's attempt owns ``run_dir`` (see the module docstring): the folder held no other
        attempt's run when the point started, or the point started a run there. A point gkd-train refused with a
        config error (exit 2) started nothing, whatever the folder's summary.json does meanwhile (a live run of
        another sweep may be writing it)."""
        held, summary = self._at_start.pop(run_dir, (False, None))
        if not held:
            return True
        if isinstance(ret, PointFailed) and ret.code == EXIT_CONFIG:
            return False
        return _summary_bytes(run_dir) != summary

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Record Hydra's verdict for this point in its ``.hydra/`` folder when the point owns the folder,
        replacing an earlier attempt's; a refused or invalid point whose folder holds another attempt's run owns
        nothing there: the refusal is printed and logged in the sweep folder instead (:data:`REFUSED_LOG`)."""
        run_dir = Path(str(config.hydra.runtime.output_dir))
        self._group = self._group or str((config.get("tracking") or {}).get("wandb", {}).get("group") or "")
        if job_return.status == JobStatus.COMPLETED and not run_dir.exists():
            self._at_start.pop(run_dir, None)
            return  # the job left nothing and removed its folder (a dry run): no verdict file brings it back
        out = run_dir / HYDRA_DIR
        error, status = None, job_return.status.name
        ret = getattr(job_return, "_return_value", None)
        if job_return.status == JobStatus.FAILED:
            exc = ret
            error = f"{type(exc).__name__}: {exc}"
        elif isinstance(ret, PointFailed):  # gkd-train reported its failure in one line
            if ret.refused:
                self._at_start.pop(run_dir, None)
                self._refused(run_dir, ret.error)
                return
            status, error = "FAILED", ret.error
        if not self._owns(run_dir, ret):
            if status != "COMPLETED":  # invalid before it started: another attempt's folder, not this point's
                self._refused(run_dir, error or status)
            return  # completed without starting a run (skipped): the earlier attempt's verdict stands
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / STATUS_FILE).write_text(json.dumps({"status": status, "error": error}))
        except OSError:
            pass
        changed = code_change_line(run_dir, run_dir.parent)  # a `git pull` mid-sweep (issue 48, item 10)
        if changed:
            self._print(f"[sweep {self._group}] warning: {changed}")

    def _refused(self, run_dir: Path, error: str) -> None:
        """A refused point: one line on the console and in ``<sweep folder>/refused_points.log``, tagged with
        this multirun's :attr:`launch_tag` (two sweeps of one group at once each read back only their own)."""
        line = f"refused: {run_dir.name}: {error}"
        self._print(f"[sweep {self._group}] {line}")
        try:
            with open(run_dir.parent / REFUSED_LOG, "a") as f:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime())
                f.write(f"{stamp}[launch {self.launch_tag}] {line}\n")
        except OSError:
            pass

    def refusals(self) -> list[str]:
        """Lines of :data:`REFUSED_LOG` written by this multirun (its launch tag; the worker processes of a
        submitit launcher carry the same tag), without the tag."""
        try:
            lines = (self._sweep_dir / REFUSED_LOG).read_text().splitlines()
        except OSError:
            return []
        tag = f"[launch {self.launch_tag}] "
        return [ln[:21] + ln[21 + len(tag) :] for ln in lines if ln[21 : 21 + len(tag)] == tag]

    def refused_points(self) -> dict[str, str]:
        """Point name -> its refusal (the error's last line), from :meth:`refusals`; a point refused because
        another launch's run held its folder, and which completed there by now, is not refused: it trained once,
        by the other launch (:meth:`statuses` shows it completed)."""
        out = {}
        for line in self.refusals():
            name, _, error = line.split(" ", 1)[-1].removeprefix("refused: ").partition(": ")
            if "Busy" in error.split(":", 1)[0] and read_point(name, self._sweep_dir / name).status == "completed":
                continue
            out[name] = error.strip().splitlines()[-1][:200] if error.strip() else "refused"
        return out

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """The summary table; the sweep exits 2 when any point had an invalid config or was refused (its folder
        holds another config's completed run, or a live run: as a single ``gkd-train`` does), otherwise 1 when any
        point failed, was interrupted or is incomplete (each was one line already)."""
        self._report()
        if (config.get("run") or {}).get("dry_run", False) and self._sweep_dir is not None:
            from gkd_harness.harness.launcher.leftovers import remove_dry_sweep_folder  # a dry run leaves no folder

            kept = getattr(self, "_kept_multirun", None)
            if kept is not None:  # the folder holds an earlier sweep: its multirun.yaml as it was
                try:
                    (self._sweep_dir / MULTIRUN_FILE).write_bytes(kept)
                except OSError:
                    pass
            else:
                remove_dry_sweep_folder(self._sweep_dir, (MULTIRUN_FILE, SWEEP_MANIFEST_FILE))
        refused = self.refusals()
        if refused:
            self._print(f"[sweep {self._group}] {len(refused)} points refused (see {self._sweep_dir / REFUSED_LOG})")
        points = self.statuses()
        invalid = [
            p for p in points if p.status in ("failed", "refused") and str(p.error or "").startswith("ConfigError")
        ]
        if invalid:  # gkd-train's exit-code contract holds for a sweep too: a config error is 2, not "failed"
            self._print(
                f"[sweep {self._group}] {len(invalid)} of {len(points)} points have an invalid config "
                f"(first: {str(invalid[0].error).split(': ', 1)[-1]})"
            )
            sys.exit(EXIT_CONFIG)
        if any(p.status == "refused" for p in points):  # as gkd-train refusing one folder (README: exit 2)
            sys.exit(EXIT_CONFIG)
        if any(p.status in ("failed", "incomplete", "interrupted") for p in points):
            sys.exit(1)

    # -- progress and final report
    def snapshot(self) -> Snapshot:
        points = self.statuses()
        return Snapshot(
            label=f"sweep {self._group}",
            total=len(points),
            done=sum(p.status == "completed" for p in points),
            failed=sum(p.status == "failed" for p in points),
            running=tuple(Running(p.name, p.step, p.max_steps) for p in points if p.status == "running"),
        )

    def progress_line(self) -> str:
        """The progress as one look at the folders shows it (an ETA needs two looks: --:--)."""
        return render(self.snapshot(), time.monotonic() - self._started, None)

    def _progress_loop(self) -> None:
        display = ProgressDisplay(stream=self.stream or sys.stdout)
        display.started = self._started
        try:
            while not self._stop.wait(self.progress_interval_s):
                display.update(self.snapshot())
        finally:
            display.close()

    def _report(self) -> None:
        if self._discovered:
            self.statuses()  # the run folders made so far
        if self._reported or not self._points:
            return
        self._reported = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        points = self.statuses()
        for p in points:  # nothing runs any more: a point still marked running died without a verdict
            if p.status == "running":
                p.status = "incomplete"
        order = ("completed", "failed", "interrupted", "refused", "incomplete", "missing")
        counts = {s: sum(p.status == s for p in points) for s in order}
        for p in points:  # a status this table does not know still counts (issue 40: an interrupted point)
            if p.status not in counts:
                counts[p.status] = sum(q.status == p.status for q in points)
        self._print(
            f"[sweep {self._group}] summary, {len(points)} points: "
            + ", ".join(f"{v} {k}" for k, v in counts.items() if v or k in ("completed", "failed"))
            + f"  ({self._sweep_dir})"
        )
        for p in points:
            self._print(format_point(p, resumed=p.name in self._completed_before))
