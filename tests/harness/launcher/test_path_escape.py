"""Nothing escapes the output root (issue 32, item 1): before the fix `cd esc && gkd-train -m
'loss.name=../../../../ESC' run.max_steps=2 tracking.wandb.group=escreal` exited 0 with its run folder at
`esc/outputs/ESC,run.max_steps=2`, and `model.template=` did the same. Now Hydra gets a stand-in folder name inside
the output root, the job refuses the key in one line, and the sweep reports the point as failed (exit 2)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import entry_point


@pytest.mark.parametrize("multirun", [True, False])
def test_a_parent_path_in_a_folder_naming_key_is_refused_and_nothing_leaves_the_output_root(tmp_path, multirun):
    cwd = tmp_path / "a" / "b" / "esc"
    cwd.mkdir(parents=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("GKD_OUTPUT_ROOT", None)
    args = [
        *(["-m"] if multirun else []),
        "model.template=../../../../ESC",
        "run.max_steps=2",
        "tracking.wandb.group=escreal",
    ]
    p = subprocess.run([entry_point("gkd-train"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == (
        "gkd-train: invalid config: model.template: must not contain a path separator (part of a run folder's "
        "name, it would leave the output root), got '../../../../ESC'"
    )
    assert sorted(x.name for x in cwd.iterdir()) in ([], ["outputs"])
    assert [str(x.relative_to(tmp_path)) for x in tmp_path.rglob("*ESC*")] == []
    if multirun:
        assert "1 failed" in p.stdout, p.stdout[-2000:]
