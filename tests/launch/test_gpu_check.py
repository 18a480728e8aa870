"""launch/gpu_check.sh and gkd_harness.launch.gpu_check, checked on the CPU: preflight rows, commands, configs, timeouts,
install commands, repro, table verdicts."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from gkd_harness.harness.config.validate import validate_config
from gkd_harness.launch.gpu_check import PREFLIGHT, judge_repro, preflight_row, seed_repro, table
from tests.launch.helpers import REPO, task_config


def _dry_run(tmp_path, *args, **env):
    return subprocess.run(
        ["bash", str(REPO / "launch" / "gpu_check.sh"), "--dry-run", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GKD_CHECK_DIR": str(tmp_path), **env},
    )


def _cuda_here() -> bool:
    import torch

    return torch.version.cuda is not None and torch.cuda.is_available()


@pytest.fixture(scope="module")
def dry_run_proc(tmp_path_factory):
    return _dry_run(tmp_path_factory.mktemp("chk"))


@pytest.fixture(scope="module")
def dry_run(dry_run_proc):
    assert dry_run_proc.returncode in (0, 1), dry_run_proc.stderr
    return dry_run_proc.stdout


@pytest.fixture(scope="module")
def dry_commands(dry_run):
    cmds = {}
    for line in dry_run.splitlines():
        if line.startswith("+ ["):
            name = line[3 : line.index("]")]
            cmds[name] = shlex.split(line.split(": ", 1)[1]) if ": " in line else shlex.split(line.split("] ", 1)[1])
    return cmds


def test_dry_run_prints_the_table_with_preflight_rows(dry_run_proc):
    """On this CPU machine: one preflight row per prerequisite, each naming what is missing here (MISSING, never
    FAIL), then the planned checks with their timeouts, those whose prerequisites are missing as WOULD-SKIP; the
    exit status says whether the plan would run (issue 40, item 10: it showed MISSING / FAIL rows and exited 0)."""
    dry_run = dry_run_proc.stdout
    table_part = dry_run.split("== gkd-harness GPU check (dry run)", 1)[1]
    rows = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^(\S+)\s+(PASS|FAIL|PLAN|SKIP|WARN|MISSING|WOULD-SKIP)\s+\S+\s+(.*)$", table_part, re.M)
    }
    assert [r for r in rows if r.startswith("preflight/")] == [f"preflight/{name}" for name, *_ in PREFLIGHT]
    assert not [r for r, (verdict, _) in rows.items() if verdict == "FAIL"], table_part
    import torch

    verdict, detail = rows["preflight/torch_cuda"]
    if torch.version.cuda is None:
        assert verdict == "MISSING" and f"torch {torch.__version__} is a CPU build" in detail
        assert dry_run_proc.returncode == 1
        assert rows["repro"][0] == "WOULD-SKIP" and "preflight found missing: torch_cuda" in rows["repro"][1]
        assert re.search(r"^plan: 0/5 checks would run; the plan would NOT run in full", table_part, re.M)
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is None:
        assert (
            rows["preflight/transformer_engine"] == ("MISSING", rows["preflight/transformer_engine"][1])
            and "missing: transformer-engine is not installed" in rows["preflight/transformer_engine"][1]
        )
        if importlib.util.find_spec("mcore_bridge") is not None:  # installed, but its import needs TE
            assert rows["preflight/mcore_bridge"][0] == "MISSING"
            assert "No module named 'transformer_engine'" in rows["preflight/mcore_bridge"][1]
    if importlib.util.find_spec("vllm") is None:
        assert "missing: vllm is not installed" in rows["preflight/vllm"][1]
    for name in ("repro", "megatron", "hf_bf16", "vllm_colocate", "bench"):
        assert rows[name][0] in ("PLAN", "WOULD-SKIP") and re.search(r"timeout \d+ s \(estimate \d+ s\)", rows[name][1])
    would_run = [name for name, (verdict, _) in rows.items() if verdict == "PLAN"]
    assert dry_run_proc.returncode == (0 if len(would_run) == 5 else 1)


def test_the_dry_run_table_exits_by_whether_the_plan_would_run(tmp_path):
    """The plan's table and exit: every prerequisite there, exit 0; one missing, its preflight row MISSING, the
    check that needs it WOULD-SKIP, exit 1."""
    from gkd_harness.launch.gpu_check import main

    plan = {"check": "repro", "planned": "python -m x", "estimate_s": 20, "timeout_s": 100, "missing": ""}
    here = {"check": "preflight/torch_cuda", "rc": 0, "detail": "torch 2.6, CUDA 12.4, 1 GPU(s)"}
    gone = {"check": "preflight/vllm", "rc": 1, "detail": "missing: vllm is not installed"}
    text, ok = table([here, plan], dry_run=True)
    assert ok and text.endswith("plan: 1/1 checks would run"), text
    skipped = {**plan, "check": "vllm_colocate", "missing": "vllm"}
    text, ok = table([here, gone, plan, skipped], dry_run=True)
    assert not ok and "FAIL" not in text
    assert re.search(r"^preflight/vllm +MISSING .*vllm is not installed", text, re.M)
    assert re.search(r"^vllm_colocate +WOULD-SKIP .*preflight found missing: vllm", text, re.M)
    assert text.endswith(
        "plan: 1/2 checks would run; the plan would NOT run in full (a prerequisite is missing): exit 1"
    )
    for records, code in (([here, plan], 0), ([here, gone, plan, skipped], 1)):
        path = tmp_path / f"checks{code}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        assert main(["table", "--dry-run", str(path)]) == code


def test_timeouts_come_from_the_stated_estimates(dry_run):
    """Each check's timeout is 2 x the estimate in the script's header + 60 s."""
    header = (REPO / "launch" / "gpu_check.sh").read_text()
    stated = {
        m.group(1).split("/")[0]: int(m.group(2)) for m in re.finditer(r"^#\s+(\S+)\s+est\s+(\d+) s", header, re.M)
    }
    assert set(stated) == {"repro", "megatron", "hf_bf16", "vllm_colocate", "bench"}
    for m in re.finditer(r"^\+ \[(\w+)\] timeout (\d+)s:", dry_run, re.M):
        assert int(m.group(2)) == 2 * stated[m.group(1)] + 60, m.group(0)


def _install_line(tmp_path, **env) -> str:
    """The ``+ ... pip install ...`` line of ``gpu_check.sh --dry-run --install``. The script prints it (and writes
    constraints.txt) before its preflight, which it does not depend on, so the script is stopped there: the
    preflight's fresh interpreters took most of this test's time (74 s on 2 loaded cores)."""
    import os
    import signal

    proc = subprocess.Popen(
        ["bash", str(REPO / "launch" / "gpu_check.sh"), "--dry-run", "--install"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GKD_CHECK_DIR": str(tmp_path), **env},
    )
    try:
        for line in proc.stdout:
            if " pip install " in line:
                return line.rstrip("\n")
        raise AssertionError(f"no pip install line; exit {proc.wait()}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        proc.stdout.close()


def test_install_from_the_registry_or_a_wheelhouse_keeps_torch(tmp_path):
    import torch

    pinned = torch.__version__.split("+")[0]
    line = _install_line(tmp_path / "a")
    assert "--no-index" not in line and line.endswith("-e .[gpu,bench]")
    assert (tmp_path / "a" / "constraints.txt").read_text().strip() == f"torch=={pinned}"
    line = _install_line(tmp_path / "b", WHEELHOUSE=str(tmp_path / "wheels"))
    assert f"--no-index --find-links {tmp_path / 'wheels'} -c " in line


def test_preflight_row_names_what_is_missing(tmp_path, monkeypatch):
    row = preflight_row("nope", "gkd_no_such_module", "gkd-no-such-dist", "install it from X")
    assert row == {
        "check": "preflight/nope",
        "rc": 1,
        "detail": "missing: gkd-no-such-dist is not installed; install it from X",
    }
    (tmp_path / "gkd_broken_mod").mkdir()
    (tmp_path / "gkd_broken_mod" / "__init__.py").write_text("import gkd_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    row = preflight_row("broken", "gkd_broken_mod", "gkd-broken-mod", "-")
    assert (
        row["rc"] == 1
        and "installed but `import gkd_broken_mod` fails: ModuleNotFoundError: No module named 'gkd_missing_dependency'"
        in row["detail"]
    )
    assert preflight_row("json", "json", "gkd-no-dist", "-")["rc"] == 0  # importable without a distribution


def test_all_checks_are_there(dry_commands):
    assert list(dry_commands) == ["repro", "megatron", "hf_bf16", "vllm_colocate", "bench"]
    assert Path(dry_commands["bench"][0]).name == "gkd-bench" and dry_commands["bench"][1:3] == ["--device", "cuda"]
    assert dry_commands["repro"][-2:] == ["--device", "cuda"]


@pytest.mark.parametrize("name", ["megatron", "hf_bf16", "vllm_colocate"])
def test_gpu_check_runs_are_valid_configs(dry_commands, name):
    argv = dry_commands[name]
    assert Path(argv[0]).name == "gkd-train"
    overrides = [a for a in argv[1:] if a != "-m"]
    parsed = OverridesParser.create().parse_overrides(overrides)  # expanded as Hydra's basic sweeper does
    points = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    assert len(points) == (2 if name == "megatron" else 1)
    for job in points:
        cfg = task_config(job)
        validate_config(cfg)
        if name == "megatron":
            assert cfg.backend.name == "megatron" and cfg.backend.tensor_model_parallel_size == 1
            assert cfg.model.student_dtype is None and cfg.model.teacher_dtype is None  # no harness cast
        if name == "vllm_colocate":
            assert cfg.rollout.vllm.mode == "colocate" and cfg.gkd.lmbda == 1.0
            assert cfg.rollout.vllm.enforce_eager is True and cfg.model.torch_dtype == "bfloat16"
        if name == "hf_bf16":
            assert cfg.model.torch_dtype == cfg.model.teacher_dtype == "bfloat16"


def test_seed_repro_on_cpu_reproduces_the_report():
    """The repro against the independent FP64 reference (harness/loss/reference.py): upstream negative (the defect,
    a finding), fp32 positive and within the loss suite's tolerances (a check)."""
    rec = seed_repro("cpu")
    assert rec["upstream"] < 0 < rec["reference"] and rec["finding"] == "reproduced"
    fix = rec["fix"]
    assert fix["ok"] and fix["loss"] > 0 and fix["grad_rel_l2"] <= fix["grad_tol"] and not fix["why"]
    assert judge_repro(rec) == [
        ("repro/defect", "FOUND", judge_repro(rec)[0][2]),
        ("repro/fix", "PASS", judge_repro(rec)[1][2]),
    ]


