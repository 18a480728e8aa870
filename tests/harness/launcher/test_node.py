"""gkd_harness.harness.launcher.node: the NNODES / NODE_RANK / MASTER_* / NPROC_PER_NODE layout ms-swift's torchrun reads.

The ``backend`` group comes from real Hydra composition; the node's environment is a plain mapping (a SLURM
task's variables, or a hand-started node process).
"""

from pathlib import Path

import pytest

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.node import (
    DIST_KEYS,
    detect_device,
    is_main_node,
    node_layout,
    slurm_hosts,
    slurm_port,
)


def backend(*overrides):
    return point_config(list(overrides), run_dir="/tmp/unused")[0].backend


def test_single_process_single_node_gets_no_torchrun_but_a_private_port():
    layout = node_layout(backend("backend.nproc_per_node=1"), {"PATH": "/bin", "NNODES": "1", "NPROC_PER_NODE": "1"})
    assert not layout.torchrun and layout.world_size == 1
    dist = layout.env()
    assert set(dist) == {"MASTER_ADDR", "MASTER_PORT"}  # ms-swift's use_torchrun() looks at NPROC_PER_NODE/NNODES
    assert dist["MASTER_ADDR"] == "127.0.0.1" and 0 < int(dist["MASTER_PORT"]) < 65536
    # an explicit port is kept
    assert node_layout(backend("backend.master_port=31001"), {}).env()["MASTER_PORT"] == "31001"


def test_process_env_drops_stale_torchrun_variables_and_keeps_the_rest(tmp_path):
    """The ms-swift process of a single-process run must not inherit NNODES/NPROC_PER_NODE (ms-swift would then
    start torchrun); everything else of the node's environment is kept."""
    from gkd_harness.harness.launcher.run import make_plan

    cfg = point_config(["backend.nproc_per_node=1", "run.device=cpu"], run_dir=tmp_path)[0]
    base = {"PATH": "/bin", "NNODES": "1", "NPROC_PER_NODE": "1", "NODE_RANK": "0"}
    env = make_plan(cfg, Path(tmp_path), base_env=base, dry_run=True).process_env(base)
    assert env["PATH"] == "/bin" and not {"NNODES", "NPROC_PER_NODE", "NODE_RANK"} & set(env)
    assert env["MASTER_ADDR"] == "127.0.0.1"


def test_single_node_multi_process_gets_a_free_port_and_localhost():
    env = node_layout(backend("backend.nproc_per_node=2"), {}).env()
    assert env["NPROC_PER_NODE"] == "2" and env["NNODES"] == "1" and env["NODE_RANK"] == "0"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(env["MASTER_PORT"]) < 65536


def test_port_picker_is_used_for_a_single_node_without_a_port():
    assert node_layout(backend(), {}, port_picker=lambda: 31234).master_port == 31234


def test_forced_torchrun_for_one_process():
    """Megatron and a colocated vLLM need torch.distributed even for one process (gkd_harness.harness.launcher.plan forces it)."""
    layout = node_layout(backend("backend.nproc_per_node=1"), {}, force_torchrun=True)
    assert layout.torchrun and layout.env()["NPROC_PER_NODE"] == "1" and layout.env()["NNODES"] == "1"


def test_base_env_is_not_modified():
    base = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511"}
    snapshot = dict(base)
    node_layout(backend("backend.nproc_per_node=1"), base)
    assert base == snapshot


def test_hand_started_node_process_keeps_its_rendezvous():
    """The 2-"node" localhost layout: each node process carries NNODES/NODE_RANK/MASTER_* in its env."""
    base = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    layout = node_layout(backend("backend.nproc_per_node=1"), base)
    assert layout.env() == {
        "NPROC_PER_NODE": "1",
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511",
    }
    assert set(layout.env()) == set(DIST_KEYS)


@pytest.mark.parametrize("node", [0, 1])
def test_slurm_two_nodes_eight_gpus(node):
    base = {
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NODELIST": "gpu-a[07-08]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": str(node),
        "SLURM_GPUS_ON_NODE": "8",
        "NNODES": "9",
        "MASTER_ADDR": "stale",
    }
    layout = node_layout(backend("backend.nproc_per_node=null"), base)
    assert layout.env() == {
        "NPROC_PER_NODE": "8",
        "NNODES": "2",
        "NODE_RANK": str(node),
        "MASTER_ADDR": "gpu-a07",
        "MASTER_PORT": str(20000 + 123456 % 20000),
    }
    assert layout.world_size == 16
    assert is_main_node(base) == (node == 0)


def test_slurm_port_is_the_same_on_every_node_and_in_range():
    assert slurm_port("98765") == slurm_port(98765) == 20000 + 98765 % 20000
    assert slurm_port("98765_3") == slurm_port("987653")  # array task ids keep digits only
    assert all(20000 <= slurm_port(j) < 40000 for j in (0, 1, 19999, 20000, 10**9))


def test_config_wins_over_slurm():
    base = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "3"}
    b = backend("backend.nproc_per_node=4", "backend.master_port=31000", "backend.master_addr=10.1.2.3")
    assert node_layout(b, base).env() == {
        "NPROC_PER_NODE": "4",
        "NNODES": "4",
        "NODE_RANK": "3",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "31000",
    }


