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
