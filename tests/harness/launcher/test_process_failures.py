"""ms-swift's process failing: one line that says why (issue 32, items 3 and 4), with real child processes.

Before the fix a rank killed by SIGKILL (what the kernel's OOM killer sends) read "ms-swift (swift rlhf) failed with
exit code 247: Train: 25%|██▌ 3/12…": ms-swift's CLI relays its child's -9 as exit code 247, and the last line of
the log was a progress bar. And a swift.log that could not be written (a full disk) ended in an OSError raised when
the buffered log was closed, which masked the intended one-line error with a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gkd_harness.harness.launcher.process import TrainingFailed, _failure, _run_subprocess, killing_signal
from tests.conftest import entry_point

#: a rank that prints a progress bar, then is killed by SIGKILL (as by the OOM killer)
KILLED_RANK = (
    "import os, signal, sys; print('Train: 25%|##5       | 3/12', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
)
#: ms-swift's CLI: runs the rank as a child and exits with its return code (-9 -> 247)
RELAYING_CLI = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {KILLED_RANK!r}]).returncode)"


def _run(tmp_path: Path, code: str) -> TrainingFailed:
    argv = [sys.executable, "-c", code]
    log = tmp_path / "swift.log"
    rc = _run_subprocess(argv, dict(os.environ), log, stream=False)
    return _failure(argv, rc, log)


@pytest.mark.parametrize("code,rc_text", [(KILLED_RANK, ""), (RELAYING_CLI, " (exit code 247)")])
def test_a_rank_killed_by_sigkill_is_named_with_its_signal(tmp_path, code, rc_text):
    msg = str(_run(tmp_path, code))
    assert "\n" not in msg
    assert f"a process killed by SIGKILL{rc_text}; out of memory?" in msg, msg
    assert "Train: 25%" not in msg  # the progress bar is not the reason
    assert str(tmp_path / "swift.log") in msg


def test_signals_from_exit_codes_and_torchrun_logs(tmp_path):
    assert killing_signal(-9) == signal.SIGKILL and killing_signal(247) == signal.SIGKILL
    assert killing_signal(137) == signal.SIGKILL and killing_signal(143) == signal.SIGTERM
    assert killing_signal(1) is None and killing_signal(0) is None
    log = tmp_path / "swift.log"
    log.write_text(
        "[rank1]: Train: 10%\nexitcode  : -9 (pid: 4242)\ntorch.distributed.elastic.multiprocessing."
        "errors.ChildFailedError:\n"
    )
    msg = str(_failure(["torchrun", "x"], 1, log))
    assert "a process killed by SIGKILL (exit code 1); out of memory?" in msg, msg
    log.write_text("Traceback (most recent call last):\nValueError: bad value\n")
    assert (
        str(_failure(["swift", "rlhf"], 1, log))
        == f"ms-swift (swift rlhf) failed with exit code 1: ValueError: bad value (log: {log})"
    )
    msg = str(_failure(["swift", "rlhf"], -15, log))
    assert "killed by SIGTERM; its last error: ValueError: bad value" in msg and "out of memory" not in msg


def test_a_log_that_cannot_be_written_gives_one_line_not_the_close_error(tmp_path):
    """/dev/full as swift.log: every write fails with ENOSPC, at once and again at close."""
    log = tmp_path / "swift.log"
    log.symlink_to("/dev/full")
    with pytest.raises(TrainingFailed) as err:
        _run_subprocess([sys.executable, "-c", "print('x' * 100, flush=True)"], dict(os.environ), log, stream=False)
    assert str(err.value) == f"cannot write {log}: No space left on device (ENOSPC); ms-swift was stopped"


@pytest.mark.slow
def test_gkd_train_names_a_sigkilled_rank(tmp_path):
    """The real thing: a tiny run whose rank (summary.json's train_pid) is SIGKILLed while it trains."""
    import json

    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "GKD_OUTPUT_ROOT": str(tmp_path / "out"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [entry_point("gkd-train"), "run.max_steps=2000", "tracking=disabled"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = None
        deadline = time.monotonic() + 300
        while pid is None and time.monotonic() < deadline and proc.poll() is None:
            for path in (tmp_path / "out").rglob("summary.json"):
                try:
                    pid = json.loads(path.read_text()).get("train_pid")
                except (OSError, ValueError):
                    pass
            time.sleep(0.5)
        assert pid, "the rank never reported"
        metrics = path.parent / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None and not metrics.exists():
            time.sleep(0.5)
        os.kill(int(pid), signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("gkd-train: run failed: ms-swift (swift rlhf) failed: a process killed by SIGKILL"), last
    assert "out of memory?" in last and "Traceback" not in err