def test_slurm_gpus_per_node_typed_form():
    base = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_GPUS_PER_NODE": "h100:8",
    }
    assert node_layout(backend("backend=megatron"), base, force_torchrun=True).env()["NPROC_PER_NODE"] == "8"


@pytest.mark.parametrize(
    "nodelist,hosts",
    [
        ("node01", ["node01"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[1-2],b5", ["a1", "a2", "b5"]),
        # issue 47, item 1: a suffix after the brackets (an InfiniBand host name); the hand parser gave gpu01, gpu02
        # and a host "-ib"
        ("gpu[01-02]-ib", ["gpu01-ib", "gpu02-ib"]),
        ("gpu[01-02]-ib,cpu7-ib", ["gpu01-ib", "gpu02-ib", "cpu7-ib"]),
        # nested: two bracket groups in one host name (rack, node)
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("h100-[008-010],cpu[9-11]", ["h100-008", "h100-009", "h100-010", "cpu9", "cpu10", "cpu11"]),
    ],
)
def test_slurm_hosts(nodelist, hosts):
    assert slurm_hosts(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["gpu[01-02", "gpu[0a-3]", "a,,b", ""])
def test_an_unreadable_node_list_names_the_variable(nodelist):
    with pytest.raises(ConfigError) as err:
        slurm_hosts(nodelist)
    assert err.value.key == "SLURM_JOB_NODELIST"


def test_master_addr_keeps_the_host_suffix():
    """Issue 47, item 1: ``gpu[01-02]-ib`` gave ``MASTER_ADDR=gpu01``; the rendezvous host is ``gpu01-ib``."""
    base = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]-ib", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}
    assert node_layout(backend("backend.nproc_per_node=8"), base).env()["MASTER_ADDR"] == "gpu01-ib"


def test_non_integer_process_count_fails_at_compose():
    with pytest.raises(ConfigError, match=r"^backend\.nproc_per_node: "):
        backend("backend.nproc_per_node=eight")


@pytest.mark.parametrize(
    "overrides,base,key",
    [
        (["backend.nproc_per_node=0"], {}, "backend.nproc_per_node"),
        (["backend.nproc_per_node=1"], {"NNODES": "2", "NODE_RANK": "2", "MASTER_PORT": "1"}, "backend.node_rank"),
        (["backend.nproc_per_node=1"], {"NNODES": "2", "NODE_RANK": "1"}, "backend.master_port"),
        (["backend.nproc_per_node=2", "backend.master_port=70000"], {}, "backend.master_port"),
        (["backend.nproc_per_node=1"], {"NNODES": "two"}, "NNODES"),
    ],
)
def test_bad_values_name_the_key(overrides, base, key):
    with pytest.raises(ConfigError) as err:
        node_layout(backend(*overrides), base)
    assert err.value.key == key, str(err.value)


def test_node_rank_error_names_the_variables_it_came_from():
    with pytest.raises(ConfigError, match="NODE_RANK"):
        node_layout(backend(), {"NNODES": "2", "NODE_RANK": "2", "MASTER_PORT": "1"})


@pytest.mark.parametrize(
    "run_device,env,expected",
    [
        ("cpu", {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "8"}, "cpu"),
        ("cuda", {}, "cuda"),
        ("auto", {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_GPUS_ON_NODE": "8"}, "cuda"),
        ("auto", {"CUDA_VISIBLE_DEVICES": ""}, "cpu"),
        ("auto", {"CUDA_VISIBLE_DEVICES": "-1"}, "cpu"),
    ],
)
def test_detect_device_without_torch(run_device, env, expected):
    assert detect_device(run_device, env) == expected


def test_main_node_outside_slurm():
    assert is_main_node({}) and is_main_node({"NODE_RANK": "0"}) and not is_main_node({"NODE_RANK": "1"})


@pytest.mark.parametrize(
    "nodelist",
    ["node01", "gpu[01-03,07]", "a[1-2],b5", "h100-[008-010],cpu[9-11]", "x[0]", "gpu[01-02]-ib", "r[1-2]n[1-2]"],
)
def test_slurm_hosts_are_submitits_public_hostnames(nodelist, monkeypatch):
    """The node list as submitit's public ``JobEnvironment().hostnames`` reads it inside a job."""
    from submitit.slurm.slurm import SlurmJobEnvironment

    monkeypatch.setenv("SLURM_JOB_NODELIST", nodelist)
    assert slurm_hosts(nodelist) == SlurmJobEnvironment().hostnames


def test_node_parses_no_node_list_by_hand_and_says_why_it_uses_a_private_submitit_name():
    """Before: a regex parser of its own (issue 47, item 1). Now submitit's parser, with the reason it is the private
    one in the comment above the import."""
    import ast
    import inspect

    from gkd_harness.harness.launcher import node

    source = inspect.getsource(node)
    assert "re.findall" not in source and "parse_slurm_nodelist" not in source
    lines = source.splitlines()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("submitit"):
            if any(a.name.startswith("_") for a in n.names):
                assert "no public" in " ".join(lines[max(0, n.lineno - 4) : n.lineno - 1]), n.lineno
