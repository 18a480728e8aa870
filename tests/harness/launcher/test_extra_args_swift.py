"""``run.extra_args`` through ms-swift's own argument parser in the dry run (issue 24, item 2): before the fix an
unknown flag passed the dry run and failed 25 s into the run with ms-swift's ``remaining_argv`` error."""
from __future__ import annotations

import pytest

from harness.config.schema import ConfigError
from harness.launcher.compose import point_config
from harness.launcher.extra_args import swift_refusal
from harness.launcher.run import dry_run


def test_the_dry_run_refuses_what_ms_swift_refuses(tmp_path):
    cfg, run_dir = point_config(["run.extra_args=[--lora_rnak,8]"], run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^run\.extra_args: ms-swift has no flag --lora_rnak$"):
        dry_run(cfg, run_dir)
    assert swift_refusal(["--lora_rank", "eight"]).startswith("ms-swift refuses it: argument --lora_rank")
    assert swift_refusal(["--tuner_type", "lora", "--lora_rank", "8", "--attn_impl", "sdpa"]) is None
    cfg, run_dir = point_config(["run.extra_args=[--lora_rank,8]"], run_dir=tmp_path / "run")
    assert "--lora_rank 8" in dry_run(cfg, run_dir).replace("\\\n", " ")
    assert not (tmp_path / "run").exists()
