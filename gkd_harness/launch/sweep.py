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
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gkd_harness.harness.contract import METRICS_FILE, SUMMARY_FILE, SWEEP_MANIFEST_FILE
from gkd_harness.harness.launcher.cli import EXIT_CONFIG, PointFailed
from gkd_harness.harness.launcher.progress import ProgressDisplay, Running, Snapshot, render
from gkd_harness.harness.launcher.sweep_points import point_name, sweep_points
from gkd_harness.harness.store.metrics_io import tail_step

STATUS_FILE = "job_return.json"
REFUSED_LOG = "refused_points.log"


def write_manifest(sweep_dir: Path, names: list[str], group: str, launcher: str) -> Path:
    """Write ``sweep_manifest.json`` (planned point names, in launch order, plus those of an earlier manifest
    in the same folder) atomically; returns its path."""
    import os

    path = Path(sweep_dir) / SWEEP_MANIFEST_FILE
    earlier = _read_json(path) or {}
    planned = list(dict.fromkeys([str(n) for n in (earlier.get("points") or [])] + list(names)))
    body = {
        "group": group,
        "launcher": launcher,
        "points": planned,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)
    return path


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
        if p.name == ".hydra" and p.is_dir():
            if any(q.name != STATUS_FILE for q in p.iterdir()):
                return True
        elif p.is_dir() or p.is_symlink() or p.stat().st_size > 0:
            return True
    return False


def _summary_bytes(run_dir: Path) -> bytes | None:
    try:
        return (Path(run_dir) / SUMMARY_FILE).read_bytes()
    except OSError:
        return None


def read_point(name: str, run_dir: Path) -> PointStatus:
    """Status of one point from its run folder (see the module docstring for the order of trust)."""
    point = PointStatus(name=name, run_dir=run_dir)
    summary = _read_json(run_dir / SUMMARY_FILE)
    verdict = _read_json(run_dir / ".hydra" / STATUS_FILE)
    if summary:
        point.status = str(summary.get("status", "missing"))
        point.error = summary.get("error")
        point.wall_s = summary.get("wall_s")
        point.max_steps = (summary.get("config") or {}).get("run.max_steps")
        point.step = summary.get("last_step")
    if verdict and verdict.get("status") == "FAILED":
        point.status = "failed"
        point.error = point.error or verdict.get("error")
    step = tail_step(run_dir / METRICS_FILE)
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

    def __init__(self, progress_interval_s: float = 30, stream: TextIO | None = None) -> None:
        self.progress_interval_s = float(progress_interval_s)
        self.stream = stream
        self._points: list[tuple[str, Path]] = []
        self._completed_before: set[str] = set()
        self._group = ""
        self._sweep_dir = Path(".")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._reported = False
        #: run folder -> (held another attempt's run at on_job_start, its summary.json bytes then)
        self._at_start: dict[Path, tuple[bool, bytes | None]] = {}

    # submitit launchers pickle the Hydra context (callbacks included) into every job: ship settings only
    def __getstate__(self) -> dict:
        return {"progress_interval_s": self.progress_interval_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # -- printing
    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def statuses(self) -> list[PointStatus]:
        """Each point's status read from its folder; a point refused in this multirun is ``refused``, with the
        refusal as its error (its folder holds another attempt's run, which says nothing about this one)."""
        refused = self.refused_points()
        points = [read_point(name, run_dir) for name, run_dir in self._points]
        for p in points:
            if p.name in refused:
                p.status, p.error = "refused", refused[p.name]
        return points

    # -- Hydra hooks
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._sweep_dir = Path(str(config.hydra.sweep.dir))
        self._group = str(config.tracking.wandb.group or "")
        try:
            names = [point_name(job, config) for job in sweep_points(config)]
        except Exception as e:  # noqa: BLE001 - a sweeper/override the basic expansion does not know
            self._print(
                f"[sweep {self._group}] cannot list the points ({type(e).__name__}: {e}); "
                "no resume summary, progress or final table"
            )
            return
        self._points = [(n, self._sweep_dir / n) for n in names]
        try:
            launcher = str((config.hydra.get("launcher") or {}).get("_target_") or "basic")
            write_manifest(self._sweep_dir, names, self._group, launcher)
        except OSError as e:
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
        out = run_dir / ".hydra"
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

    def _refused(self, run_dir: Path, error: str) -> None:
        """A refused point: one line on the console and in ``<sweep folder>/refused_points.log``."""
        line = f"refused: {run_dir.name}: {error}"
        self._print(f"[sweep {self._group}] {line}")
        try:
            with open(run_dir.parent / REFUSED_LOG, "a") as f:
                f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + line + "\n")
        except OSError:
            pass

    def refusals(self) -> list[str]:
        """Lines of :data:`REFUSED_LOG` written since this multirun started (any process wrote them)."""
        try:
            lines = (self._sweep_dir / REFUSED_LOG).read_text().splitlines()
        except OSError:
            return []
        since = getattr(self, "_started_wall", "")
        return [ln for ln in lines if ln[:20] >= since]

    def refused_points(self) -> dict[str, str]:
        """Point name -> its refusal (the error's last line), from :meth:`refusals`."""
        out = {}
        for line in self.refusals():
            name, _, error = line.split(" ", 1)[-1].removeprefix("refused: ").partition(": ")
            out[name] = error.strip().splitlines()[-1][:200] if error.strip() else "refused"
        return out

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """The summary table; the sweep exits 2 when any point had an invalid config (as a single ``gkd-train`` does),
        otherwise 1 when any point failed or was refused (each was one line already)."""
        self._report()
        if (config.get("run") or {}).get("dry_run", False) and self._sweep_dir is not None:
            from gkd_harness.harness.launcher.leftovers import remove_dry_sweep_folder  # a dry run leaves no folder

            remove_dry_sweep_folder(self._sweep_dir, ("multirun.yaml", SWEEP_MANIFEST_FILE))
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
                f"(first: {invalid[0].error.split(': ', 1)[-1]})"
            )
            sys.exit(EXIT_CONFIG)
        if refused or any(p.status in ("failed", "incomplete") for p in points):
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
        counts = {
            s: sum(p.status == s for p in points) for s in ("completed", "failed", "refused", "incomplete", "missing")
        }
        self._print(
            f"[sweep {self._group}] summary, {len(points)} points: "
            + ", ".join(f"{v} {k}" for k, v in counts.items() if v or k in ("completed", "failed"))
            + f"  ({self._sweep_dir})"
        )
        for p in points:
            self._print(format_point(p, resumed=p.name in self._completed_before))
