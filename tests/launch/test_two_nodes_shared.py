"""Multi-node run folders must be shared: the 2-"node" localhost run of ``test_two_nodes`` with a node-local run
folder on node 1 (its own ``run.output_dir``, as a node whose ``/tmp`` or local disk holds the folder).

Every rank checks at train begin that it sees node 0's ``summary.json`` (``gkd_harness.harness.rank.callbacks.
check_run_folder_shared``, one all-reduce), so both nodes stop before the first step and gkd-train on node 0
fails with one line naming the folder and how to set it. Before, the run trained, node 1's rank 1 wrote nothing
node 0 could see (on Megatron, the last rank writes ``metrics.jsonl`` and the dtypes), and node 0 ended with
"the harness plugin never reported" at best.
"""

import pytest

from gkd_harness.harness.launcher.node import free_port
from tests.launch.helpers import read_summary, run_two_localhost_nodes, tail

pytestmark = [pytest.mark.slow, pytest.mark.parallel]


def test_node_local_run_folder_is_refused_at_train_begin(tmp_path):
    run_dirs = {0: tmp_path / "shared" / "run", 1: tmp_path / "node1_local" / "run"}
    port = str(free_port())
    overrides = [
        "experiment=smoke",
        "loss=original",
        "run.max_steps=2",
        "run.grad_accum=1",
        "backend.nproc_per_node=1",
        "run.device=cpu",
        "tracking.wandb.mode=disabled",
    ]
    rcs, out = run_two_localhost_nodes(tmp_path, port, lambda node: [*overrides, f"run.output_dir={run_dirs[node]}"])
    assert rcs[0] != 0 and rcs[1] != 0, f"node0:\n{tail(out[0])}\n\nnode1:\n{tail(out[1])}"

    summary = read_summary(run_dirs[0])
    assert summary["status"] == "failed"
    error = summary["error"]
    assert "RunFolderNotSharedError" in error and f"run folder {run_dirs[0]} is not shared by the 2 nodes" in error
    assert "a rank on another node does not see node 0's summary.json" in error
    assert "set run.output_dir (or GKD_OUTPUT_ROOT)" in error
    assert "\n" not in error  # one line
    # stopped at train begin: no step, no world size recorded (the check comes first)
    assert summary.get("last_step") in (None, 0) and "world_size" not in summary
    assert not (run_dirs[0] / "metrics.jsonl").exists()
    # node 1's own log names itself
    node1_log = (run_dirs[1] / "swift.node1.log").read_text()
    assert f"run folder {run_dirs[1]} is not shared by the 2 nodes: rank 1 on" in node1_log, tail(node1_log)
