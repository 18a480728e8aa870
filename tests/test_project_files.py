"""A public Python project's files (issue 47, item 9): LICENSE (Apache-2.0, as ms-swift), CHANGELOG, CONTRIBUTING,
a pre-commit configuration running the CI gate, and a GitHub Actions workflow running the README's test command.
Before: none of them existed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_license_is_apache_2():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text


def test_changelog_and_contributing_exist():
    assert (REPO / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert "bash launch/run_tests.sh" in (REPO / "CONTRIBUTING.md").read_text()


def _gate() -> list[str]:
    """The gate's commands as launch/run_tests.sh runs them (``"$py" -m X`` each)."""
    lines = (REPO / "launch" / "run_tests.sh").read_text().splitlines()
    line = next(ln for ln in lines if ln.startswith('"$py" -m ruff check'))
    return [c.strip() for c in re.findall(r'"\$py" -m ([^&|]+?)(?= &&| \|\|)', line)]


def test_pre_commit_runs_the_same_gate_as_ci():
    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    entries = [h["entry"].removeprefix(".venv/bin/python -m ").strip() for h in hooks]
    assert _gate() == ["ruff check .", "ruff format --check .", "mypy"]
    assert entries == _gate()


def test_the_workflow_runs_the_readmes_test_command():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    readme = (REPO / "README.md").read_text()
    assert "bash launch/run_tests.sh" in readme
    assert steps[-2:] == ["bash launch/setup_env.sh", "bash launch/run_tests.sh"]
