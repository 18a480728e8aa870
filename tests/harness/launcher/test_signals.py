"""Preemption as a first-class event, with real signals to a real run: SIGTERM to ``gkd-train`` stops ms-swift's
process group, summary.json says ``interrupted`` with the signal and the last step, the lock is released, the exit
code is 128 + 15 with one line and no traceback; a requeued SLURM job takes over its own lock at once.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gkd_harness.harness.contract import LOCK_FILE
from gkd_harness.harness.launcher.process import Interrupted, stop_signals
from gkd_harness.harness.store.lock import RunFolderBusy, RunLock, pid_alive, read_lock
from gkd_harness.harness.store.metrics_io import read_metrics

JOB = "4242"


def _stale_lock_of(run_dir: Path, host: str, job, restart=None) -> None:
    """A fresh lock as a run of SLURM job ``job`` on ``host`` leaves it (a node that died before releasing it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK_FILE).write_text(
        json.dumps(
            {
                "pid": 1,
                "host": host,
                "started_at": "2026-01-01T00:00:00+00:00",
                "pid_start": "1",
                "token": "t",
                "slurm_job_id": job,
                "slurm_restart_count": restart,
            }
        )
    )


def test_requeued_job_takes_over_its_own_lock_from_another_host(tmp_path, monkeypatch):
    _stale_lock_of(tmp_path, "node-a", JOB)
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    lock = RunLock(tmp_path, heartbeat_s=0)
    note = lock.acquire()
    assert note and "requeued" in note and read_lock(tmp_path)["host"] == socket.gethostname()
    lock.release()


def test_another_jobs_fresh_lock_of_another_host_is_still_refused(tmp_path, monkeypatch):
    _stale_lock_of(tmp_path, "node-a", "999")
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    with pytest.raises(RunFolderBusy, match="another host"):
        RunLock(tmp_path, heartbeat_s=0).acquire()


def test_same_job_same_host_takes_over_only_after_a_requeue(tmp_path, monkeypatch):
    host = socket.gethostname()
    monkeypatch.setenv("SLURM_JOB_ID", JOB)
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"pid": os.getpid(), "host": host, "pid_start": None, "token": "t", "slurm_job_id": JOB})
    )
    with pytest.raises(RunFolderBusy):  # a live process of this same job (e.g. two steps of one allocation)
        RunLock(tmp_path, heartbeat_s=0).acquire()
    (tmp_path / LOCK_FILE).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "host": host,
                "pid_start": None,
                "token": "t",
                "slurm_job_id": JOB,
                "slurm_restart_count": "0",
            }
        )
    )
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    lock = RunLock(tmp_path, heartbeat_s=0)
    assert "requeued" in lock.acquire()
    lock.release()


def test_stop_signals_raise_interrupted_once_and_restore_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as e:
        with stop_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert e.value.exit_code == 143 and e.value.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_sigterm_to_a_real_run_is_recorded_as_interrupted_and_releases_the_lock(embedded_cache, tmp_path):
    root = tmp_path / "out"
    env = {
        **os.environ,
        "GKD_HARNESS_CACHE": str(embedded_cache),
        "GKD_OUTPUT_ROOT": str(root),
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "SLURM_JOB_ID": JOB,
    }
    for k in ("SLURM_NODEID", "SLURM_PROCID", "SLURM_NNODES", "NODE_RANK"):
        env.pop(k, None)
    out = root / "sig"
    args = [
        sys.executable,
        "-m",
        "gkd_harness.harness.launcher.cli",
        f"run.output_dir={out}",
        "run.max_steps=200",
        "loss=fp32",
        "tracking.wandb.mode=offline",
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and not read_metrics(out / "metrics.jsonl"):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        train_pid = json.loads((out / "summary.json").read_text())["train_pid"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("gkd-train:")]
    assert lines == [
        "gkd-train: interrupted by SIGTERM (summary.json says interrupted; rerun the same command to "
        "restart, or add run.resume=true)"
    ], err[-2000:]
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["last_step"] == steps[-1] >= 1 and summary["ended_at"]
    assert not (out / LOCK_FILE).exists()
    assert not pid_alive(train_pid), "ms-swift's rank outlived gkd-train"

    # the requeue: SLURM restarts job 4242 on another node, whose lock the dead node left fresh behind. The rerun
    # takes the lock over at once; it then stops at the attempt decision (a resume of another run.max_steps is
    # refused, exit 2) so that no second training runs: the takeover, not the training, is under test here.
    _stale_lock_of(out, "node-a", JOB)
    again = subprocess.run(
        [*args, "run.max_steps=1", "run.resume=true"], env=env, capture_output=True, text=True, timeout=600
    )
    said = again.stderr + again.stdout
    assert "requeued" in said and "in use by" not in said, said[-2000:]
    assert again.returncode == 2 and "run.max_steps" in said, said[-2000:]
    assert not (out / LOCK_FILE).exists()
