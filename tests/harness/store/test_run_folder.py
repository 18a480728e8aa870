"""The run folder (gkd_harness.harness.store.run_folder): only the lock's owner moves files, disk and permission errors are one
line naming the file and run.output_dir, summary.json's lifecycle, no secret in any file it writes.

Real parts throughout: real processes hold locks, a real full tmpfs and a real read-only mount (root only; skipped
otherwise) plus /dev/full for the no-root case.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.secrets import REDACTED
from gkd_harness.harness.contract import ARCHIVE_DIR
from gkd_harness.harness.store.files import RunFolderError
from gkd_harness.harness.store.fingerprint import config_fingerprint
from gkd_harness.harness.store.lock import RunLock
from gkd_harness.harness.store.metrics_io import MetricsWriter, read_metrics
from gkd_harness.harness.store.run_folder import RunFolder
from tests.harness.store.run_folder_helpers import FLAT, fill, leftover_tmp, mount_tmpfs, start_holder, stop


def test_a_live_runs_files_never_move(tmp_path):
    """Issue 12 item 3: a second gkd-train moved the live run's files to previous_attempts/1."""
    run = tmp_path / "run"
    holder = start_holder(run)
    try:
        folder = RunFolder(run)
        folder.start_summary("first", None, FLAT)
        MetricsWriter(folder.metrics_path).write({"step": 1})
        with pytest.raises(RunFolderError, match="does not hold its lock"):
            folder.archive_previous_attempt()
        assert folder.summary_path.is_file() and folder.metrics_path.is_file()
        assert not (run / ARCHIVE_DIR).exists()
    finally:
        stop(holder)


def test_the_owner_archives_an_earlier_attempt(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    folder.start_summary("r", None, FLAT)
    MetricsWriter(folder.metrics_path).write({"step": 1})
    with folder.lock():
        archived = folder.archive_previous_attempt(reason="run.overwrite=true")
        assert archived == tmp_path / "run" / ARCHIVE_DIR / "1"
        assert (archived / "metrics.jsonl").is_file() and (archived / "summary.json").is_file()
        assert json.loads((archived / "archived.json").read_text())["reason"] == "run.overwrite=true"
        assert not folder.metrics_path.exists() and folder.read_summary() is None
        assert folder.archive_previous_attempt() is None  # nothing left to move
    assert not folder.lock_path.exists()


# ------------------------------------------------------------------------------------------------ disk errors
def test_full_disk_gives_one_clear_error_records_failed_and_leaves_no_tmp(small_fs):
    """Issue 12 item 5: on a full disk summary.json stayed "running" and an empty .summary.json.<pid>.tmp stayed."""
    folder = RunFolder(small_fs / "run").create()
    folder.start_summary("r", None, FLAT)
    writer = MetricsWriter(folder.metrics_path)
    writer.write({"step": 1, "train/loss": 1.0})
    filler = fill(small_fs)

    with pytest.raises(RunFolderError) as err:
        folder.update_summary(dtypes_seen={"student": "float32"}, note="x" * 5000)
    msg = str(err.value)
    assert "\n" not in msg and "summary.json" in msg and str(folder.path) in msg and "ENOSPC" in msg
    assert err.value.path == folder.summary_path and err.value.__cause__ is None
    assert leftover_tmp(small_fs) == []

    with pytest.raises(RunFolderError, match="metrics.jsonl"):
        writer.write({"step": 2, "train/loss": 0.5, "pad": "y" * 8000})
    with pytest.raises(RunFolderError, match="config.yaml"):
        folder.write_config("a: 1\n" * 2000)
    assert leftover_tmp(small_fs) == []

    assert folder.record_failure("RunFolderError: disk full") is True
    summary = folder.read_summary()
    assert summary["status"] == "failed" and summary["error"] == "RunFolderError: disk full"
    assert summary["fingerprint"] == config_fingerprint(FLAT)  # the rest of the record survived

    filler.unlink()  # room again: the stream is not torn by the failed append
    writer.write({"step": 2, "train/loss": 0.5})
    assert [r["step"] for r in read_metrics(folder.metrics_path)] == [1, 2]


def test_a_failure_on_a_full_disk_records_the_last_step_metrics_jsonl_holds(small_fs):
    """Issue 32 item 3: the rank appended a 4th metrics line, then could not replace summary.json (full disk);
    the in-place fallback kept last_step=3 while metrics.jsonl held 4 lines. The error says ENOSPC and exit 1
    (the run failed; no path to change)."""
    folder = RunFolder(small_fs / "run").create()
    folder.start_summary("r", None, FLAT)
    writer = MetricsWriter(folder.metrics_path)
    for step in (1, 2, 3):
        writer.write({"step": step, "train/loss": 1.0 / step})
        folder.update_summary(last_step=step)
    writer.write({"step": 4, "train/loss": 0.25})
    fill(small_fs)
    with pytest.raises(RunFolderError) as err:
        folder.update_summary(last_step=4, dtypes_seen={"student": "float32"})
    assert "ENOSPC" in str(err.value) and err.value.exit_code == 1 and not err.value.path_error
    assert folder.record_failure("RunFolderError: disk full") is True
    summary = folder.read_summary()
    rows = read_metrics(folder.metrics_path)
    assert summary["status"] == "failed" and summary["last_step"] == rows[-1]["step"] == 4


def test_failed_write_through_dev_full_removes_its_tmp(tmp_path):
    """The same without root: the temporary file is /dev/full (every write fails with ENOSPC)."""
    folder = RunFolder(tmp_path / "run").create()
    folder.start_summary("r", None, FLAT)
    before = folder.summary_path.read_text()
    tmp = folder.path / f".summary.json.{os.getpid()}.tmp"
    tmp.symlink_to("/dev/full")
    with pytest.raises(RunFolderError, match=r"cannot write summary\.json in run\.output_dir .*ENOSPC"):
        folder.update_summary(status="failed")
    assert not tmp.exists() and not tmp.is_symlink()
    assert folder.summary_path.read_text() == before


def test_read_only_folder_names_run_output_dir(tmp_path):
    """Issue 12 item 5: a read-only output folder gave a raw OSError that did not name run.output_dir."""
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "1m")
    try:
        folder = RunFolder(mnt / "run").create()
        folder.start_summary("r", None, FLAT)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(RunFolderError) as err:
            folder.update_summary(status="completed")
        assert "run.output_dir" in str(err.value) and str(folder.path) in str(err.value)
        assert "EROFS" in str(err.value) and "\n" not in str(err.value)
        assert err.value.exit_code == 2 and err.value.path_error  # the user must change the path
        with pytest.raises(RunFolderError, match=rf"cannot create run\.output_dir {mnt / 'new'}"):
            RunFolder(mnt / "new").create()
        with pytest.raises(RunFolderError, match=r"\.lock|run\.output_dir"):
            RunLock(folder.path, heartbeat_s=0).acquire()
        assert folder.record_failure("x") is False  # nothing can be written; no exception either
        assert folder.read_summary()["status"] == "running"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# (a chmod-based variant for non-root users was dropped: CI runs as root, which ignores file modes, so it could
