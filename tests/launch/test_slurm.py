"""gkd_harness.launch.slurm: the SLURM dry run (submitit's real sbatch text, per-node env, ms-swift's torchrun command)."""

import re
import shlex

import pytest

from gkd_harness.launch.slurm import dry_run, main, node_slurm_env, sbatch_script, torchrun_command

SEED_2x8 = [
    "experiment=precision_ab",
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.nodes=2",
    "hydra.launcher.gpus_per_node=8",
    "run.dataset=org/gkd-prompts",
    "monitor.eval.dataset=org/gkd-held-out",
]


@pytest.fixture(scope="module")
def seed_dry_run():
    return dry_run(SEED_2x8, max_points=1)


def _node_blocks(text):
    """{node: (dist env line, ms-swift argv, torchrun argv)} of the first point."""
    lines = text.splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = re.match(r"# node (\d+): (.*)", line)
        if m and int(m.group(1)) not in out:
            env = dict(kv.split("=", 1) for kv in m.group(2).split())
            out[int(m.group(1))] = (env, shlex.split(lines[i + 1]), shlex.split(lines[i + 2].lstrip(" ->")))
    return out


def test_sbatch_asks_for_two_nodes_eight_gpus_one_task_each(seed_dry_run):
    text = seed_dry_run
    assert "#SBATCH --nodes=2" in text
    assert "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --array=0-5%6" in text  # precision_ab: 2 variants x 3 seeds, one array job
    assert "#SBATCH --job-name=gkd-precision_ab" in text
    srun = [line for line in text.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and "-m submitit.core._submit" in srun[0]


def test_each_node_gets_its_rank_and_the_shared_rendezvous(seed_dry_run):
    nodes = _node_blocks(seed_dry_run)
    assert sorted(nodes) == [0, 1]
    for rank, (env, swift_cmd, torchrun) in nodes.items():
        assert env == {
            "NPROC_PER_NODE": "8",
            "NNODES": "2",
            "NODE_RANK": str(rank),
            "MASTER_ADDR": "node01",
            "MASTER_PORT": nodes[0][0]["MASTER_PORT"],
        }
        assert swift_cmd[:4] == ["megatron", "rlhf", "--rlhf_type", "gkd"]
        # one torchrun per node (ms-swift's), 8 processes on it
        assert torchrun[:3] == ["python", "-m", "torch.distributed.run"]
        flags = dict(zip(torchrun[3:13:2], torchrun[4:14:2]))
        assert flags == {
            "--nproc_per_node": "8",
            "--master_port": env["MASTER_PORT"],
            "--nnodes": "2",
            "--node_rank": str(rank),
            "--master_addr": "node01",
        }
        assert torchrun[13].endswith("swift/cli/_megatron/rlhf.py")
        assert torchrun[14:] == swift_cmd[2:]


def test_seed_preset_arguments(seed_dry_run):
    _, swift_cmd, _ = _node_blocks(seed_dry_run)[0]
    args = dict(zip(swift_cmd[2::2], swift_cmd[3::2]))
    assert args["--model"] == "Qwen/Qwen3.5-0.8B" and args["--teacher_model"] == "Qwen/Qwen3.5-9B"
    assert args["--tensor_model_parallel_size"] == "1" and args["--pipeline_model_parallel_size"] == "1"
    assert args["--bf16"] == "true" and args["--gkd_logits_topk"] == "64"
    assert args["--beta"] == "0.5" and args["--temperature"] == "0.9" and args["--sft_alpha"] == "0.0"
    assert args["--use_vllm"] == "true" and args["--vllm_mode"] == "colocate"
    # DP = 2 nodes x 8 GPUs / TP1 = 16 data-parallel ranks, micro batch 1
    assert args["--global_batch_size"] == "16"


def test_tasks_per_node_other_than_one_is_refused():
    launcher = {"submitit_folder": "/tmp/x/%j", "tasks_per_node": 8, "nodes": 2, "gpus_per_node": 8}
    with pytest.raises(ValueError, match="hydra.launcher.tasks_per_node"):
        sbatch_script(launcher, 1)


def test_non_slurm_launcher_is_refused():
    with pytest.raises(ValueError, match="hydra/launcher"):
        dry_run(["experiment=smoke"])


def test_torchrun_command_single_process_has_no_torchrun():
    cmd = torchrun_command(["swift", "rlhf", "--rlhf_type", "gkd"], {"PATH": "/bin"})
    assert cmd[0] == "python" and cmd[1].endswith("swift/cli/rlhf.py") and cmd[2:] == ["--rlhf_type", "gkd"]


def test_node_env_is_what_slurm_sets():
    env = node_slurm_env(1, 2, 8, {"NNODES": "stale", "PATH": "/bin"})
    assert env["SLURM_NODEID"] == "1" and env["SLURM_JOB_NUM_NODES"] == "2"
    assert env["SLURM_JOB_NODELIST"] == "node[01-02]" and env["SLURM_GPUS_ON_NODE"] == "8"
    assert "NNODES" not in env and env["PATH"] == "/bin"


def test_cli_prints(capsys):
    assert main([*SEED_2x8, "--max-points", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# SLURM dry run: 6 point(s), 2 node(s) x 8 GPU(s), one task per node")
    assert "# ... 6 more point(s) not shown" in out


def test_wrapped_command_is_the_same_command():
    from gkd_harness.launch.slurm import format_command

    argv = [
        "python",
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "8",
        "--master_addr",
        "node01",
        "/x/rlhf.py",
        "--model",
        "Qwen/Qwen3.5-0.8B",
        "--external_plugins",
        "/x/plugin.py",
        "--flag",
        "--output_dir",
        "/runs/a=1,b=2/swift",
    ]
    text = format_command(argv, wrap=True)
    assert shlex.split(text.replace("\\\n", " ")) == argv
    assert "\n    /x/rlhf.py \\" in text and "--external_plugins /x/plugin.py \\" in text


def test_node_plan_is_the_plan_gkd_train_builds_on_that_node(tmp_path):
    """gkd_harness.launch.slurm prints gkd_harness.harness.launcher.run.make_plan's plan under the node's SLURM variables: same argv, same torchrun
    variables (one copy of the layout arithmetic)."""
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import make_plan
    from gkd_harness.launch.slurm import node_plan

    cfg, run_dir = point_config(["experiment=seed", "run.dataset=x/y"], run_dir=tmp_path / "run")
    for node in (0, 1):
        plan = node_plan(cfg, run_dir, node, 2, 8)
        direct = make_plan(cfg, run_dir, base_env=node_slurm_env(node, 2, 8), dry_run=True)
        assert plan.argv == direct.argv and plan.layout.env() == direct.layout.env()
        assert plan.layout.world_size == 16 and plan.data_parallel_size == 16
        assert plan.argv[plan.argv.index("--global_batch_size") + 1] == "16"


def test_a_point_without_its_dataset_is_one_line_exit_2(capsys):
    """Before: ``python -m gkd_harness.launch.slurm experiment=precision_ab`` (no run.dataset) printed a TypeError traceback from
    deep inside the plan; the dry run now applies gkd-train's own validation first."""
    rc = main(["experiment=precision_ab"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "run.dataset" in err, err
