"""Megatron layouts are checked against ms-swift 4.6.0's own constraints before launch (issue 23: TP2/PP2/CP2 on
8 GPUs defaulted to --global_batch_size 1, which ms-swift's rollout split asserts on at the first on-policy step).

The constraints, read from ms-swift's source and restated here independently of the harness's arithmetic:
- ``MegatronArguments._init_distributed``: data-parallel = world / (TP x PP x CP); the global batch divides by
  micro x DP, with at least one micro-batch;
- ``MegatronArguments.resolve_generation_batch_size``: with neither ``--generation_batch_size`` nor
  ``--steps_per_generation`` (the harness passes neither; asserted) the generation batch is the global batch;
- ``MegatronRolloutMixin._get_local_rollout_batch``: each DP rank's share of the generation batch divides by the
  rollout group TP x PP x CP (on-policy steps only: ``gkd.lmbda`` > 0).
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest

from gkd_harness.harness.config.schema import ConfigError, MegatronBackendConfig
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.launch.slurm import node_plan

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "configs" / "experiment").glob("*.yaml"))
LAYOUTS = list(itertools.product([1, 2], [1, 2], [1, 2]))


def _swift_accepts(world: int, tp: int, pp: int, cp: int, micro: int, gbs: int, on_policy: bool) -> bool:
    mp = tp * pp * cp
    if world % mp:
        return False
    dp = world // mp
    if gbs % (micro * dp) or gbs // (micro * dp) == 0:
        return False
    gen = gbs
    return not on_policy or (gen // dp) % mp == 0


def _base(experiment, tmp_path):
    base = [
        f"experiment={experiment}",
        "run.dataset=x/y",
        "monitor.eval.dataset=x/val",
        f"run.output_dir={tmp_path / 'run'}",
    ]
    if not isinstance(point_config(base)[0].backend, MegatronBackendConfig):  # an HF preset, laid out on Megatron
        base.append("backend=megatron_seed")
    return base


def _cfg(experiment, tmp_path, *extra):
    return point_config([*_base(experiment, tmp_path), *extra])


@pytest.fixture(scope="module")
def layout_configs(tmp_path_factory):
    """{experiment: [(tp, pp, cp, cfg, run_dir)]}, each preset's 8 layouts composed once for both node counts (the
    composition does not depend on the node count; it was done twice, and the HF-or-Megatron check once per layout)."""
    root, cache = tmp_path_factory.mktemp("layouts"), {}

    def get(experiment):
        if experiment not in cache:
            base = _base(experiment, root / experiment)
            cache[experiment] = [
                (
                    tp,
                    pp,
                    cp,
                    *point_config(
                        [
                            *base,
                            f"backend.tensor_model_parallel_size={tp}",
                            f"backend.pipeline_model_parallel_size={pp}",
                            f"backend.context_parallel_size={cp}",
                        ]
                    ),
                )
                for tp, pp, cp in LAYOUTS
            ]
        return cache[experiment]

    return get


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_preset_and_layout_gets_a_global_batch_ms_swift_accepts(experiment, nodes, layout_configs):
    for tp, pp, cp, cfg, run_dir in layout_configs(experiment):
        cfg = copy.deepcopy(cfg)  # the plan gets a config of its own, as after a fresh composition
        plan = node_plan(cfg, run_dir, 0, nodes, 8)
        gbs = int(plan.argv[plan.argv.index("--global_batch_size") + 1])
        assert "--generation_batch_size" not in plan.argv and "--steps_per_generation" not in plan.argv
        assert _swift_accepts(nodes * 8, tp, pp, cp, cfg.backend.micro_batch_size, gbs, cfg.gkd.lmbda > 0), (
            experiment,
            nodes,
            tp,
            pp,
            cp,
            gbs,
        )


def test_the_issues_tp2_pp2_cp2_seed_run_gets_a_batch_its_rollout_group_can_split(tmp_path):
    cfg, run_dir = _cfg(
        "seed",
        tmp_path,
        "backend.tensor_model_parallel_size=2",
        "backend.pipeline_model_parallel_size=2",
        "backend.context_parallel_size=2",
    )
    plan = node_plan(cfg, run_dir, 0, 1, 8)
    assert plan.argv[plan.argv.index("--global_batch_size") + 1] == "8"  # was 1: 1 % 8 != 0 in rollout_mixin.py
    assert any("x 8 (each data-parallel rank's rollout batch" in n for n in plan.notes)


@pytest.mark.parametrize(
    "extra,key",
    [
        (["backend.global_batch_size=4"], "backend.global_batch_size"),  # DP 1, rollout group 8: 4 % 8
        (["backend.nproc_per_node=6"], "backend.tensor_model_parallel_size"),  # 6 processes over 8
    ],
)
def test_an_impossible_layout_is_refused_naming_the_keys(extra, key, tmp_path):
    cfg, run_dir = _cfg(
        "seed",
        tmp_path,
        "backend.tensor_model_parallel_size=2",
        "backend.pipeline_model_parallel_size=2",
        "backend.context_parallel_size=2",
        *extra,
    )
    with pytest.raises(ConfigError) as e:
        node_plan(cfg, run_dir, 0, 1, 8 if "nproc" not in extra[0] else 6)
    assert key in str(e.value) and "context_parallel_size" in str(e.value)


def test_off_policy_keeps_the_plain_default(tmp_path):
    cfg, run_dir = _cfg("seed", tmp_path, "backend.tensor_model_parallel_size=2", "gkd.lmbda=0", "rollout=none")
    plan = node_plan(cfg, run_dir, 0, 1, 8)
    assert plan.argv[plan.argv.index("--global_batch_size") + 1] == "4"  # micro 1 x DP 4 x grad accum 1


def test_megatron_saves_resumable_checkpoints_with_run_save_steps(tmp_path):
    """run.resume=true on Megatron (refused before issue 31): with run.save_steps N ms-swift saves a checkpoint every N
    steps with the optimizer (no --no_save_optim), so a requeue continues from it (gkd_harness.harness.launcher.resume:
    --mcore_model DIR --finetune false, tests/harness/launcher/test_resume.py); without run.save_steps the last
    step's checkpoint holds weights only, unless run.resume=true asks to keep the optimizer too."""

    def argv(*overrides):
        cfg, run_dir = _cfg("seed", tmp_path, *overrides)
        return node_plan(cfg, run_dir, 0, 1, 8).argv

    resumable = argv("run.resume=true", "run.save_steps=5")
    assert resumable[resumable.index("--save_steps") + 1] == "5" and "--no_save_optim" not in resumable
    assert "--no_save_optim" not in argv("run.resume=true")
    plain = argv("run.resume=false", "run.save_steps=null")  # the seed preset itself checkpoints and resumes
    assert plain[plain.index("--no_save_optim") + 1] == "true" and "--save_steps" not in plain
