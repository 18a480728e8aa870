"""Seeing what happens (issue 47, item 7).

Progress: a line per stage in ``gkd-analyze`` and ``gkd-dashboard``, a line per family in ``gkd-certify``, on
stderr, where stdout is a terminal (a real pseudo-terminal here); none into a pipe or with ``--quiet``. Before,
each was silent until its result (``gkd-certify`` 388 s).

A missing path is refused before the heavy imports: ``gkd-dashboard`` imported wandb-workspaces and the sign-off
(34 s under load), ``gkd-replay`` torch (51 s), before looking at the path. No timing is asserted: what each has
imported when it refuses is.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from tests.conftest import entry_point


def _run(argv, terminal: bool, cwd) -> subprocess.CompletedProcess:
    """``argv`` with stdout a pseudo-terminal (``terminal``) or a pipe; stderr always a pipe."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    if not terminal:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    leader, follower = pty.openpty()
    try:
        p = subprocess.run(argv, cwd=cwd, env=env, stdout=follower, stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(follower)
        os.close(leader)
    return p


def _progress(stderr: str, prog: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith(f"{prog}: [") or ln.startswith(f"{prog}: family ")]


@pytest.mark.slow
def test_gkd_analyze_prints_a_line_per_stage_on_a_terminal(synthetic_sweep_dir, tmp_path):
    argv = [entry_point("gkd-analyze"), str(synthetic_sweep_dir), "--out", str(tmp_path / "r")]
    shown = _progress(_run(argv, True, tmp_path).stderr, "gkd-analyze")
    assert [ln.split(" (")[0] for ln in shown] == [
        "gkd-analyze: [1/3] loading the runs",
        "gkd-analyze: [2/3] judging the runs",
        "gkd-analyze: [3/3] writing the report",
    ]
    assert (tmp_path / "r" / "verdict.json").exists()  # --out: the report folder (--report kept as its alias)
    assert _progress(_run([*argv, "--quiet"], True, tmp_path).stderr, "gkd-analyze") == []


@pytest.mark.slow
def test_gkd_dashboard_prints_a_line_per_stage_on_a_terminal(synthetic_sweep_dir, tmp_path):
    argv = [entry_point("gkd-dashboard"), str(synthetic_sweep_dir), "--out", str(tmp_path / "spec.json")]
    p = _run(argv, True, tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [ln.split(" (")[0] for ln in _progress(p.stderr, "gkd-dashboard")] == [
        "gkd-dashboard: [1/3] reading the runs' metrics",
        "gkd-dashboard: [2/3] judging the runs",
        "gkd-dashboard: [3/3] building the workspace and report specs",
    ]
    assert _progress(_run(argv, False, tmp_path).stderr, "gkd-dashboard") == []  # a pipe: no lines


@pytest.mark.slow
def test_gkd_certify_prints_a_line_per_family_on_a_terminal(tmp_path):
    argv = [entry_point("gkd-certify"), "fp32", "--quick", "--no-speed", "--family", "empty masks"]
    argv += ["--family", "chunking"]
    p = _run(argv, True, tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [ln.split(" (")[0] for ln in _progress(p.stderr, "gkd-certify")]
    assert lines == ["gkd-certify: family 1: pass  empty masks", "gkd-certify: family 2: pass  chunking"], p.stderr
    assert _progress(_run(argv, False, tmp_path).stderr, "gkd-certify") == []


PROBE = """
import json, sys
from {module} import main
try:
    code = main({argv!r})
except SystemExit as e:
    code = e.code
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"torch", "wandb_workspaces", "wandb", "pandas", "swift"}})
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


@pytest.mark.parametrize(
    "module,argv,line",
    [
        ("gkd_harness.analysis.dashboard.cli", ["/no/such/sweep", "--out", "x.json"], "sweep folder /no/such/sweep"),
        ("gkd_harness.analysis.replay.cli", ["/no/such/run"], "gkd-replay: /no/such/run: no such file or folder"),
        ("gkd_harness.analysis.cli", ["/no/such/sweep", "--out", "r"], "/no/such/sweep"),
        ("gkd_harness.analysis.certify.cli", ["/no/such/loss.py"], "/no/such/loss.py"),
    ],
)
def test_a_missing_path_is_refused_before_the_heavy_imports(module, argv, line, tmp_path):
    code = PROBE.format(module=module, argv=argv)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["code"] == 2 and line in p.stderr, p.stderr
    assert result["heavy"] == [], result