def test_repro_rows_can_fail_and_the_defect_is_a_finding():
    """Upstream not negative is NOT FOUND (a finding, not a pass or a fail); a fix row with a negative loss FAILs
    the table."""
    rec = seed_repro("cpu")
    assert rec["sign"] and rec["gradient"] and rec["upstream_grad_rel_l2"] > 1e-2
    text, ok = table([{**rec, "upstream": 1e-4, "finding": "not reproduced"}])
    assert ok and re.search(r"^repro/defect +NOT FOUND", text, re.M) and re.search(r"^repro/fix +PASS", text, re.M)
    bad = {**rec, "fix": {**rec["fix"], "ok": False, "loss": -1e-3, "why": "negative loss -1.000e-03"}}
    text, ok = table([bad])
    assert not ok and re.search(r"^repro/fix +FAIL .*negative loss", text, re.M)


def test_the_table_exit_says_whether_the_defect_reproduced(tmp_path):
    """gpu_check.sh's last command: exit 4 when the repro's defect was not found (the fix held), 1 when the fix
    failed, 0 when both claims hold."""
    from gkd_harness.launch.gpu_check import main

    rec = seed_repro("cpu")
    bad = {**rec, "fix": {**rec["fix"], "ok": False, "why": "negative loss"}}
    cases = ((rec, 0), ({**rec, "finding": "not reproduced"}, 4), (bad, 1), ({**bad, "finding": "not reproduced"}, 5))
    for i, (record, code) in enumerate(cases):
        path = tmp_path / f"checks{i}.jsonl"
        path.write_text(json.dumps(record) + "\n")
        assert main(["table", str(path)]) == code, record["finding"]


