"""launch/gpu_check.sh and launch.gpu_check, checked on the CPU: commands, configs, repro, table verdicts."""

import json
import re
import shlex
import subprocess

import pytest

from launch.gpu_check import judge_repro, seed_repro, table
from tests.launch.helpers import REPO, compose, task_config
from harness.validate import validate_config
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser


@pytest.fixture(scope="module")
def dry_commands(tmp_path_factory):
    out = subprocess.run(["bash", str(REPO / "launch" / "gpu_check.sh"), "--dry-run"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                     "GKD_CHECK_DIR": str(tmp_path_factory.mktemp("chk"))})
    assert out.returncode == 0, out.stderr
    cmds = {}
    for line in out.stdout.splitlines():
        if line.startswith("+ ["):
            name = line[3:line.index("]")]
            cmds[name] = shlex.split(line.split(": ", 1)[1]) if ": " in line else shlex.split(line.split("] ", 1)[1])
    return cmds


def test_all_checks_are_there(dry_commands):
    assert list(dry_commands) == ["repro", "megatron", "hf_bf16", "vllm_colocate", "bench"]
    assert dry_commands["bench"][:3] == ["gkd-bench", "--device", "cuda"]
    assert dry_commands["repro"][-2:] == ["--device", "cuda"]


@pytest.mark.parametrize("name", ["megatron", "hf_bf16", "vllm_colocate"])
def test_gpu_check_runs_are_valid_configs(dry_commands, name):
    argv = dry_commands[name]
    assert argv[0] == "gkd-train"
    overrides = [a for a in argv[1:] if a != "-m"]
    parsed = OverridesParser.create().parse_overrides(overrides)  # expanded as Hydra's basic sweeper does
    points = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    assert len(points) == (2 if name == "megatron" else 1)
    for job in points:
        cfg = task_config(compose(job))
        validate_config(cfg)
        if name == "megatron":
            assert cfg.backend.name == "megatron" and cfg.backend.tensor_model_parallel_size == 1
            assert cfg.model.student_dtype is None and cfg.model.teacher_dtype is None  # no harness cast
        if name == "vllm_colocate":
            assert cfg.rollout.vllm.mode == "colocate" and cfg.gkd.lmbda == 1.0
        if name == "hf_bf16":
            assert cfg.model.torch_dtype == cfg.model.teacher_dtype == "bfloat16"


def test_seed_repro_on_cpu_reproduces_the_report():
    rec = seed_repro("cpu")
    v = rec["variants"]
    assert rec["upstream_native"] < 0 and v["native"]["loss"] < 0  # BF16 teacher arithmetic: negative JSD
    assert v["fp32"]["loss"] > 0 and v["fp64"]["loss"] > 0
    assert abs(v["fp32"]["loss"] - v["fp64"]["loss"]) <= 1e-4 * abs(v["fp64"]["loss"]) + 2e-6
    assert v["fp32"]["grad_rel_l2"] <= 1e-3 < v["native"]["grad_rel_l2"]
    assert judge_repro(rec)[0] == "PASS"


def _run(tmp_path, name, precision, neg, dtypes, status="completed"):
    d = tmp_path / "group" / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"status": status, "error": None if status == "completed" else
                                                "TrainingFailed: boom", "last_step": 8,
                                                "config": {"loss.precision": precision}, "dtypes_arrived": dtypes}))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 8, "gkd/neg_loss_calls_total": neg,
                                                 "gkd/loss_calls_total": 8, "spot/loss_rel_err": 1e-7}) + "\n")


def test_table_verdicts(tmp_path):
    mixed = {"student": "float32", "teacher": "bfloat16"}
    _run(tmp_path, "loss=original", "native", 5, mixed)
    _run(tmp_path, "loss=fp32", "fp32", 0, mixed)
    rec = {"check": "megatron", "rc": 0, "wall_s": 100, "group_dir": str(tmp_path / "group"),
           "expect": {"student_dtype": "float32", "teacher_dtype": "bfloat16", "neg_calls": "by_precision"}}
    text, ok = table([rec])
    assert ok and text.count("PASS") == 2, text

    _run(tmp_path, "loss=fp64", "fp64", 1, {"student": "bfloat16", "teacher": "bfloat16"})  # negatives + dtypes
    text, ok = table([rec])
    assert not ok and re.search(r"^megatron/loss=fp64 +FAIL ", text, re.M) and "student dtype bfloat16 != float32" in text
    assert re.search(r"^megatron/loss=fp32 +PASS ", text, re.M)

    _run(tmp_path, "x", "fp32", 0, mixed, status="failed")
    text, ok = table([{**rec, "expect": {}}])
    assert re.search(r"^megatron/x +FAIL .*TrainingFailed: boom", text, re.M)


def test_missing_run_folder_fails(tmp_path):
    text, ok = table([{"check": "hf_bf16", "rc": 124, "group_dir": str(tmp_path / "nothing"), "expect": {}}])
    assert not ok and "status missing" in text
