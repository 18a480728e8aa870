"""Hydra's own config errors keep the exit-code contract (issue 24, item 3): an unknown key, an unknown group option
or bad override syntax exits 2 with one line, as the harness's own config errors do, and leaves no folder behind.
Before the fix Hydra printed its multi-line message and exited 1."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import entry_point


@pytest.mark.parametrize(
    "args,named",
    [
        (["gkd.bta=0.5"], "gkd.bta"),  # unknown key
        (["loss=fp33"], "loss/fp33"),  # unknown group option
        (["gkd.beta=[0.5"], "[0.5"),  # bad override syntax
        (["-m", "loss=fp33"], "loss/fp33"),  # the same in a sweep
    ],
)
def test_hydra_config_errors_exit_2_with_one_line(tmp_path, args, named):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("HYDRA_FULL_ERROR", None)
    p = subprocess.run(
        [entry_point("gkd-train"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    lines = p.stderr.strip().splitlines()
    if "Available options in" in p.stderr:  # an unknown preset: the line, then its group's presets (issue 47, 3)
        lines = lines[: lines.index(next(x for x in lines if x.startswith("Available options in")))]
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and lines[0].startswith("gkd-train: invalid config: ") and named in lines[0], p.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/ folder for a config that never composed
