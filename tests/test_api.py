"""The notebook API and ``__version__`` (issue 47, item 10): ``gkd_harness.train`` / ``analyze`` / ``certify`` and
``gkd_harness.__version__``, resolved on first use so that ``import gkd_harness`` imports no heavy package.

Before: ``gkd_harness`` had no ``__version__`` and a notebook needed deep imports for each job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

import gkd_harness

HEAVY = ("hydra", "omegaconf", "torch", "swift", "transformers", "pandas", "wandb", "importlib.metadata")


def test_version_is_the_installed_distributions():
    assert gkd_harness.__version__ == version("gkd-harness")


def test_import_gkd_harness_stays_light():
    code = "import sys, json, gkd_harness; print(json.dumps(sorted(m for m in sys.modules if m in %r)))" % (HEAVY,)
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    assert loaded == []


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gkd_harness.nope  # noqa: B018


def test_train_dry_run_returns_without_training(capsys):
    assert gkd_harness.train("run.dry_run=true", "loss=original") == {"status": "dry_run"}
    assert "# gkd-train dry run" in capsys.readouterr().out


def test_train_refuses_a_bad_value_naming_the_key():
    from gkd_harness.harness.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"^gkd\.beta: "):
        gkd_harness.train("gkd.beta=2", "run.dry_run=true")


def test_certify_tells_the_defect_from_the_fix():
    """The mixed FP32/BF16 family: upstream's arithmetic ("native") fails it, the fp32 fix passes (as gkd-certify)."""
    family = ("mixed FP32/BF16",)
    assert gkd_harness.certify("native", quick=True, families=family, speed=False)["verdict"] == "FAIL"
    assert gkd_harness.certify("fp32", quick=True, families=family, speed=False)["verdict"] == "PASS"


def test_certify_with_no_matching_family_is_an_error():
    with pytest.raises(ValueError, match="no family matches"):
        gkd_harness.certify("fp32", quick=True, families=("no such family",), speed=False)


@pytest.mark.slow
def test_analyze_judges_the_smoke_sweep_as_gkd_analyze_does(smoke_sweep, tmp_path):
    result = gkd_harness.analyze(smoke_sweep, tmp_path / "report")
    verdict = json.loads((tmp_path / "report" / "verdict.json").read_text())
    assert result["verdict"] == verdict["verdict"]
    assert (tmp_path / "report" / "report.md").exists()


def test_the_documented_snippet_runs(tmp_path):
    """docs/python-api.md's "The three jobs in one call each" block, as written."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "python-api.md").read_text()
    block = re.search(r"## The three jobs in one call each.*?```python\n(.*?)```", doc, flags=re.S).group(1)
    p = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == f"{version('gkd-harness')} PASS"
