"""gkd_harness.harness.launcher.rollout_argv: validation of the rollout group, mapping to ms-swift arguments and subprocess environment.

Configs are composed for real (``gkd_harness.harness.launcher.compose.point_config``). Runs in the main venv (no vLLM needed); the real
vLLM runs are in ``tests/vllm/``. What is installed inside ms-swift's ranks is ``test_rollout_patches.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gkd_harness.harness.config.rollout_rules import VLLM_CPU_MIN_HEAD_DIM, validate_rollout
from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.rollout_argv import needs_torchrun, rollout_args, rollout_engine_name, rollout_env
from gkd_harness.harness.launcher.run import make_plan


def compose_cfg(*overrides: str):
    return point_config(list(overrides), run_dir="/tmp/unused")[0]


def plan_env(cfg, base_env=None) -> dict[str, str]:
    """The variables the launch plan adds for ``cfg`` on a node with ``base_env`` (dry run: nothing built)."""
    return make_plan(cfg, Path(cfg.run.output_dir), base_env=base_env or {}, dry_run=True).env


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
    assert rollout_args(cfg) == ["--lmbda", "0.0", "--use_vllm", "false"]
    assert rollout_env(cfg, device="cpu") == {}
    assert not needs_torchrun(cfg)


def test_vllm_colocate_maps_to_swift_args():
    cfg = compose_cfg(
        "rollout=vllm_colocate",
        "model=tiny_vllm",
        "gkd.lmbda=1",
        "rollout.max_completion_length=24",
        "rollout.vllm.gpu_memory_utilization=0.45",
        "rollout.vllm.tensor_parallel_size=1",
        "rollout.max_model_len=1024",
    )
    validate_rollout(cfg)
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


def test_vllm_colocate_default_memory_share_is_the_yaml_one():
    """configs/rollout/vllm_colocate.yaml is the one home of the default (code once said 0.9, the YAML 0.3)."""
    cfg = compose_cfg("rollout=vllm_colocate", "model=tiny_vllm", "gkd.lmbda=1")
    assert float(flag(rollout_args(cfg), "--vllm_gpu_memory_utilization")) == 0.3


def test_vllm_server_maps_to_swift_args():
    cfg = compose_cfg("rollout=vllm_server", "gkd.lmbda=0.5", "rollout.vllm.server.base_url=http://10.0.0.5:8000")
    validate_rollout(cfg)
    args = rollout_args(cfg)
    assert flag(args, "--vllm_mode") == "server"
    assert flag(args, "--vllm_server_base_url") == "http://10.0.0.5:8000"
    assert float(flag(args, "--lmbda")) == 0.5
    assert flag(args, "--vllm_gpu_memory_utilization") is None  # colocate-only setting not sent
    cfg = compose_cfg(
        "rollout=vllm_server", "gkd.lmbda=1", "rollout.vllm.server.host=[h1,h2]", "rollout.vllm.server.port=[8000,8001]"
    )
    validate_rollout(cfg)
    args = rollout_args(cfg)
    assert flag(args, "--vllm_server_host") == ["h1", "h2"]
    assert flag(args, "--vllm_server_port") == ["8000", "8001"]
    assert_known_swift_flags(args)


def test_hf_engine_is_on_policy_without_vllm():
    cfg = compose_cfg("rollout=hf", "gkd.lmbda=0.25")
    validate_rollout(cfg)
    args = rollout_args(cfg)
    assert flag(args, "--use_vllm") == "false"
    assert float(flag(args, "--lmbda")) == 0.25
    assert "--vllm_mode" not in args
    assert rollout_env(cfg, device="cpu") == {"GKD_ROLLOUT_ENGINE": "hf"}
    assert not needs_torchrun(cfg)
    assert_known_swift_flags(args)


def test_tiny_vllm_model_has_cpu_attention_head_dim():
    cfg = compose_cfg("model=tiny_vllm")
    assert cfg.model.embedded.head_dim >= VLLM_CPU_MIN_HEAD_DIM
    tiny = compose_cfg()
    # only head_dim differs from the tiny default
    a, b = dataclasses.asdict(cfg.model), dataclasses.asdict(tiny.model)
    a["embedded"].pop("head_dim"), b["embedded"].pop("head_dim")
    assert a == b


# --------------------------------------------------------------------------------------------------------
# validation: each impossible combination names its key
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rollout=vllm_colocate", "gkd.lmbda=0"], "gkd.lmbda"),
        (["rollout=hf", "gkd.lmbda=0"], "gkd.lmbda"),
        (["rollout=none", "gkd.lmbda=0.5"], "gkd.lmbda"),
        (["rollout=vllm_colocate", "gkd.lmbda=1.5"], "gkd.lmbda"),
        (["rollout=vllm_server", "gkd.lmbda=1"], "rollout.vllm.server.base_url"),
        (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.mode=remote"], "rollout.vllm.mode"),
        (["rollout=hf", "gkd.lmbda=1", "rollout.engine=sglang"], "rollout.engine"),
        (
            ["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.gpu_memory_utilization=1.5"],
            "rollout.vllm.gpu_memory_utilization",
        ),
        (
            ["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.tensor_parallel_size=0"],
            "rollout.vllm.tensor_parallel_size",
        ),
        (
            ["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.tensor_parallel_size=2", "backend.nproc_per_node=3"],
            "rollout.vllm.tensor_parallel_size",
        ),
        (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.max_completion_length=0"], "rollout.max_completion_length"),
        (
            ["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.max_model_len=64", "rollout.max_completion_length=64"],
            "rollout.max_model_len",
        ),
        (
            ["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.temperature=0.7", "gkd.temperature=0.9"],
            "rollout.temperature",
        ),
        (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.sleep_level=3"], "rollout.vllm.sleep_level"),
        (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.device=tpu"], "rollout.vllm.device"),
        # vLLM's CPU attention needs head_dim >= 32: the plain tiny model (16) is rejected on the CPU lane
        (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.device=cpu", "model=tiny"], "model.embedded.head_dim"),
    ],
)
def test_invalid_combinations_name_the_key(overrides, key):
    """An unknown engine or vLLM mode fails when the job types its config, the rest in ``validate_rollout``."""
    with pytest.raises(ConfigError) as err:
        validate_rollout(compose_cfg("model=tiny_vllm", *overrides))
    assert err.value.key == key and str(err.value).startswith(f"{key}: "), str(err.value)


def test_cpu_lane_config_is_valid_and_equal_temperature_is_accepted():
    cfg = compose_cfg(
        "rollout=vllm_colocate",
        "gkd.lmbda=1",
        "model=tiny_vllm",
        "rollout.vllm.device=cpu",
        "rollout.temperature=0.9",
        "gkd.temperature=0.9",
    )
    validate_rollout(cfg)


def test_head_dim_of_a_local_student_is_read_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4}')  # head_dim 16
    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.device=cpu", f"model.student={tmp_path}")
    with pytest.raises(ConfigError, match=r"^model\.student: 16 is below vLLM's CPU attention minimum"):
        validate_rollout(cfg)


def test_validate_config_delegates_to_rollout():
    from gkd_harness.harness.config.validate import validate_config

    with pytest.raises(ConfigError, match=r"^gkd\.lmbda"):
        validate_config(compose_cfg("rollout=vllm_colocate", "model=tiny_vllm", "gkd.lmbda=0"))


def test_swift_argv_carries_rollout_flags_once():
    from gkd_harness.harness.launcher.swift_argv import ResolvedInputs, hf_argv

    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "model=tiny_vllm")
    argv = hf_argv(cfg, ResolvedInputs("/s", "/t", "/d.jsonl"), "/tmp/run", device="cpu", wandb_mode="offline")
    assert argv.count("--lmbda") == 1 and argv.count("--use_vllm") == 1 and argv.count("--temperature") == 1
    assert flag(argv, "--vllm_mode") == "colocate"
    off = hf_argv(compose_cfg(), ResolvedInputs("/s", "/t", "/d.jsonl"), "/tmp/run", device="cpu", wandb_mode="offline")
    assert flag(off, "--use_vllm") == "false" and float(flag(off, "--lmbda")) == 0.0


# --------------------------------------------------------------------------------------------------------
# environment for the ms-swift subprocess
# --------------------------------------------------------------------------------------------------------
def test_cpu_vllm_env_carries_the_workarounds():
    cfg = compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "model=tiny_vllm")
    env = rollout_env(cfg, device="cpu")
    assert env["VLLM_PLUGINS"] == "none"  # ms-swift's vLLM plugin imports torchvision
    assert env["GKD_VLLM_CPU_NO_PREPACK"] == "1"  # weight sync needs the original linear weights
    assert env["GKD_ROLLOUT_ENGINE"] == "vllm-colocate"
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1
    # colocate: external_launcher needs torch.distributed even for one process -> ms-swift's torchrun path
    assert needs_torchrun(cfg)
    plan = plan_env(compose_cfg("rollout=vllm_colocate", "gkd.lmbda=1", "model=tiny_vllm", "run.device=cpu"))
    assert plan["NPROC_PER_NODE"] == "1" and plan["NNODES"] == "1"
    assert plan["VLLM_PLUGINS"] == "none" and plan["GKD_ROLLOUT_ENGINE"] == "vllm-colocate"


def test_gpu_vllm_env_has_no_cpu_workarounds():
    cfg = compose_cfg(
        "rollout=vllm_colocate",
        "gkd.lmbda=1",
        "backend.nproc_per_node=4",
        "rollout.vllm.tensor_parallel_size=2",
        "rollout.vllm.device=cuda",
    )
    validate_rollout(cfg)
    env = rollout_env(cfg, device="cuda")
    assert env == {"GKD_ROLLOUT_ENGINE": "vllm-colocate"}
    assert plan_env(cfg)["NPROC_PER_NODE"] == "4"
    # nproc_per_node null: one per visible GPU in SLURM, else 1, but always emitted (torchrun path)
    auto = compose_cfg(
        "rollout=vllm_colocate",
        "gkd.lmbda=1",
        "backend.nproc_per_node=null",
        "rollout.vllm.device=cpu",
        "model=tiny_vllm",
        "run.device=cpu",
    )
    assert rollout_env(auto, device="cpu")["GKD_ROLLOUT_ENGINE"] == "vllm-colocate"
    assert plan_env(auto)["NPROC_PER_NODE"] == "1"
    server = compose_cfg("rollout=vllm_server", "gkd.lmbda=1", "rollout.vllm.server.host=h")
    assert rollout_env(server, device="cuda") == {"GKD_ROLLOUT_ENGINE": "vllm-server"}
    assert rollout_engine_name(server) == "vllm-server" and not needs_torchrun(server)


def assert_known_swift_flags(args: list[str]) -> None:
    """Every ``--flag`` is a field of ms-swift's RLHFArguments (so ms-swift would not reject it)."""
    from swift.arguments import RLHFArguments

    fields = {f.name for f in dataclasses.fields(RLHFArguments)}
    unknown = [a[2:] for a in args if a.startswith("--") and a[2:] not in fields]
    assert not unknown, unknown
