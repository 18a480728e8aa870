"""The run-folder contract: one owner (lock), config fingerprint, disk/permission errors, secrets in Hydra files.

Real parts throughout: real processes hold and lose locks (a SIGKILLed child leaves a stale lock), a real full
tmpfs and a real read-only mount (root only; skipped otherwise) plus /dev/full for the no-root case, and a real
Hydra app writes the .hydra/ files that get scrubbed.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.contract import ARCHIVE_DIR, LOCK_FILE
from harness.store.files import RunFolderError
from harness.store.fingerprint import FINGERPRINT_EXCLUDE, config_diff, config_fingerprint
from harness.store.hydra_files import redacted_folder_name, scrub_folder_name, scrub_hydra_dir
from harness.store.lock import RunFolderBusy, RunLock, read_lock
from harness.store.metrics_io import MetricsWriter, read_metrics
from harness.store.provenance import harness_version
from harness.store.run_folder import RunFolder
from harness.config.secrets import REDACTED
from harness.config.flat import flatten

REPO = Path(__file__).resolve().parents[3]
FLAT = flatten({"loss": {"precision": "fp32", "beta_form": "paper"}, "gkd": {"beta": 0.5},
                "model": {"student": "embedded", "teacher": "embedded"}, "run": {"dataset": None, "max_steps": 3,
                                                                                  "output_dir": "/somewhere"}})


# ------------------------------------------------------------------------------------------------ helpers
def _holder(run_dir: Path) -> subprocess.Popen:
    """A separate process that takes the folder's lock, says "locked", then sleeps until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from harness.store.lock import RunLock
        lock = RunLock({str(run_dir)!r}, heartbeat_s=0)
        lock.acquire()
        print("locked", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip() or 'not root'})")


@pytest.fixture
def small_fs(tmp_path):
    """A real 64 KiB tmpfs (root only), unmounted afterwards."""
    mnt = tmp_path / "fs"
    _mount_tmpfs(mnt, "64k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(fs: Path) -> Path:
    """Fill the file system until ENOSPC; returns the filler file."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(OSError):
        (fs / "probe").write_bytes(b"x" * 4096)
    return filler


def _leftover_tmp(folder: Path) -> list:
    return sorted(p.name for p in folder.rglob("*.tmp"))


# ------------------------------------------------------------------------------------------------ one owner
def test_second_owner_is_refused_at_once_naming_folder_and_owner(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run)
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
        _stop(holder)


def test_a_live_runs_files_never_move(tmp_path):
    """Issue 12 item 3: a second gkd-train moved the live run's files to previous_attempts/1."""
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        folder = RunFolder(run)
        folder.start_summary("first", None, FLAT)
        MetricsWriter(folder.metrics_path).write({"step": 1})
        with pytest.raises(RunFolderError, match="does not hold its lock"):
            folder.archive_previous_attempt()
        assert folder.summary_path.is_file() and folder.metrics_path.is_file()
        assert not (run / ARCHIVE_DIR).exists()
    finally:
        _stop(holder)


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path, caplog):
    run = tmp_path / "run"
    holder = _holder(run)
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
        (run / LOCK_FILE).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(),
                                                 "started_at": "2020-01-01T00:00:00+00:00", "pid_start": "1"}))
        with RunLock(run, heartbeat_s=0) as lock:
            assert lock.note and f"pid {sleeper.pid}" in lock.note
    finally:
        _stop(sleeper)


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


# ------------------------------------------------------------------------------------------------ fingerprint
def test_fingerprint_covers_every_key_and_the_version_and_is_stable_across_processes(tmp_path):
    fp = config_fingerprint(FLAT)
    assert len(fp) == 64 and fp == config_fingerprint(dict(reversed(list(FLAT.items()))))
    assert config_fingerprint({**FLAT, "model.teacher": "/other/teacher"}) != fp  # path-valued key
    assert config_fingerprint({**FLAT, "run.dataset": "x/y"}) != fp
    assert config_fingerprint({**FLAT, "gkd.beta": 0.5000001}) != fp
    assert config_fingerprint({**FLAT, "new.key": 1}) != fp
    assert config_fingerprint(FLAT, version="9.9.9") != config_fingerprint(FLAT, version=harness_version())
    for key in FINGERPRINT_EXCLUDE:  # where/how to run, not what
        assert config_fingerprint({**FLAT, key: "elsewhere"}) == fp
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from harness.store.fingerprint import config_fingerprint; "
            f"print(config_fingerprint({FLAT!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.strip()
    assert out == fp
    assert config_diff(FLAT, {**FLAT, "model.teacher": "/t", "gkd.beta": 0.9, "x": 1}) == ["gkd.beta", "model.teacher",
                                                                                            "x"]


# ------------------------------------------------------------------------------------------------ disk errors
def test_full_disk_gives_one_clear_error_records_failed_and_leaves_no_tmp(small_fs):
    """Issue 12 item 5: on a full disk summary.json stayed "running" and an empty .summary.json.<pid>.tmp stayed."""
    folder = RunFolder(small_fs / "run").create()
    folder.start_summary("r", None, FLAT)
    writer = MetricsWriter(folder.metrics_path)
    writer.write({"step": 1, "train/loss": 1.0})
    filler = _fill(small_fs)

    with pytest.raises(RunFolderError) as err:
        folder.update_summary(dtypes_seen={"student": "float32"}, note="x" * 5000)
    msg = str(err.value)
    assert "\n" not in msg and "summary.json" in msg and str(folder.path) in msg and "ENOSPC" in msg
    assert err.value.path == folder.summary_path and err.value.__cause__ is None
    assert _leftover_tmp(small_fs) == []

    with pytest.raises(RunFolderError, match="metrics.jsonl"):
        writer.write({"step": 2, "train/loss": 0.5, "pad": "y" * 8000})
    with pytest.raises(RunFolderError, match="config.yaml"):
        folder.write_config("a: 1\n" * 2000)
    assert _leftover_tmp(small_fs) == []

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
    _fill(small_fs)
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
    _mount_tmpfs(mnt, "1m")
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