def _run(tmp_path, name, precision, neg, dtypes, status="completed"):
    d = tmp_path / "group" / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": status,
                "error": None if status == "completed" else "TrainingFailed: boom",
                "last_step": 8,
                "config": {"loss.precision": precision},
                "dtypes_arrived": dtypes,
            }
        )
    )
    (d / "metrics.jsonl").write_text(
        json.dumps({"step": 8, "gkd/neg_loss_calls_total": neg, "gkd/loss_calls_total": 8, "spot/loss_rel_err": 1e-7})
        + "\n"
    )


def test_table_verdicts(tmp_path):
    mixed = {"student": "float32", "teacher": "bfloat16"}
    _run(tmp_path, "loss=original", "native", 5, mixed)
    _run(tmp_path, "loss=fp32", "fp32", 0, mixed)
    rec = {
        "check": "megatron",
        "rc": 0,
        "wall_s": 100,
        "group_dir": str(tmp_path / "group"),
        "expect": {"student_dtype": "float32", "teacher_dtype": "bfloat16", "neg_calls": "by_precision"},
    }
    text, ok = table([rec])
    assert ok and text.count("PASS") == 2, text

    _run(tmp_path, "loss=fp64", "fp64", 1, {"student": "bfloat16", "teacher": "bfloat16"})  # negatives + dtypes
    text, ok = table([rec])
    assert (
        not ok and re.search(r"^megatron/loss=fp64 +FAIL ", text, re.M) and "student dtype bfloat16 != float32" in text
    )
    assert re.search(r"^megatron/loss=fp32 +PASS ", text, re.M)

    _run(tmp_path, "x", "fp32", 0, mixed, status="failed")
    text, ok = table([{**rec, "expect": {}}])
    assert re.search(r"^megatron/x +FAIL .*TrainingFailed: boom", text, re.M)


