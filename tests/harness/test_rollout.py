"""harness.rollout: validation of the rollout group, mapping to ms-swift arguments and subprocess environment.

Runs in the main venv (no vLLM needed); the real vLLM runs are in ``tests/vllm/``.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness import rollout
from harness.rollout import (disable_vllm_cpu_prepack, install_rollout_patches, rollout_args, rollout_engine_name,
                             rollout_env, validate_rollout)

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


def compose_cfg(*overrides: str):
    with initialize_config_dir(CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=["run.output_dir=/tmp/unused", *overrides])


def flag(args: list[str], name: str):
    """Value(s) after ``name`` in an argv list (one value -> str, several -> list), None when absent."""
    if name not in args:
        return None
    i = args.index(name) + 1
    vals = []
    while i < len(args) and not args[i].startswith("--"):
        vals.append(args[i])
        i += 1
    return vals[0] if len(vals) == 1 else vals


# --------------------------------------------------------------------------------------------------------
# config tree
# --------------------------------------------------------------------------------------------------------
def test_default_is_off_policy_and_changes_nothing():
    cfg = compose_cfg()
    assert cfg.rollout.engine == "none" and cfg.gkd.lmbda == 0
    validate_rollout(cfg)
    assert rollout_args(cfg) == ["--use_vllm", "false"]
    assert rollout_env(cfg, device="cpu") == {}


def test_vllm_colocate_maps_to_swift_args():
    cfg = compose_cfg("rollout=vllm_colocate", "model=tiny_vllm", "gkd.lmbda=1", "rollout.max_completion_length=24",
                      "rollout.vllm.gpu_memory_utilization=0.45", "rollout.vllm.tensor_parallel_size=1",
                      "rollout.max_model_len=1024")
    args = rollout_args(cfg)
    assert flag(args, "--use_vllm") == "true"
    assert flag(args, "--vllm_mode") == "colocate"
    assert float(flag(args, "--lmbda")) == 1.0
    assert int(flag(args, "--max_completion_length")) == 24
    assert float(flag(args, "--vllm_gpu_memory_utilization")) == 0.45
    assert int(flag(args, "--vllm_tensor_parallel_size")) == 1
    assert int(flag(args, "--vllm_max_model_len")) == 1024
    assert flag(args, "--vllm_server_host") is None and flag(args, "--vllm_server_base_url") is None
    # every flag is a real ms-swift RLHF argument
    assert_known_swift_flags(args)


def test_vllm_server_maps_to_swift_args():
    cfg = compose_cfg("rollout=vllm_server", "gkd.lmbda=0.5", "rollout.vllm.server.base_url=http://10.0.0.5:8000")
    args = rollout_args(cfg)
    assert flag(args, "--vllm_mode") == "server"
    assert flag(args, "--vllm_server_base_url") == "http://10.0.0.5:8000"
    assert float(flag(args, "--lmbda")) == 0.5
    assert flag(args, "--vllm_gpu_memory_utilization") is None  # colocate-only setting not sent
    cfg = compose_cfg("rollout=vllm_server", "gkd.lmbda=1", "rollout.vllm.server.host=[h1,h2]",
                      "rollout.vllm.server.port=[8000,8001]")
    args = rollout_args(cfg)
    assert flag(args, "--vllm_server_host") == ["h1", "h2"]
    assert flag(args, "--vllm_server_port") == ["8000", "8001"]
    assert_known_swift_flags(args)


def test_hf_engine_is_on_policy_without_vllm():
    cfg = compose_cfg("rollout=hf", "gkd.lmbda=0.25")
    args = rollout_args(cfg)
    assert flag(args, "--use_vllm") == "false"
    assert float(flag(args, "--lmbda")) == 0.25
    assert "--vllm_mode" not in args
    assert rollout_env(cfg, device="cpu") == {"GKD_ROLLOUT_ENGINE": "hf"}
    assert_known_swift_flags(args)


def test_tiny_vllm_model_has_cpu_attention_head_dim():
    cfg = compose_cfg("model=tiny_vllm")
    assert cfg.model.embedded.head_dim >= rollout.VLLM_CPU_MIN_HEAD_DIM
    tiny = compose_cfg()
    # only head_dim differs from the tiny default
    a = OmegaConf.to_container(cfg.model)
    b = OmegaConf.to_container(tiny.model)
    a["embedded"].pop("head_dim"), b["embedded"].pop("head_dim")
    assert a == b


# --------------------------------------------------------------------------------------------------------
# validation: each impossible combination names its key
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, key", [
    (["rollout=vllm_colocate", "gkd.lmbda=0"], "gkd.lmbda"),
    (["rollout=hf", "gkd.lmbda=0"], "gkd.lmbda"),
    (["rollout=none", "gkd.lmbda=0.5"], "gkd.lmbda"),
    (["rollout=vllm_colocate", "gkd.lmbda=1.5"], "gkd.lmbda"),
    (["rollout=vllm_server", "gkd.lmbda=1"], "rollout.vllm.server.base_url"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.mode=remote"], "rollout.vllm.mode"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.engine=sglang"], "rollout.engine"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.gpu_memory_utilization=1.5"],
     "rollout.vllm.gpu_memory_utilization"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.tensor_parallel_size=0"],
     "rollout.vllm.tensor_parallel_size"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.tensor_parallel_size=2", "backend.nproc_per_node=3"],
     "rollout.vllm.tensor_parallel_size"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.max_completion_length=0"], "rollout.max_completion_length"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.max_model_len=64", "rollout.max_completion_length=64"],
     "rollout.max_model_len"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.temperature=0.7", "gkd.temperature=0.9"],
     "rollout.temperature"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.sleep_level=3"], "rollout.vllm.sleep_level"),
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.device=tpu"], "rollout.vllm.device"),
    # vLLM's CPU attention needs head_dim >= 32: the plain tiny model (16) is rejected on the CPU lane
    (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.device=cpu", "model=tiny"], "model.embedded.head_dim"),
])
def test_invalid_combinations_name_the_key(overrides, key):
    cfg = compose_cfg("model=tiny_vllm", *overrides)
    with pytest.raises(ValueError) as err:
        validate_rollout(cfg)
    assert f"`{key}`" in str(err.value), str(err.value)
    with pytest.raises(ValueError):
        rollout_args(cfg)  # never maps an invalid config


def test_cpu_lane_config_is_valid_and_equal_temperature_is_accepted():
    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "model=tiny_vllm", "rollout.vllm.device=cpu",
                      "rollout.temperature=0.9", "gkd.temperature=0.9")
    validate_rollout(cfg)


def test_head_dim_of_a_local_student_is_read_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4}')  # head_dim 16
    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.device=cpu",
                      f"model.student={tmp_path}")
    with pytest.raises(ValueError, match="`model.student`=16"):
        validate_rollout(cfg)


def test_validate_config_delegates_to_rollout():
    from harness.validate import validate_config

    with pytest.raises(ValueError, match="gkd.lmbda"):
        validate_config(compose_cfg("rollout=vllm_colocate", "model=tiny_vllm", "gkd.lmbda=0"))


def test_swift_argv_carries_rollout_flags_once():
    from harness.swift_args import ResolvedInputs, hf_argv

    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "model=tiny_vllm")
    argv = hf_argv(cfg, ResolvedInputs("/s", "/t", "/d.jsonl"), "/tmp/run", device="cpu")
    assert argv.count("--lmbda") == 1 and argv.count("--use_vllm") == 1
    assert flag(argv, "--vllm_mode") == "colocate"
    off = hf_argv(compose_cfg(), ResolvedInputs("/s", "/t", "/d.jsonl"), "/tmp/run", device="cpu")
    assert flag(off, "--use_vllm") == "false" and float(flag(off, "--lmbda")) == 0.0


# --------------------------------------------------------------------------------------------------------
# environment for the ms-swift subprocess
# --------------------------------------------------------------------------------------------------------
def test_cpu_vllm_env_carries_the_workarounds():
    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "model=tiny_vllm")
    env = rollout_env(cfg, device="cpu")
    assert env["VLLM_PLUGINS"] == "none"            # ms-swift's vLLM plugin imports torchvision
    assert env["GKD_VLLM_CPU_NO_PREPACK"] == "1"    # weight sync needs the original linear weights
    assert env["NPROC_PER_NODE"] == "1"             # colocate: external_launcher needs torch.distributed
    assert env["GKD_ROLLOUT_ENGINE"] == "vllm-colocate"
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1


def test_gpu_vllm_env_has_no_cpu_workarounds():
    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "backend.nproc_per_node=4",
                      "rollout.vllm.tensor_parallel_size=2", "rollout.vllm.device=cuda")
    env = rollout_env(cfg, device="cuda")
    assert env == {"GKD_ROLLOUT_ENGINE": "vllm-colocate", "NPROC_PER_NODE": "4"}
    # nproc_per_node null: one per visible GPU as in launch.env, but always emitted (torchrun path)
    auto = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "backend.nproc_per_node=null", "rollout.vllm.device=cpu",
                       "model=tiny_vllm")
    assert rollout_env(auto, device="cpu")["NPROC_PER_NODE"] == "1"
    server = compose_cfg("rollout=vllm_server", "gkd.lmbda=1", "rollout.vllm.server.host=h")
    assert rollout_env(server, device="cuda") == {"GKD_ROLLOUT_ENGINE": "vllm-server"}
    assert rollout_engine_name(server) == "vllm-server"


# --------------------------------------------------------------------------------------------------------
# in-process pieces
# --------------------------------------------------------------------------------------------------------
def test_install_rollout_patches_is_inert_without_the_env(monkeypatch):
    monkeypatch.delenv("GKD_VLLM_CPU_NO_PREPACK", raising=False)
    monkeypatch.delenv("GKD_ROLLOUT_ENGINE", raising=False)
    assert install_rollout_patches() == []


def test_prepack_switch_reports_whether_vllm_is_here():
    # main venv: no vLLM, nothing patched; .venv-vllm: patched (tests/vllm/test_weight_sync.py checks the effect)
    assert disable_vllm_cpu_prepack() is (importlib.util.find_spec("vllm") is not None)


def test_token_count_of_flat_and_multi_turn_responses():
    assert rollout._num_tokens([5, 6, 7]) == 3
    assert rollout._num_tokens([[5, 6], [7, 8, 9]]) == 5
    assert rollout._num_tokens([]) == 0 and rollout._num_tokens(None) == 0


def assert_known_swift_flags(args: list[str]) -> None:
    """Every ``--flag`` is a field of ms-swift's RLHFArguments (so ms-swift would not reject it)."""
    import dataclasses

    from swift.arguments import RLHFArguments

    fields = {f.name for f in dataclasses.fields(RLHFArguments)}
    unknown = [a[2:] for a in args if a.startswith("--") and a[2:] not in fields]
    assert not unknown, unknown
