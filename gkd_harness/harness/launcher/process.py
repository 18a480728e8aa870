"""Running ms-swift's own CLI as a child process: its output to the run's log (and the console when streaming),
a live progress line for a single run, and one-line failures naming the rank's own error."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Union

from gkd_harness.harness.launcher.plan import LaunchPlan

log = logging.getLogger("gkd_harness.train")


class TrainingFailed(RuntimeError):
    """ms-swift's process failed, or the run did not meet the harness's own checks."""


#: The signals that end a run as ``interrupted``: SLURM's preemption / time-out (SIGTERM), a lost terminal
#: (SIGHUP) and Ctrl-C (SIGINT).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
#: How long ms-swift's process group gets to stop after SIGTERM before it is killed.
STOP_GRACE_S = 30.0
#: What ``signal.signal`` takes and returns.
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


class Interrupted(BaseException):
    """``gkd-train`` received a stop signal (a BaseException, like KeyboardInterrupt, so that no ``except
    Exception`` swallows it). ``exit_code`` is the shell's convention, 128 + the signal's number."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.signal_name = signal.Signals(self.signum).name
        super().__init__(f"interrupted by {self.signal_name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class stop_signals:
    """``with stop_signals(): ...``: SIGTERM / SIGHUP / SIGINT raise :class:`Interrupted` in the main thread
    (once: a second signal while the run is being stopped is ignored); the previous handlers come back on exit.
    Outside the main thread it does nothing."""

    def __init__(self):
        self._old: Dict[int, _Handler] = {}
        self._fired = False

    def _handle(self, signum, _frame) -> None:
        if self._fired:
            return
        self._fired = True
        raise Interrupted(signum)

    def __enter__(self) -> "stop_signals":
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the child and every process it started (its own process group: torchrun and the ranks): SIGTERM,
    then SIGKILL after ``grace_s``."""

    def kill(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    if proc.poll() is None:
        kill(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    kill(signal.SIGKILL)  # whatever of the group is left (ranks outliving torchrun)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # The ranks are grandchildren: SIGKILL reaches them at once, but they leave the process table only when they
    # are gone; return once no member of the group still runs, so nothing of ms-swift outlives gkd-train.
    deadline = time.monotonic() + grace_s
    while _group_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _group_running(pgid: int) -> bool:
    """Does any process of process group ``pgid`` still run (zombies, which only wait to be reaped, do not count)?"""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _last_error_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    # Wrappers' errors (torchrun's ChildFailedError, ms-swift's CalledProcessError) only say that a rank died;
    # the rank's own error, printed before them, is the one worth reporting.
    wrappers = ("ChildFailedError", "CalledProcessError")
    # torchrun prefixes each rank's lines with "[rankN]: " when there are several
    lines = [re.sub(r"^\s*\[rank\d+\]:\s?", "", line) for line in lines]
    errors = [
        line.strip()
        for line in lines
        if re.match(r"^\s*([A-Za-z_][\w.]*(Error|Exception)|AssertionError|KeyboardInterrupt)\b", line)
    ]
    for line in reversed(errors):
        if not any(w in line for w in wrappers):
            return line
    if errors:
        return errors[-1]
    return lines[-1].strip() if lines else ""


def _run_subprocess(argv: List[str], env: Dict[str, str], log_path: Path, stream: bool) -> int:
    """Run ms-swift, writing its output to ``log_path`` (and the console when ``stream``); returns the exit code."""
    # The CLI of the interpreter's own environment (e.g. .venv-vllm/bin/swift), even when that bin is not on PATH.
    local = Path(sys.executable).parent / argv[0]
    if local.is_file() and os.access(local, os.X_OK):
        argv = [str(local), *argv[1:]]
    try:
        # unbuffered: a write that fails (a full disk) fails here, never later in close()
        logf = open(log_path, "ab", buffering=0)
    except OSError as e:
        raise TrainingFailed(f"cannot write {log_path}: {_cause(e)}") from None
    try:
        # its own session and process group: a stop signal to gkd-train stops the whole tree (stop_group), and a
        # terminal's Ctrl-C reaches gkd-train only, which then stops ms-swift in order
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        out = proc.stdout
        assert out is not None  # stdout=PIPE
        try:
            for chunk in iter(out.readline, b""):
                logf.write(chunk)
                if stream:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
        except OSError as e:  # the log cannot be written (a full disk): one line, ms-swift stopped
            stop_group(proc)
            raise TrainingFailed(f"cannot write {log_path}: {_cause(e)}; ms-swift was stopped") from None
        except BaseException:
            stop_group(proc)
            raise
        return proc.wait()
    finally:
        try:
            logf.close()
        except OSError:  # nothing is buffered; a failing close must not mask the run's own outcome
            pass


def _cause(e: OSError) -> str:
    """``No space left on device (ENOSPC)``."""
    import errno

    code = errno.errorcode.get(e.errno or 0, "")
    return f"{e.strerror or e} ({code})" if code else str(e.strerror or e)


def killing_signal(rc: int) -> Optional[signal.Signals]:
    """The signal that ended a process with exit status ``rc``, where the status says so: ``-N`` (Popen: killed by
    signal N), ``128 + N`` (a shell or torchrun relaying a child killed by N) or ``256 - N`` (a Python parent that
    exits with its child's negative return code: ms-swift's CLI relays a SIGKILLed rank as 247). None otherwise."""
    for n in (-rc, rc - 128, 256 - rc):
        if 0 < n < 65:
            try:
                return signal.Signals(n)
            except ValueError:
                continue
    return None


#: torchrun's report of a rank ended by a signal ("exitcode  : -9 (pid: 123)", "Signal 9 (SIGKILL) received by PID")
_TORCHRUN_SIGNAL_RE = re.compile(r"exitcode\s*:\s*-(\d+)\b|Signal (\d+) \(SIG\w+\) received by PID")


def _signal_in_log(log_path: Path) -> Optional[signal.Signals]:
    """The signal torchrun says ended a rank (it then exits 1 itself), None when it says none."""
    try:
        text = log_path.read_text(errors="replace")[-65536:]
    except OSError:
        return None
    found = _TORCHRUN_SIGNAL_RE.findall(text)
    if not found:
        return None
    n = int(next(x for x in found[-1] if x))
    return killing_signal(-n)


def _failure(argv: List[str], rc: int, log_path: Path) -> TrainingFailed:
    """One line: what ended ms-swift (a signal by name, with "out of memory?" for SIGKILL: the kernel's OOM killer
    sends it), the rank's own error line, the log."""
    sig = killing_signal(rc) if rc < 0 or rc > 128 else _signal_in_log(log_path)
    last = _last_error_line(log_path)
    if sig is None:
        return TrainingFailed(
            f"ms-swift ({Path(argv[0]).name} {argv[1]}) failed with exit code {rc}: {last} (log: {log_path})"
        )
    code = "" if rc < 0 else f" (exit code {rc})"
    oom = "; out of memory? (the kernel's OOM killer sends SIGKILL: see dmesg)" if sig == signal.SIGKILL else ""
    if last and not re.match(r"^\s*[A-Za-z_][\w.]*(Error|Exception)\b", last):
        last = ""  # a progress bar or a warning is not why it died
    detail = f"; its last error: {last}" if last else ""
    how = f"a process killed by {sig.name}{code}{oom}{detail}"
    return TrainingFailed(f"ms-swift ({Path(argv[0]).name} {argv[1]}) failed: {how} (log: {log_path})")


def execute(plan: LaunchPlan, log_path: Path, stream: bool, progress_of: Optional[tuple] = None) -> None:
    """Run the plan; ms-swift's output goes to ``log_path`` (and the console when ``stream``). ``progress_of``
    (label, metrics.jsonl, max_steps) shows a live progress line (a single run; a sweep passes None)."""
    import threading

    log.debug("running: " + " ".join(plan.argv))
    stop = threading.Event()
    watcher = None
    if progress_of is not None and not stream:
        watcher = threading.Thread(target=_show_progress, args=(*progress_of, stop), daemon=True)
        watcher.start()
    try:
        rc = _run_subprocess(plan.argv, plan.process_env(os.environ), log_path, stream)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(timeout=5)
    if rc != 0:
        raise _failure(plan.argv, rc, log_path)


def _show_progress(label: str, metrics: Path, max_steps: int, stop, every_s: float = 2.0) -> None:
    """A single run's live progress line, fed from its metrics.jsonl until ``stop`` is set."""
    from gkd_harness.harness.launcher.progress import ProgressDisplay, Running, Snapshot
    from gkd_harness.harness.store.metrics_io import tail_step

    display = ProgressDisplay()

    def snapshot(final: bool) -> Snapshot:
        step = tail_step(metrics) or 0
        finished = final and step >= max_steps
        return Snapshot(
            label=f"run {label}",
            total=1,
            done=int(finished),
            failed=int(final and not finished),
            running=() if final else (Running(label, step, max_steps),),
        )

    try:
        while not stop.wait(every_s):
            display.update(snapshot(False))
        display.update(snapshot(True))
    finally:
        display.close()
