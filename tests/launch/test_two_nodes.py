"""Multi-node without a cluster: a 2-"node" GKD run on localhost through the real gkd-train and ms-swift.

Two node processes (``gkd-train``, one per "node", as submitit_slurm starts one task per node) get
``NNODES=2``, ``NODE_RANK`` 0 / 1 and one rendezvous (``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) in
their environment. Each builds its launch plan (``gkd_harness.harness.launcher.plan``, the layout from
``gkd_harness.harness.launcher.node.node_layout``: the SLURM path's mapping) and starts ms-swift's CLI, whose own torchrun
(``--nnodes 2 --node_rank i``, one process per node) joins one gloo process group on the CPU (``--use_cpu true``).
Checked: the training world size is 2 across the "nodes", and the harness's rank reduction counts both ranks'
loss calls.
"""

import json

import pytest

from gkd_harness.harness.launcher.node import free_port
from tests.launch.helpers import read_metrics, read_summary, run_two_localhost_nodes, tail

pytestmark = [pytest.mark.slow, pytest.mark.parallel]

STEPS = 2


def test_two_node_localhost_run(tmp_path):
    run_dir = tmp_path / "run"
    port = str(free_port())
    overrides = [
        "experiment=smoke",
        "loss=original",
        f"run.max_steps={STEPS}",
        "run.grad_accum=1",
        "backend.nproc_per_node=1",
        "run.device=cpu",
        "tracking.wandb.mode=disabled",
        f"run.output_dir={run_dir}",
    ]
    rcs, out = run_two_localhost_nodes(tmp_path, port, lambda node: overrides)
    assert rcs == [0, 0], f"node0:\n{tail(out[0])}\n\nnode1:\n{tail(out[1])}"

    # each node ran ms-swift's torchrun with the node's place in the 2-node rendezvous (ms-swift's output goes to
    # the node's log in the run folder: swift.log on the main node, swift.node<N>.log on the others)
    swift_logs = {0: run_dir / "swift.log", 1: run_dir / "swift.node1.log"}
    for node, path in swift_logs.items():
        text = path.read_text()
        assert f"--nnodes 2 --node_rank {node} --master_addr 127.0.0.1" in text, tail(text)
    env = json.loads((run_dir / "command.json").read_text())["env"]
    assert env["NNODES"] == "2" and env["MASTER_PORT"] == port and env["NPROC_PER_NODE"] == "1"

    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["world_size"] == 2  # the process group ms-swift trained in spans both "nodes"

    last = read_metrics(run_dir)[-1]
    assert last["step"] == STEPS
    # one GKD loss call per rank per optimizer step (grad_accum 1): summed over both ranks by the harness
    assert last["gkd/loss_calls_total"] == 2 * STEPS
    assert 0 <= last["gkd/neg_loss_calls_total"] <= last["gkd/loss_calls_total"]
