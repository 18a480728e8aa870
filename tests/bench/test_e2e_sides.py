"""``gkd-bench --only e2e`` (issue 41 item 8): bare ``swift rlhf`` is the plan's own command without the harness,
and the three sides' rows and ratios. The runs themselves are the benchmark's (minutes); these are the parts."""

from pathlib import Path

import pytest

from gkd_harness.bench.cli import GOALS, group_cases
from gkd_harness.bench.e2e import bare_command, e2e_ratio, parse_plan

PLAN = """# gkd-train dry run: run folder /r
# node 0 of 1: 1 process(es), device cpu, data-parallel size 1, torchrun no
GKD_HARNESS_PLUGIN_SETTINGS=/r/plugin_settings.json
WANDB_DIR=/r/wandb
WANDB_RUN_ID=abc
swift rlhf \\
    --rlhf_type gkd \\
    --dataset '/data/a b.jsonl' \\
    --output_dir /r/swift \\
    --external_plugins /x/plugin.py \\
    --callbacks gkd_harness \\
    --report_to wandb
"""


def test_the_bare_side_is_the_plans_command_without_the_harness(tmp_path):
    env, argv = parse_plan(PLAN)
    assert env == {
        "GKD_HARNESS_PLUGIN_SETTINGS": "/r/plugin_settings.json",
        "WANDB_DIR": "/r/wandb",
        "WANDB_RUN_ID": "abc",
    }
    assert argv[:4] == ["swift", "rlhf", "--rlhf_type", "gkd"] and "/data/a b.jsonl" in argv
    benv, bargv = bare_command(env, argv, tmp_path)
    assert "--external_plugins" not in bargv and "--callbacks" not in bargv and "gkd_harness" not in bargv
    assert bargv[bargv.index("--output_dir") + 1] == str(Path(tmp_path) / "swift")
    assert bargv[-2:] == ["--report_to", "wandb"]
    assert "GKD_HARNESS_PLUGIN_SETTINGS" not in benv and benv["WANDB_DIR"] == str(Path(tmp_path) / "wandb")


def test_rows_ratio_and_goal():
    assert group_cases("e2e") == ["e2e/bare", "e2e/monitor_off", "e2e/monitor_default"]
    assert any(g.name == "e2e/monitor_off" and g.limit == 1.05 for g in GOALS)
    base = {"cpu_s": [0.04, 0.04, 0.05, 0.03], "wall_s": [0.1] * 4, "round_mean_s": [0.04, 0.04]}
    side = {"cpu_s": [0.05, 0.04, 0.04, 0.05], "wall_s": [0.2] * 4, "round_mean_s": [0.044, 0.046]}
    r = e2e_ratio(side, base)
    assert r["time_ratio"] == pytest.approx(0.045 / 0.04)
    assert r["time_ratio_range"] == pytest.approx((1.1, 1.15)) and r["wall_ratio"] == pytest.approx(2.0)


def test_small_shape_groups():
    assert group_cases("small_v") == ["small_v/upstream", "small_v/fp32"]
    assert group_cases("small_n") == ["small_n/upstream", "small_n/fp32"]
