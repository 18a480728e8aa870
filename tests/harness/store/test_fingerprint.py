"""A run's identity (gkd_harness.harness.store.fingerprint): every key and the code that runs a training, stable across
processes and across commits that do not touch that code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gkd_harness.harness.store.fingerprint import FINGERPRINT_EXCLUDE, config_diff, config_fingerprint
from gkd_harness.harness.store.provenance import harness_version
from tests.harness.store.run_folder_helpers import FLAT, REPO


# ------------------------------------------------------------------------------------------------ fingerprint
def test_fingerprint_covers_every_key_and_the_version_and_is_stable_across_processes(tmp_path):
    fp = config_fingerprint(FLAT)
    assert len(fp) == 64 and fp == config_fingerprint(dict(reversed(list(FLAT.items()))))
    assert config_fingerprint({**FLAT, "model.teacher": "/other/teacher"}) != fp  # path-valued key
    assert config_fingerprint({**FLAT, "run.dataset": "x/y"}) != fp
    assert config_fingerprint({**FLAT, "gkd.beta": 0.5000001}) != fp
    assert config_fingerprint({**FLAT, "new.key": 1}) != fp
    assert config_fingerprint(FLAT, code="0" * 64) != fp  # other training code, other run
    for key in FINGERPRINT_EXCLUDE:  # where/how to run, not what
        assert config_fingerprint({**FLAT, key: "elsewhere"}) == fp
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from gkd_harness.harness.store.fingerprint import config_fingerprint; "
        f"print(config_fingerprint({FLAT!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout.strip()
    assert out == fp
    assert config_diff(FLAT, {**FLAT, "model.teacher": "/t", "gkd.beta": 0.9, "x": 1}) == [
        "gkd.beta",
        "model.teacher",
        "x",
    ]


# ------------------------------------------------------------------------------------------------ issue 40, item 17
def test_a_stale_egg_info_does_not_change_the_fingerprint(tmp_path):
    """A git-ignored ``gkd_harness.egg-info`` of an older install in the working directory changes the version's
    dev number in that process (``0.1.dev1+g<commit>`` against ``0.1.devN+g<commit>``). Before the fix the
    fingerprint hashed the whole version, so the second process refused the first one's completed point."""
    stale = tmp_path / "gkd_harness.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: gkd-harness\nVersion: 0.1.dev1\n")
    code = (
        f"import sys; sys.path.insert(1, {str(REPO)!r}); from gkd_harness.harness.store.fingerprint import "
        f"config_fingerprint; from gkd_harness.harness.store.provenance import harness_version; "
        f"print(harness_version()); print(config_fingerprint({FLAT!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    here = harness_version()
    assert out[0] != here and out[0].split("+")[1] == here.split("+")[1]  # the stale dev number, the same commit
    assert out[1] == config_fingerprint(FLAT)


def test_the_resume_check_compares_the_training_code_not_the_commit():
    """Issue 38 item 9: a commit during a sweep that changes no code of gkd_harness/harness/ (docs, tests, analysis)
    leaves every run's identity as it was; a change to that code, or a folder of an older harness that recorded no
    code hash, does not match."""
    from gkd_harness.harness.store.fingerprint import summary_diff
    from gkd_harness.harness.store.provenance import harness_code_sha256

    code = harness_code_sha256()
    done = {"config": FLAT, "harness_version": "0.1.dev5+g1a2b3c4d5", "harness_code_sha256": code}
    done["fingerprint"] = config_fingerprint(FLAT)
    assert summary_diff(done, FLAT) == []  # the version differs from this process's: not part of the identity
    assert summary_diff(done, FLAT, code="f" * 64) == ["harness_code"]
    assert summary_diff({k: v for k, v in done.items() if k != "harness_code_sha256"}, FLAT) == ["harness_code"]


def test_the_code_hash_covers_the_training_code_only(tmp_path, monkeypatch):
    """Hashing a copy of gkd_harness/harness/ gives the same digest; a byte changed in a rank-side file changes it; the
    repository's docs, tests and analysis are not part of it."""
    import shutil

    from gkd_harness.harness.store import provenance

    here = provenance.harness_code_sha256()
    copy = tmp_path / "harness"
    shutil.copytree(REPO / "gkd_harness" / "harness", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "gkd_harness" / "launch", tmp_path / "launch", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "_HARNESS_DIR", copy)
    provenance.harness_code_sha256.cache_clear()
    try:
        assert provenance.harness_code_sha256() == here
        plugin = copy / "rank" / "plugin.py"
        plugin.write_text(plugin.read_text() + "\n# changed\n")
        provenance.harness_code_sha256.cache_clear()
        assert provenance.harness_code_sha256() != here
    finally:
        provenance.harness_code_sha256.cache_clear()


def _code_copy(tmp_path, monkeypatch):
    import shutil

    from gkd_harness.harness.store import provenance

    for part in ("harness", "launch"):
        shutil.copytree(REPO / "gkd_harness" / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "_HARNESS_DIR", tmp_path / "harness")
    provenance.harness_code_sha256.cache_clear()
    return provenance


def test_a_launcher_only_edit_changes_the_code_identity(tmp_path, monkeypatch):
    """Issue 48, item 10: the launcher's code (gkd_harness/launch/: the sweep callbacks, submitit) is part of what
    ran; before, only gkd_harness/harness/ was hashed, so a launcher-only edit passed unnoticed."""
    provenance = _code_copy(tmp_path, monkeypatch)
    try:
        before = provenance.harness_code_sha256()
        sweep = tmp_path / "launch" / "sweep.py"
        sweep.write_text(sweep.read_text() + "\n# a git pull\n")
        provenance.harness_code_sha256.cache_clear()
        assert provenance.harness_code_sha256() != before
    finally:
        provenance.harness_code_sha256.cache_clear()


def test_each_point_hashes_the_code_it_launches(tmp_path, monkeypatch):
    """Issue 48, item 10: a ``git pull`` while point 1 trains (a line added to rank/plugin.py): point 2, launched
    by the same sweep process, records the new code. Before, the hash was taken once per process."""
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import train

    provenance = _code_copy(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    try:
        point1 = provenance.harness_code_sha256()
        plugin = tmp_path / "harness" / "rank" / "plugin.py"
        plugin.write_text(plugin.read_text() + "\n# a git pull mid-sweep\n")
        cfg, _ = point_config(["run.dry_run=true", "gkd.beta=0.9"])
        train(cfg)  # point 2 (a dry run: it starts nothing)
        assert provenance.harness_code_sha256() != point1
    finally:
        provenance.harness_code_sha256.cache_clear()


def test_the_sweep_says_a_point_ran_other_code(tmp_path):
    from gkd_harness.harness.store.fingerprint import code_change_line

    def point(name, code, started):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"harness_code_sha256": code, "started_at": started, "status": "completed"})
        )
        return tmp_path / name

    point("gkd.beta=0.1", "a" * 64, "2026-12-07T10:00:00")
    second = point("gkd.beta=0.5", "a" * 64, "2026-12-07T10:05:00")
    third = point("gkd.beta=0.9", "b" * 64, "2026-12-07T10:10:00")
    assert code_change_line(second, tmp_path) is None
    line = code_change_line(third, tmp_path)
    assert line is not None and line.startswith("gkd.beta=0.9 ran other code than 2 earlier points of this sweep")
    assert "bbbbbbbbbbbb against aaaaaaaaaaaa" in line
