"""Every entry point's ``--help`` and ``--version`` (issue 33): answered before any heavy import (no torch, ms-swift,
transformers, pandas, matplotlib, wandb or scipy in ``sys.modules`` afterwards, so they answer in about a second
even on a loaded machine; before, ``gkd-replay --help`` imported torch and ms-swift: 50 s under load), exit 0, and
one ``--version`` format for all: ``gkd-train 0.1.dev5+g1a2b3c4d5 (gkd-harness)`` (the version from git).

The entry points are read from pyproject.toml's ``[project.scripts]``; each runs in a fresh interpreter (the
module's function called as the console script calls it), which then reports what it imported. No timing is
asserted: the import list is what makes them fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from gkd_harness.harness.store.provenance import harness_version

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
HEAVY = ("torch", "swift", "transformers", "pandas", "matplotlib", "wandb", "scipy")

PROBE = """
import contextlib, importlib, io, json, sys
module, func, prog, flag = sys.argv[1:5]
heavy = set(sys.argv[5:])
sys.argv = [prog, flag]
out, code = io.StringIO(), None
with contextlib.redirect_stdout(out):
    try:
        code = getattr(importlib.import_module(module), func)()
    except SystemExit as e:
        code = e.code
print(json.dumps({"code": code, "stdout": out.getvalue(),
                  "heavy": sorted({m.split(".")[0] for m in sys.modules} & heavy)}))
"""


def _run(name: str, flag: str) -> dict:
    module, func = SCRIPTS[name].split(":")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, module, func, name, flag, *HEAVY],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_entry_point_is_covered():
    assert sorted(SCRIPTS) == ["gkd-analyze", "gkd-bench", "gkd-certify", "gkd-dashboard", "gkd-replay", "gkd-train"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_version_is_one_format_and_light(name):
    got = _run(name, "--version")
    assert got["code"] in (0, None), got
    assert got["stdout"] == f"{name} {harness_version()} (gkd-harness)\n"
    assert harness_version() != "0.1.0" and "+g" in harness_version()  # git's, not a static number
    assert got["heavy"] == [], f"{name} --version imported {got['heavy']}"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_is_light(name):
    got = _run(name, "--help")
    assert got["code"] in (0, None), got
    assert name in got["stdout"] and len(got["stdout"].splitlines()) > 3, got["stdout"]
    assert got["heavy"] == [], f"{name} --help imported {got['heavy']}"
