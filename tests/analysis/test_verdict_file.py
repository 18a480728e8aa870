"""verdict.json carries its layout version and the package versions of the report and of the runs."""

from __future__ import annotations

import json
import platform
from importlib.metadata import version

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.signoff.report import VERDICT_SCHEMA_VERSION


def test_schema_and_package_versions(synthetic_sweep_dir, tmp_path):
    assert main([str(synthetic_sweep_dir), "--report", str(tmp_path / "r")]) == 0
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["schema_version"] == VERDICT_SCHEMA_VERSION == 2  # 2: judgement, run_files, inputs (issue 29)
    here = v["package_versions"]["analysis"]
    for name in ("torch", "transformers", "ms-swift", "numpy", "pandas", "matplotlib", "gkd-harness"):
        assert here[name] == version(name), name
    assert here["python"] == platform.python_version()
    # the runs' versions, as each run recorded them in summary.json (gkd_harness.bench.synthetic writes these)
    recorded = json.loads(next(synthetic_sweep_dir.glob("*/summary.json")).read_text())["versions"]
    runs = v["package_versions"]["runs"]  # the recorded versions, and the provenance hashes beside them
    assert {k: runs[k] for k in recorded} == {k: [val] for k, val in recorded.items()}
    assert set(runs) - set(recorded) <= {"harness_commit", "harness_dirty", "loss_sha256", "rank_sha256"}


def test_file_sha256_without_hashlib_file_digest(tmp_path, monkeypatch):
    """Python 3.10, which the package supports, has no ``hashlib.file_digest`` (3.11+): the verdict's file digests
    are read in blocks (before: AttributeError on 3.10, found by mypy with python_version 3.10)."""
    import hashlib

    from gkd_harness.analysis.signoff.verdict import file_sha256

    data = bytes(range(256)) * 5000  # 1.28 MB: more than one block
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(data)
    monkeypatch.delattr(hashlib, "file_digest", raising=False)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(tmp_path / "missing") is None
