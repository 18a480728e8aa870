"""The README's SLURM dry run, verbatim, from a fresh shell (issue 40, item 7).

Before: the README said ``python -m gkd_harness.launch.slurm ... run.dataset=<ds>``, which fails in a fresh shell
(no ``python`` on PATH; ``<ds>`` is a shell redirection), and after the README's ``cp configs/local/slurm.example.yaml
configs/local/default.yaml`` the dry run stopped at the first path this machine does not have (exit 2), so on a
login node nobody saw the plan until every path was real.

The test copies the package into a temporary checkout (so the copied ``configs/local/default.yaml`` never lands in
the shared tree), links ``.venv`` to this one, and runs the README's block line by line with ``bash`` under
``env -i`` (a fresh HOME, PATH without the venv), except the last command, which would submit to SLURM.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gkd_harness.launch.slurm import placeholders, unchecked_paths
from tests.launch.helpers import REPO, task_config


def _readme_slurm_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Running a real sweep on a cluster", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    commands, current = [], ""
    for line in block.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            commands.append(current.strip())
            current = ""
    return commands


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checkout")

    def ignore(folder: str, names: list[str]) -> list[str]:
        mine = Path(folder).name == "local" and Path(folder).parent.name == "configs"  # a site's own settings
        return [n for n in names if n in ("__pycache__", "_version.py") or (mine and n == "default.yaml")]

    shutil.copytree(REPO / "gkd_harness", root / "gkd_harness", ignore=ignore, symlinks=True)
    for folder in ("configs", "launch"):
        (root / folder).symlink_to(Path("gkd_harness") / folder)
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


def test_the_readme_slurm_dry_run_works_verbatim_from_a_fresh_shell(checkout, tmp_path):
    commands = _readme_slurm_block()
    assert commands[0].startswith("cp configs/local/slurm.example.yaml configs/local/default.yaml")
    assert commands[1].startswith(".venv/bin/python -m gkd_harness.launch.slurm ")
    assert commands[2].startswith(".venv/bin/gkd-train -m ")  # submits: not run here
    home = tmp_path / "home"
    home.mkdir()
    env = ["env", "-i", f"HOME={home}", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]
    outputs = []
    for command in commands[:2]:
        proc = subprocess.run([*env, "bash", "-c", command], cwd=checkout, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
        outputs.append(proc.stdout)
    text = outputs[1]
    assert text.startswith("# SLURM dry run: 6 point(s), 2 node(s) x 8 GPU(s)")
    assert "#SBATCH --partition=YOUR_PARTITION" in text and "#SBATCH --nodes=2" in text
    top = [line for line in text.splitlines() if line.startswith("# placeholders to fill in")]
    assert len(top) == 1 and "hydra.launcher.partition=YOUR_PARTITION" in top[0]
    assert "run.dataset=/path/to/train.jsonl" in top[0] and "tracking.wandb.entity=YOUR_WANDB_ENTITY" in top[0]
    unchecked = [line for line in text.splitlines() if line.startswith("# unchecked")]
    assert len(unchecked) == 6  # one per point
    assert "run.dataset=/path/to/train.jsonl" in unchecked[0]
    assert "monitor.eval.dataset=/path/to/heldout.jsonl" in unchecked[0]
    assert text.count("--dataset /path/to/train.jsonl") == 6 * 2 * 2  # 6 points x 2 nodes x (ms-swift, torchrun)


def test_unchecked_paths_are_the_missing_local_ones(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n')
    cfg = task_config(["experiment=precision_ab", f"run.dataset={data}", "monitor.eval.dataset=/nope/heldout.jsonl"])
    assert unchecked_paths(cfg) == {"monitor.eval.dataset": "/nope/heldout.jsonl"}  # hub ids, existing files: not
    assert placeholders({"a": {"b": ["x", "YOUR_ACCOUNT"], "c": "/path/to/x", "d": 3}}) == [
        "a.b.1=YOUR_ACCOUNT",
        "a.c=/path/to/x",
    ]


def test_a_wrong_value_is_still_refused_with_unchecked_paths(capsys):
    from gkd_harness.launch.slurm import main

    rc = main(
        ["experiment=precision_ab", "run.dataset=/nope/train.jsonl", "monitor.eval.dataset=/nope/h.jsonl", "gkd.beta=2"]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "gkd.beta" in err, err