# only skip; the read-only mount above is the real check)


def test_summary_config_and_written_files_never_hold_a_secret(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    flat = {**FLAT, "tracking.wandb.api_key": "abcd1234zz", "model.hub_token": "hf_abcdef"}
    folder.start_summary("+tracking.wandb.api_key=abcd1234zz", None, flat)
    folder.write_config("tracking:\n  wandb:\n    api_key: abcd1234zz\n")
    folder.write_json("command.json", {"env": {"WANDB_API_KEY": "abcd1234zz"}})
    for p in folder.path.iterdir():
        if p.is_file():
            text = p.read_text()
            assert "abcd1234zz" not in text and "hf_abcdef" not in text, p.name


# ------------------------------------------------------------------------------------------------ lifecycle
def test_summary_lifecycle(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    flat = flatten({"loss": {"precision": "fp32"}, "gkd": {"beta": 0.5}, "tracking": {"api_key": "zzz"}})
    s = folder.start_summary("r", "g", flat)
    assert s["status"] == "running" and s["config"]["loss.precision"] == "fp32"
    assert s["config"]["tracking.api_key"] == REDACTED
    assert set(s["versions"]) >= {"ms-swift", "torch", "transformers"}
    writer = MetricsWriter(folder.metrics_path)
    writer.write({"train/loss": 1.0, "step": 1})
    writer.write({"train/loss": 0.5, "step": 2})
    folder.update_summary(dtypes_seen={"student": "float32"})
    folder.update_summary(dtypes_seen={"teacher": "bfloat16"})
    done = folder.finish_summary("failed", "boom")
    assert done["status"] == "failed" and done["error"] == "boom" and done["last_step"] == 2
    assert done["dtypes_seen"] == {"student": "float32", "teacher": "bfloat16"}
    assert done["wall_s"] is not None and done["ended_at"]
    assert not folder.is_completed()
    folder.finish_summary("completed")
    assert folder.is_completed()
    assert "zzz" not in folder.summary_path.read_text()


def test_truncate_metrics_for_a_resumed_run(tmp_path):
    folder = RunFolder(tmp_path).create()
    for step in (1, 2, 3, 4):
        MetricsWriter(folder.metrics_path).write({"step": step, "gkd/loss_calls_total": float(step)})
    assert folder.truncate_metrics(2) == 2
    assert [r["step"] for r in read_metrics(folder.metrics_path)] == [1, 2]
    assert leftover_tmp(tmp_path) == []


def test_archive_without_the_lock_is_refused_even_with_no_other_owner(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    (folder.path / ".hydra").mkdir()  # Hydra's files are not an attempt's
    assert folder.archive_previous_attempt() is None  # nothing to move: nothing to own
    folder.create()
    folder.start_summary("r", None, FLAT)
    with pytest.raises(RunFolderError, match=r"held by nobody\); acquire RunFolder.lock\(\) first"):
        folder.archive_previous_attempt()
    assert folder.summary_path.is_file()
