"""One owner at a time (gkd_harness.harness.store.lock): real processes hold and lose locks (a SIGKILLed child leaves a stale
lock), another host's lock stays busy until its heartbeat stops, a reused pid does not keep a lock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from gkd_harness.harness.contract import LOCK_FILE
from gkd_harness.harness.store.lock import RunFolderBusy, RunLock, read_lock
from tests.harness.store.run_folder_helpers import start_holder, stop


# ------------------------------------------------------------------------------------------------ one owner
def test_second_owner_is_refused_at_once_naming_folder_and_owner(tmp_path):
    run = tmp_path / "run"
    holder = start_holder(run)
    try:
        t0 = time.monotonic()
        with pytest.raises(RunFolderBusy) as err:
            RunLock(run).acquire()
        assert time.monotonic() - t0 < 1.0
        msg = str(err.value)
        assert "\n" not in msg and str(run) in msg
        assert f"pid {holder.pid}" in msg and socket.gethostname() in msg and "since 20" in msg
        assert err.value.owner["pid"] == holder.pid
        assert read_lock(run)["pid"] == holder.pid  # the owner's lock is untouched
    finally:
        stop(holder)


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, caplog):
    run = tmp_path / "run"
    holder = start_holder(run)
    holder.send_signal(signal.SIGKILL)  # dies without releasing: what a killed gkd-train leaves
    holder.wait()
    assert read_lock(run)["pid"] == holder.pid
    lock = RunLock(run, heartbeat_s=0)
    with caplog.at_level("WARNING", logger="gkd_harness.run_folder"):
        note = lock.acquire()
    try:
        assert note and f"pid {holder.pid}" in note and "stale" in note and str(run) in note
        assert note in caplog.text
        assert read_lock(run)["pid"] == os.getpid() and lock.held
    finally:
        lock.release()
    assert not (run / LOCK_FILE).exists()


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    """The recorded pid is alive but is another process (its start time differs): the lock is stale."""
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (run / LOCK_FILE).write_text(
            json.dumps(
                {
                    "pid": sleeper.pid,
                    "host": socket.gethostname(),
                    "started_at": "2020-01-01T00:00:00+00:00",
                    "pid_start": "1",
                }
            )
        )
        with RunLock(run, heartbeat_s=0) as lock:
            assert lock.note and f"pid {sleeper.pid}" in lock.note
    finally:
        stop(sleeper)


def test_lock_of_another_host_is_busy_until_its_heartbeat_stops(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    other = {"pid": 1, "host": "some-other-node", "started_at": "2026-01-01T00:00:00+00:00", "token": "x"}
    (run / LOCK_FILE).write_text(json.dumps(other))
    with pytest.raises(RunFolderBusy, match="some-other-node"):
        RunLock(run, stale_after_s=600).acquire()
    old = time.time() - 3600
    os.utime(run / LOCK_FILE, (old, old))
    with RunLock(run, heartbeat_s=0, stale_after_s=600) as lock:
        assert "some-other-node" in lock.note and "heartbeat stopped" in lock.note


def test_heartbeat_refreshes_the_lock_and_release_removes_only_its_own(tmp_path):
    run = tmp_path / "run"
    lock = RunLock(run, heartbeat_s=0.05)
    assert lock.acquire() is None
    old = time.time() - 3600
    os.utime(run / LOCK_FILE, (old, old))
    time.sleep(0.5)
    assert time.time() - (run / LOCK_FILE).stat().st_mtime < 5
    # someone took the lock over (e.g. after this process looked dead): release must leave theirs alone
    theirs = {"pid": 999999, "host": socket.gethostname(), "started_at": "x", "token": "theirs"}
    (run / LOCK_FILE).write_text(json.dumps(theirs))
    lock.release()
    assert read_lock(run)["token"] == "theirs"
