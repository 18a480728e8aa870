"""The docs: self-contained, every path they name exists, and the documented commands run.

Checked on README.md and docs/*.md:
- no reference to a file outside the repository (``../``, the design doc, numbered reports);
- every Markdown link and every backticked repository path exists;
- the README's notebook example runs on a sweep;
- the commands the README documents without a GPU or a cluster run and exit 0.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import entry_point

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OUTSIDE = re.compile(r"(?<![.\w])\.\./|DESIGN\.md|\breports?/0\d\d|\breport 0\d\d|\bthe seed report\b", re.IGNORECASE)
#: a backticked repository path: a file with an extension, or a folder ending in "/"
REPO_PATH = re.compile(r"`((?:configs|harness|launch|analysis|bench|tests|docs)/[\w./-]*(?:\.\w+|/))`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_reference_outside_the_repository(doc):
    bad = [f"{doc.name}:{n}: {line.strip()}" for n, line in enumerate(doc.read_text().splitlines(), 1)
           if OUTSIDE.search(line)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_paths_exist(doc):
    text = doc.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists():
            missing.append(target)
    for path in REPO_PATH.findall(text):
        path = path.rstrip(".")
        if "*" in path or "<" in path or path.startswith("configs/local/default"):
            continue
        if not (REPO / path).exists():
            missing.append(path)
    assert not missing, missing


def test_readme_notebook_example_runs(tmp_path):
    from bench.synthetic import write_sweep

    sweep = tmp_path / "smoke"
    write_sweep(sweep)
    readme = (REPO / "README.md").read_text()
    block = re.search(r"In a notebook.*?```python\n(.*?)```", readme, flags=re.S).group(1)
    code = block.replace('"outputs/multirun/smoke"', repr(str(sweep)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


COMMANDS = [
    ["gkd-train", "run.dry_run=true"],
    ["gkd-train", "--cfg", "job"],
    ["gkd-train", "--version"],
    ["gkd-train", "--help"],
    ["gkd-replay", "--version"],
    ["gkd-bench", "--version"],
    ["gkd-dashboard", "--version"],
    ["gkd-analyze", "--help"],
    ["gkd-analyze", "--version"],
    ["gkd-dashboard", "--help"],
    ["gkd-replay", "synthetic"],
    ["gkd-bench", "--help"],
    ["gkd-certify", "--help"],
    ["gkd-certify", "--version"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_documented_command_runs(cmd, tmp_path):
    env = dict(os.environ, GKD_OUTPUT_ROOT=str(tmp_path / "outputs"))
    proc = subprocess.run([entry_point(cmd[0]), *cmd[1:]], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if "--help" in cmd:
        assert "``" not in proc.stdout, "raw RST backticks in --help"
        if cmd[0] in ("gkd-train", "gkd-analyze", "gkd-dashboard", "gkd-certify"):
            assert "Exit codes" in proc.stdout or "exit codes" in proc.stdout.lower(), "--help lists no exit codes"
    if cmd == ["gkd-train", "run.dry_run=true"]:
        assert not (tmp_path / "outputs").exists()


def test_slurm_dry_run_as_documented():
    proc = subprocess.run([sys.executable, "-m", "launch.slurm", "experiment=precision_ab", "hydra.launcher.nodes=2",
                           "hydra.launcher.gpus_per_node=8", "run.dataset=x/y", "--max-points", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "--global_batch_size 16" in proc.stdout and "NNODES=2" in proc.stdout
