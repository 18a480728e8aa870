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
    assert v["package_versions"]["runs"] == {k: [val] for k, val in recorded.items()}
