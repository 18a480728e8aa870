"""A run's identity (gkd_harness.harness.store.fingerprint): every key and the harness version, stable across processes."""

from __future__ import annotations

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
    assert config_fingerprint(FLAT, version="9.9.9") != config_fingerprint(FLAT, version=harness_version())
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


def test_the_resume_check_compares_commits_not_dev_numbers():
    from gkd_harness.harness.store.fingerprint import summary_diff, version_identity

    assert version_identity("0.1.dev5+g1a2b3c4d5.dirty") == "g1a2b3c4d5.dirty"
    assert version_identity("0.2.0") == "0.2.0" and version_identity("unknown") == "unknown"
    done = {"config": FLAT, "harness_version": "0.1.dev5+g1a2b3c4d5"}
    done["fingerprint"] = config_fingerprint(FLAT, done["harness_version"])
    assert summary_diff(done, FLAT, version="0.1.dev9+g1a2b3c4d5") == []
    assert summary_diff(done, FLAT, version="0.1.dev5+g1a2b3c4d5.dirty") == ["harness_version"]
    assert summary_diff(done, FLAT, version="0.1.dev5+g0000000aa") == ["harness_version"]
