"""One launch plan: what ``gkd-train run.dry_run=true`` prints on a node is what ``python -m gkd_harness.launch.slurm`` prints for
that node, and what ``gkd-train`` executes there (issue: the dry run showed --global_batch_size 16 while the node
passed 8, because two copies of the layout arithmetic drifted apart).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from gkd_harness.harness.config.schema import MegatronBackendConfig
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.plan import build_plan
from gkd_harness.harness.launcher.run import make_plan
from gkd_harness.harness.launcher.swift_argv import megatron_batch_sizes
from gkd_harness.launch.slurm import node_plan, node_slurm_env
from tests.conftest import entry_point

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "configs" / "experiment").glob("*.yaml"))
CONFIG_ROOT = Path(__file__).resolve().parents[3] / "configs"
MEGATRON_EXPERIMENTS = [
    e
    for e in EXPERIMENTS
    if re.search(r"override /backend: megatron", (CONFIG_ROOT / "experiment" / f"{e}.yaml").read_text())
]
TWO_NODE_SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "0",
}


def _overrides(experiment: str, out: Path) -> list[str]:
    return [f"experiment={experiment}", "run.dataset=x/y", "monitor.eval.dataset=x/val", f"run.output_dir={out}"]


def _dry_run(overrides, env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NNODES", "NODE_RANK", "MASTER_"))}
    env.update(env_extra)
    return subprocess.run(
        [entry_point("gkd-train"), *overrides, "run.dry_run=true"], env=env, capture_output=True, text=True, timeout=120
    )


def _argv_and_vars(text: str) -> tuple[list[str], dict]:
    """The command and the ``KEY=value`` lines of a printed plan."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    env = dict(ln.split("=", 1) for ln in lines if re.match(r"^[A-Z_][A-Z0-9_]*=", ln))
    cmd = " ".join(ln.rstrip("\\").strip() for ln in lines if not re.match(r"^[A-Z_][A-Z0-9_]*=", ln))
    return shlex.split(cmd), env


def test_seed_on_two_slurm_nodes_prints_global_batch_16(tmp_path):
    """The acceptance command: 2 nodes x 8 GPUs, DP 16 -> --global_batch_size 16 and NNODES=2."""
    proc = _dry_run(["experiment=seed", "run.dataset=x/y"], {**TWO_NODE_SLURM, "SLURM_GPUS_ON_NODE": "8"})
    assert proc.returncode == 0, proc.stderr
    argv, env = _argv_and_vars(proc.stdout)
    assert argv[argv.index("--global_batch_size") + 1] == "16"
    assert env["NNODES"] == "2" and env["NODE_RANK"] == "0" and env["NPROC_PER_NODE"] == "8"
    assert not (tmp_path / "outputs").exists()


def test_dry_run_writes_nothing_and_loads_nothing(tmp_path):
    out = tmp_path / "run"
    proc = _dry_run(
        [f"run.output_dir={out}", f"hydra.run.dir={tmp_path / 'h'}"], {"GKD_HARNESS_CACHE": str(tmp_path / "c")}
    )
    assert proc.returncode == 0, proc.stderr
    assert "swift rlhf" in proc.stdout and "--use_cpu true" in proc.stdout
    assert not out.exists() and not (tmp_path / "h").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_gkd_train_dry_run_equals_slurm_node0(experiment, nodes, tmp_path):
    """For every preset on 1 and 2 nodes, node 0's plan in gkd_harness.launch.slurm equals gkd-train's own dry run there."""
    out = tmp_path / "run"
    cfg, run_dir = point_config(_overrides(experiment, out))
    slurm_plan = node_plan(cfg, run_dir, 0, nodes, 8)
    node_env = node_slurm_env(0, nodes, 8)
    proc = _dry_run(_overrides(experiment, out), node_env)
    assert proc.returncode == 0, proc.stderr
    argv, env = _argv_and_vars(proc.stdout)
    assert argv == slurm_plan.argv
    for key in ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"):
        assert env.get(key) == slurm_plan.env.get(key), key
    assert env["NNODES"] == str(nodes) if slurm_plan.layout.torchrun else "NNODES" not in env


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("experiment", MEGATRON_EXPERIMENTS)
def test_megatron_global_batch_is_a_multiple_of_micro_batch_times_dp(experiment, nodes, tmp_path):
    cfg, run_dir = point_config(_overrides(experiment, tmp_path / "run"))
    assert isinstance(cfg.backend, MegatronBackendConfig)
    plan = node_plan(cfg, run_dir, 0, nodes, 8)
    gbs = int(plan.argv[plan.argv.index("--global_batch_size") + 1])
    dp, _ = megatron_batch_sizes(cfg.backend, plan.layout, cfg.run.grad_accum)
    assert dp == nodes * 8 // (
        cfg.backend.tensor_model_parallel_size
        * cfg.backend.pipeline_model_parallel_size
        * cfg.backend.context_parallel_size
    )
    assert gbs % (cfg.backend.micro_batch_size * dp) == 0


