"""The seed presets checkpoint often enough that a requeue loses little (issue 41, item 7: they saved no checkpoint,
so a preempted seed run could only restart from step 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gkd_harness.harness.config.validate import validate_config
from gkd_harness.harness.launcher.run import make_plan
from tests.launch.helpers import task_config


@pytest.mark.parametrize("name", ["seed", "seed_hf"])
def test_the_seed_presets_checkpoint_every_tenth_of_the_run_and_resume(name, monkeypatch):
    # the presets name hub models, which no cache here holds: validated as on a cluster node with hub access
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = task_config([f"experiment={name}", "run.dataset=org/gkd-prompts"])
    validate_config(cfg)  # run.extra_args checked against ms-swift's flags where the table is cached
    assert cfg.run.resume is True and cfg.run.save_steps == 10 and cfg.run.max_steps == 100
    argv = make_plan(cfg, Path("/tmp/run"), base_env={}, dry_run=True).argv
    args = dict(zip(argv[2::2], argv[3::2]))
    assert args["--save_steps"] == "10" and args["--save_total_limit"] == "2"
    if cfg.backend.name != "megatron":
        assert args["--save_strategy"] == "steps" and args["--save_only_model"] == "false"  # optimizer state kept
