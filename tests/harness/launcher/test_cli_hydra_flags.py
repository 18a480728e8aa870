"""Hydra's own flags on ``gkd-train``'s command line (issue 47, item 2).

Before: the argv pre-parse in ``launcher/cli.py`` took every word not starting with ``-`` for an override, so a
short flag's value became one: ``gkd-train -cd myconf experiment=mine run.dry_run=true`` exited 2 with ``Error
parsing override 'myconf'`` (docs/cluster.md's wheel guide uses exactly this), and ``-c job`` / ``-cn train`` the
same. Now Hydra's own argument parser reads the command line first.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from gkd_harness.harness.launcher.cli import hydra_command_line
from tests.conftest import entry_point


@pytest.mark.parametrize(
    "argv,flag,value",
    [
        (["-cd", "myconf", "experiment=mine"], "config_dir", "myconf"),
        (["--config-dir", "myconf", "experiment=mine"], "config_dir", "myconf"),
        (["-cp", "/abs/conf", "experiment=mine"], "config_path", "/abs/conf"),
        (["--config-path=/abs/conf", "experiment=mine"], "config_path", "/abs/conf"),
        (["-cn", "train", "experiment=mine"], "config_name", "train"),
        (["--config-name", "train", "experiment=mine"], "config_name", "train"),
        (["-c", "job", "experiment=mine"], "cfg", "job"),
        (["--cfg", "job", "--resolve", "experiment=mine"], "cfg", "job"),
        (["-p", "gkd", "--cfg", "job", "experiment=mine"], "package", "gkd"),
        (["-m", "experiment=mine"], "multirun", True),
    ],
)
def test_a_flags_value_is_never_an_override(argv, flag, value):
    parsed = hydra_command_line(argv)
    assert parsed.overrides == ["experiment=mine"]
    assert getattr(parsed, flag) == value


def _gkd_train(cwd, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "GKD_OUTPUT_ROOT": str(cwd / "out")}
    return subprocess.run(
        [entry_point("gkd-train"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def myconf(tmp_path):
    """A user's config dir with an experiment of its own (docs/cluster.md's wheel guide)."""
    folder = tmp_path / "myconf" / "experiment"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - smoke\nrun:\n  name: mine_from_myconf\n")
    return tmp_path


@pytest.mark.parametrize("flag", ["-cd", "--config-dir"])
def test_dry_run_with_a_users_config_dir(myconf, flag):
    p = _gkd_train(myconf, flag, "myconf", "experiment=mine", "run.dry_run=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "# gkd-train dry run" in p.stdout and "--run_name mine_from_myconf" in p.stdout


def test_dry_run_with_a_config_name(tmp_path):
    p = _gkd_train(tmp_path, "-cn", "train", "experiment=smoke", "run.dry_run=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "# gkd-train dry run" in p.stdout


@pytest.mark.parametrize("flag", ["-c", "--cfg"])
def test_print_the_job_config_with_a_dry_run_override(tmp_path, flag):
    p = _gkd_train(tmp_path, flag, "job", "gkd.beta=0.25", "run.dry_run=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "beta: 0.25" in p.stdout and "dry_run: true" in p.stdout
