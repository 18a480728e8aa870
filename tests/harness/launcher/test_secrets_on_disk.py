"""Secrets never reach disk (issue 32, item 2): a refused credential leaves no trace in any file under the output
root (Hydra's multirun.yaml, the sweep's and the point's .hydra/ files, the run folder) nor on the console.

Before the fix `'run.extra_args=[--hub_token,hf_...]'` was refused, but only inside the job: the token was written
twice into the sweep's multirun.yaml and printed on Hydra's launch line; an `hf_...` value in `run.dataset` (or in
a config file) was accepted and written unredacted into 11 files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import entry_point

TOKEN = "hf_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h"  # the shape of a Hugging Face token
# issue 40, items 1-2: credentials by form (shapes only), each accepted before the fix and written into 8-11 files
PASSWORD = "Pa55" + "wordXyz"
GITHUB = "ghp_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"


def _gkd_train(cwd: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "GKD_OUTPUT_ROOT": str(cwd / "out")}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [entry_point("gkd-train"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _files_holding(root: Path, text: str) -> list[str]:
    """Every file under ``root`` (any name, hidden ones included) whose bytes or name hold ``text``."""
    hits = []
    for p in root.rglob("*"):
        if text in p.name or (p.is_file() and text.encode() in p.read_bytes()):
            hits.append(str(p.relative_to(root)))
    return sorted(hits)


@pytest.mark.parametrize(
    "args,key",
    [
        (("-m", f"run.extra_args=[--hub_token,{TOKEN}]", "run.max_steps=1"), "run.extra_args"),
        (("-m", f"run.dataset={TOKEN}", "gkd.beta=0.5,0.9"), "run.dataset"),
        ((f"run.dataset={TOKEN}", "run.max_steps=1"), "run.dataset"),
        ((f"model.template={TOKEN}",), "model.template"),
        ((f"run.dataset=https://user:{PASSWORD}@data.example.com/train.jsonl", "run.max_steps=1"), "run.dataset"),
        ((f"run.dataset=/data/{GITHUB}/train.jsonl", "run.max_steps=1"), "run.dataset"),
        (("-m", f"tracking.wandb.tags=[smoke,{AWS}]", "gkd.beta=0.5,0.9"), "tracking.wandb.tags"),
    ],
)
def test_a_credential_on_the_command_line_is_refused_before_anything_is_written(tmp_path, args, key):
    secret = next((s for s in (PASSWORD, GITHUB, AWS) if any(s in a for a in args)), TOKEN)
    p = _gkd_train(tmp_path, *args)
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith(f"gkd-train: invalid config: {key}: ")
        and "looks like a credential" in lines[0]
    ), p.stderr
    assert secret not in p.stdout + p.stderr  # the console (Hydra's launch line included)
    assert _files_holding(tmp_path, secret) == []


@pytest.mark.parametrize(
    "value,secret",
    [
        (TOKEN, TOKEN),
        (f"https://user:{PASSWORD}@data.example.com/train.jsonl", PASSWORD),
        (f"/d/{GITHUB}.jsonl", GITHUB),
    ],
)
def test_a_credential_from_a_config_file_is_scrubbed_from_the_sweep_files(tmp_path, value, secret):
    """A value Hydra composes from a file reaches multirun.yaml before any job runs: the job scrubs it from the
    sweep's files before anything else is written, then validation refuses the key."""
    cfg = tmp_path / "cfg" / "local"
    cfg.mkdir(parents=True)
    (cfg / "default.yaml").write_text(f"# @package _global_\nrun:\n  dataset: {value}\n")
    p = _gkd_train(tmp_path, "-m", f"--config-dir={tmp_path / 'cfg'}", "run.max_steps=1")
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1].startswith("gkd-train: invalid config: run.dataset: ")
    assert secret not in p.stdout + p.stderr
    out = tmp_path / "out"
    assert (out / "multirun" / "default" / "multirun.yaml").is_file()  # Hydra wrote it; the job scrubbed it
    assert _files_holding(out, secret) == []


def test_log_records_are_redacted_and_a_failing_log_write_prints_no_traceback():
    """What Hydra logs (its launch line "#0 : key=value ...", the job's log) goes through redact_text."""
    import logging

    from gkd_harness.harness.launcher.cli import _redact_log_records

    before, raise_before = logging.getLogRecordFactory(), logging.raiseExceptions
    try:
        _redact_log_records()
        _redact_log_records()  # idempotent: one redacting layer
        record = logging.getLogger("hydra.test").makeRecord(
            "hydra.test", logging.INFO, __file__, 1, "\t#%d : %s", (0, f"run.extra_args=[--hub_token,{TOKEN}]"), None
        )
        assert record.getMessage() == "\t#0 : run.extra_args=[--hub_token,<redacted>]"
        assert logging.raiseExceptions is False
    finally:
        logging.setLogRecordFactory(before)
        logging.raiseExceptions = raise_before
