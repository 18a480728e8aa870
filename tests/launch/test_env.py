"""launch.env: the NNODES / NODE_RANK / MASTER_* / NPROC_PER_NODE mapping ms-swift's torchrun reads."""

import pytest

from launch.env import DIST_KEYS, is_main_node, parse_slurm_nodelist, slurm_port, swift_launch_env


def _dist(env):
    return {k: env[k] for k in DIST_KEYS if k in env}


def test_single_process_single_node_gets_no_torchrun_but_a_private_port():
    env = swift_launch_env({"backend": {"nproc_per_node": 1}}, {"PATH": "/bin", "NNODES": "1", "NPROC_PER_NODE": "1"})
    dist = _dist(env)
    assert set(dist) == {"MASTER_ADDR", "MASTER_PORT"}  # ms-swift's use_torchrun() looks at NPROC_PER_NODE/NNODES
    assert dist["MASTER_ADDR"] == "127.0.0.1" and 0 < int(dist["MASTER_PORT"]) < 65536
    assert env["PATH"] == "/bin"
    # an explicit port is kept
    assert swift_launch_env({"backend": {"nproc_per_node": 1, "master_port": 31001}}, {})["MASTER_PORT"] == "31001"


def test_single_node_multi_process_gets_a_free_port_and_localhost():
    env = swift_launch_env({"backend": {"nproc_per_node": 2}}, {})
    assert env["NPROC_PER_NODE"] == "2" and env["NNODES"] == "1" and env["NODE_RANK"] == "0"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(env["MASTER_PORT"]) < 65536


def test_base_env_is_not_modified():
    base = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511"}
    snapshot = dict(base)
    swift_launch_env({"backend": {"nproc_per_node": 1}}, base)
    assert base == snapshot


def test_hand_started_node_process_keeps_its_rendezvous():
    """The 2-"node" localhost layout: each node process carries NNODES/NODE_RANK/MASTER_* in its env."""
    base = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    env = swift_launch_env({"backend": {"nproc_per_node": 1}}, base)
    assert _dist(env) == {"NPROC_PER_NODE": "1", "NNODES": "2", "NODE_RANK": "1",
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


@pytest.mark.parametrize("node", [0, 1])
def test_slurm_two_nodes_eight_gpus(node):
    base = {"SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NODEID": str(node), "SLURM_GPUS_ON_NODE": "8", "NNODES": "9", "MASTER_ADDR": "stale"}
    env = swift_launch_env({"backend": {"nproc_per_node": None}}, base)
    assert _dist(env) == {"NPROC_PER_NODE": "8", "NNODES": "2", "NODE_RANK": str(node),
                          "MASTER_ADDR": "gpu-a07", "MASTER_PORT": str(20000 + 123456 % 20000)}
    assert is_main_node(base) == (node == 0)


def test_slurm_port_is_the_same_on_every_node_and_in_range():
    assert slurm_port("98765") == slurm_port(98765) == 20000 + 98765 % 20000
    assert slurm_port("98765_3") == slurm_port("987653")  # array task ids keep digits only
    assert all(20000 <= slurm_port(j) < 40000 for j in (0, 1, 19999, 20000, 10**9))


def test_config_wins_over_slurm():
    base = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "3"}
    cfg = {"backend": {"nproc_per_node": 4, "master_port": 31000, "master_addr": "10.1.2.3"}}
    env = swift_launch_env(cfg, base)
    assert _dist(env) == {"NPROC_PER_NODE": "4", "NNODES": "4", "NODE_RANK": "3",
                          "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "31000"}


def test_slurm_gpus_per_node_typed_form():
    base = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0",
            "SLURM_GPUS_PER_NODE": "h100:8"}
    assert swift_launch_env({}, base)["NPROC_PER_NODE"] == "8"


@pytest.mark.parametrize("nodelist,hosts", [
    ("node01", ["node01"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[1-2],b5", ["a1", "a2", "b5"]),
])
def test_parse_slurm_nodelist(nodelist, hosts):
    assert parse_slurm_nodelist(nodelist) == hosts


@pytest.mark.parametrize("cfg,base,key", [
    ({"backend": {"nproc_per_node": "eight"}}, {}, "backend.nproc_per_node"),
    ({"backend": {"nproc_per_node": 0}}, {}, "backend.nproc_per_node"),
    ({"backend": {"nproc_per_node": 1}}, {"NNODES": "2", "NODE_RANK": "2", "MASTER_PORT": "1"}, "NODE_RANK"),
    ({"backend": {"nproc_per_node": 1}}, {"NNODES": "2", "NODE_RANK": "1"}, "MASTER_PORT"),
    ({"backend": {"nproc_per_node": 2, "master_port": 70000}}, {}, "backend.master_port"),
])
def test_bad_values_name_the_key(cfg, base, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        swift_launch_env(cfg, base)


def test_accepts_omegaconf():
    from omegaconf import OmegaConf

    env = swift_launch_env(OmegaConf.create({"backend": {"name": "hf", "nproc_per_node": 2}}), {})
    assert env["NPROC_PER_NODE"] == "2"