def test_missing_run_folder_fails(tmp_path):
    text, ok = table([{"check": "hf_bf16", "rc": 124, "group_dir": str(tmp_path / "nothing"), "expect": {}}])
    assert not ok and "status missing" in text


# ------------------------------------------------------------------------------------------------ issue 47, item 6
def test_the_dry_run_works_from_a_fresh_shell_with_the_venvs_entry_points(tmp_path):
    """``env -i HOME=... PATH=/usr/bin:/bin bash launch/gpu_check.sh --dry-run``: it found no ``python`` (rc 127)
    and planned a bare ``gkd-train``; now it takes the venv beside the checkout and plans its entry points."""
    if not (REPO / ".venv" / "bin" / "python").is_file():
        pytest.skip(f"no venv beside the checkout ({REPO / '.venv'}): the case this test is about")
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "gpu_check.sh"), "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "GKD_CHECK_DIR": str(tmp_path / "chk")},
    )
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]  # 1: no GPU prerequisites here
    assert "command not found" not in proc.stderr, proc.stderr
    planned = {
        ln[3 : ln.index("]")]: shlex.split(ln.split(": ", 1)[1])
        for ln in proc.stdout.splitlines()
        if ln.startswith("+ [")
    }
    venv_bin = REPO / ".venv" / "bin"
    for name, entry in (("megatron", "gkd-train"), ("hf_bf16", "gkd-train"), ("bench", "gkd-bench")):
        assert planned[name][0] == str(venv_bin / entry), planned[name][:2]
    assert planned["repro"][0] == str(venv_bin / "python")


def test_a_python_without_the_harness_is_refused_in_one_line(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(REPO / "launch" / "gpu_check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "GKD_PYTHON": str(fake), "GKD_CHECK_DIR": str(tmp_path)},
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"gpu_check.sh: {fake} cannot import gkd_harness: create the project's venv ({REPO}/.venv, bash "
        "launch/setup_env.sh) or set GKD_PYTHON=/path/to/venv/bin/python"
    ]