def test_megatron_single_process_still_uses_torchrun(tmp_path):
    """Megatron's init_process_group(env://) needs RANK/WORLD_SIZE even for one process: torchrun always."""
    cfg, run_dir = point_config(
        [
            "experiment=seed",
            "run.dataset=x/y",
            "backend.nproc_per_node=1",
            "rollout=none",
            "gkd.lmbda=0",
            f"run.output_dir={tmp_path}",
        ]
    )
    plan = make_plan(cfg, run_dir, base_env={}, dry_run=True)
    assert plan.layout.torchrun and plan.env["NPROC_PER_NODE"] == "1" and plan.env["NNODES"] == "1"


def test_hf_single_process_runs_without_torchrun_and_drops_stale_variables(tmp_path):
    cfg, run_dir = point_config([f"run.output_dir={tmp_path}"])
    plan = make_plan(cfg, run_dir, base_env={"NPROC_PER_NODE": "4"}, dry_run=True)
    # NPROC_PER_NODE from the shell counts as the layout when the config leaves it null; here it is 1
    assert cfg.backend.nproc_per_node == 1 and not plan.layout.torchrun
    full = plan.process_env({"NPROC_PER_NODE": "4", "NNODES": "3"})
    assert "NPROC_PER_NODE" not in full and "NNODES" not in full and full["MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.parametrize("backend", ["hf", "megatron"])
def test_the_ranks_never_join_the_callers_wandb_service(tmp_path, backend):
    """A caller with a live wandb run (a notebook, an agent, a test process) has WANDB_SERVICE set; ranks that joined
    that service left the killed run's stream open in it, and the resume's same run id was refused ("run ID ... is in
    use"). The ranks start their own service."""
    cfg, run_dir = point_config([f"run.output_dir={tmp_path}", f"backend={backend}"])
    plan = make_plan(cfg, run_dir, base_env={}, dry_run=True)
    full = plan.process_env({"WANDB_SERVICE": "3-123-unix-/tmp/wandb-123/socket", "PATH": "/usr/bin"})
    assert "WANDB_SERVICE" not in full and full["PATH"] == "/usr/bin" and full["WANDB_RUN_ID"]


def test_explicit_global_batch_not_divisible_is_refused_naming_the_key(tmp_path):
    from gkd_harness.harness.config.schema import ConfigError

    cfg, run_dir = point_config(
        ["experiment=seed", "run.dataset=x/y", "backend.global_batch_size=12", f"run.output_dir={tmp_path}"]
    )
    with pytest.raises(ConfigError, match="backend.global_batch_size"):
        node_plan(cfg, run_dir, 0, 2, 8)


def test_seed_preset_has_no_boundary_cast_on_megatron(tmp_path):
    """Issue 11: Megatron's FP32 student must not be cast down to BF16 at the loss boundary."""
    proc = _dry_run(["experiment=seed", "run.dataset=x/y", f"run.output_dir={tmp_path}"], {})
    assert proc.returncode == 0, proc.stderr
    assert "loss boundary: no cast" in proc.stdout
    default = _dry_run([f"run.output_dir={tmp_path}"], {})
    assert "teacher logits cast to bfloat16" in default.stdout  # the CPU emulation of the mixed case
    cfg, _ = point_config(["experiment=seed", "run.dataset=x/y", f"run.output_dir={tmp_path}"])
    assert cfg.model.student_dtype is None and cfg.model.teacher_dtype is None


def test_boundary_cast_on_megatron_is_refused_unless_asked_for(tmp_path):
    bad = _dry_run(["experiment=seed", "run.dataset=x/y", "model.student_dtype=bfloat16"], {})
    assert bad.returncode == 2 and "model.student_dtype" in bad.stderr and "Traceback" not in bad.stderr
    ok = _dry_run(
        ["experiment=seed", "run.dataset=x/y", "model.student_dtype=bfloat16", "model.megatron_boundary_cast=true"], {}
    )
    assert ok.returncode == 0, ok.stderr


def test_build_plan_is_the_only_place_argv_is_made():
    """gkd-train's executed plan and its dry run are the same object type from the same function."""
    import gkd_harness.harness.launcher.run as train_mod

    assert train_mod.build_plan is build_plan
    src = Path(train_mod.__file__).read_text()
    assert "build_argv" not in src and "hf_argv" not in src and "megatron_argv" not in src


def test_submitit_local_gives_cuda_points_their_gpus():
    """Issue 11: with gpus_per_node null, submitit_local set CUDA_VISIBLE_DEVICES='' and hid every GPU."""
    from gkd_harness.harness.launcher.compose import compose

    assert compose(["hydra/launcher=submitit_local", "run.device=cpu"]).hydra.launcher.gpus_per_node == 0
    gpu = compose(["hydra/launcher=submitit_local", "run.device=cuda", "backend.nproc_per_node=4"])
    assert gpu.hydra.launcher.gpus_per_node == 4
    seed = compose(["hydra/launcher=submitit_local", "experiment=seed", "run.dataset=x/y", "run.device=cuda"])
    assert seed.hydra.launcher.gpus_per_node == 8