# ------------------------------------------------------------------------------------------------ secrets
HYDRA_APP = """
import hydra
from omegaconf import OmegaConf

@hydra.main(version_base="1.3", config_path=None, config_name="cfg")
def main(cfg):
    print(OmegaConf.to_yaml(cfg))

if __name__ == "__main__":
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="cfg", node={"gkd": {"beta": 0.5}, "tracking": {"wandb": {"group": "g"}}})
    main()
"""


def test_scrub_hydra_outputs_and_folder_name_of_a_real_hydra_run(tmp_path):
    """Issue 12 item 6: `+tracking.wandb.api_key=...` lands in .hydra/*.yaml and the folder name."""
    secret = "Sekr3tKeyValue0123456789"
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP)
    out = tmp_path / "outputs"
    subprocess.run([sys.executable, str(app), f"+tracking.wandb.api_key={secret}", "gkd.beta=0.9",
                    f"hydra.run.dir={out}/" + "${hydra.job.override_dirname}"], cwd=tmp_path, check=True,
                   capture_output=True)
    [run_dir] = list(out.iterdir())
    hydra_dir = run_dir / ".hydra"

    def leaks():
        hits = [p for p in out.rglob("*") if secret in p.name]
        hits += [p for p in out.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]
        return hits

    assert secret in run_dir.name and {p.name for p in leaks()} >= {"config.yaml", "overrides.yaml", "hydra.yaml"}
    changed = scrub_hydra_dir(hydra_dir)
    assert {p.name for p in changed} == {"config.yaml", "overrides.yaml", "hydra.yaml"}
    assert redacted_folder_name(run_dir).name == run_dir.name.replace(secret, "REDACTED")
    new_dir = scrub_folder_name(run_dir)
    assert leaks() == []
    assert new_dir.name == "+tracking.wandb.api_key=REDACTED,gkd.beta=0.9"
    # the files still parse, and keep everything but the secret
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(new_dir / ".hydra" / "config.yaml")
    assert cfg.tracking.wandb.api_key == REDACTED and cfg.gkd.beta == 0.9 and cfg.tracking.wandb.group == "g"
    assert list(OmegaConf.load(new_dir / ".hydra" / "overrides.yaml")) == [f"+tracking.wandb.api_key={REDACTED}",
                                                                            "gkd.beta=0.9"]
    assert scrub_hydra_dir(new_dir / ".hydra") == []  # idempotent


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


def test_metrics_stream_is_line_per_step_and_survives_a_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"step": 1, "gkd/neg_loss_calls": 0.0})
    with open(path, "a") as f:
        f.write('{"step": 2, "gkd/neg')  # what a SIGKILL mid-write could leave
    assert read_metrics(path) == [{"step": 1, "gkd/neg_loss_calls": 0.0}]


def test_metrics_keep_nan_and_inf_as_themselves(tmp_path):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"step": 1, "train/grad_norm": float("nan"), "spot/loss": float("inf")})
    [row] = read_metrics(path)
    assert row["train/grad_norm"] != row["train/grad_norm"] and row["spot/loss"] == float("inf")


def test_truncate_metrics_for_a_resumed_run(tmp_path):
    folder = RunFolder(tmp_path).create()
    for step in (1, 2, 3, 4):
        MetricsWriter(folder.metrics_path).write({"step": step, "gkd/loss_calls_total": float(step)})
    assert folder.truncate_metrics(2) == 2
    assert [r["step"] for r in read_metrics(folder.metrics_path)] == [1, 2]
    assert _leftover_tmp(tmp_path) == []


HYDRA_APP_OWN_FILES = """
import sys
import hydra
from omegaconf import OmegaConf
sys.path.insert(0, {repo!r})
from harness.store.hydra_files import save_hydra_files

@hydra.main(version_base="1.3", config_path=None, config_name="cfg")
def main(cfg):
    from hydra.core.hydra_config import HydraConfig
    save_hydra_files(HydraConfig.get().runtime.output_dir, cfg)

if __name__ == "__main__":
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="cfg", node={{"gkd": {{"beta": 0.5}}, "tracking": {{"wandb": {{"group": "g"}}}}}})
    main()
"""


def test_harness_writes_hydra_files_itself_without_the_secret(tmp_path):
    """With hydra.output_subdir=null Hydra writes nothing; save_hydra_files writes the same three files, redacted."""
    secret = "Sekr3tKeyValue0123456789"
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP_OWN_FILES.format(repo=str(REPO)))
    out = tmp_path / "outputs"
    subprocess.run([sys.executable, str(app), f"+tracking.wandb.api_key={secret}", "gkd.beta=0.9",
                    "hydra.output_subdir=null", f"hydra.run.dir={out}/run"], cwd=tmp_path, check=True,
                   capture_output=True)
    hydra_dir = out / "run" / ".hydra"
    assert sorted(p.name for p in hydra_dir.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert not any(secret in p.read_text() for p in hydra_dir.iterdir())
    from omegaconf import OmegaConf

    assert OmegaConf.load(hydra_dir / "config.yaml").gkd.beta == 0.9
    hydra_yaml = OmegaConf.load(hydra_dir / "hydra.yaml")
    assert list(hydra_yaml.hydra.overrides.task) == [f"+tracking.wandb.api_key={REDACTED}", "gkd.beta=0.9"]
    assert hydra_yaml.hydra.job.name == "app"


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
