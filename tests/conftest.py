"""Shared fixtures.

* ``embedded_cache`` (session, automatic): a private cache root (``$GKD_HARNESS_CACHE``), so the tiny models are built
  once per test session and no test touches the user's cache.
* ``e2e_root`` (session): a folder for end-to-end run folders.
* ``_output_root_under_tmp`` (session, automatic): ``$GKD_OUTPUT_ROOT`` under a temporary folder when unset.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _output_root_under_tmp(tmp_path_factory):
    """Every gkd-train a test starts writes under a temporary folder: Hydra makes ``$GKD_OUTPUT_ROOT`` (default
    ``outputs`` in the working directory, i.e. the checkout) before the job runs, even with ``run.output_dir``
    set or for a config error (before: ``outputs/`` left in the checkout by the CLI tests of test_train_e2e)."""
    old = os.environ.get("GKD_OUTPUT_ROOT")
    if old is None:
        os.environ["GKD_OUTPUT_ROOT"] = str(tmp_path_factory.mktemp("gkd_output_root"))
    yield
    if old is None:
        os.environ.pop("GKD_OUTPUT_ROOT", None)


@pytest.fixture(scope="session", autouse=True)
def embedded_cache(tmp_path_factory):
    """The harness's cache folder (``$GKD_HARNESS_CACHE``: embedded models, ms-swift's flag table) under a temporary
    folder for the whole session, so no test writes into the user's ``~/.cache/gkd-harness`` (before: every
    training or dry run of a test that did not ask for this fixture built its models or the flag table there).
    The flag tables already built there (``setup_env.sh`` builds them) are copied in, only read."""
    import shutil

    from gkd_harness.harness.config.swift_flags import cache_dir

    path = tmp_path_factory.mktemp("gkd_cache")
    old = os.environ.get("GKD_HARNESS_CACHE")
    for table in cache_dir().glob("*-flags-*.json") if cache_dir().is_dir() else ():
        shutil.copy2(table, path / table.name)
    os.environ["GKD_HARNESS_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("GKD_HARNESS_CACHE", None)
    else:
        os.environ["GKD_HARNESS_CACHE"] = old


@pytest.fixture(scope="session")
def e2e_root(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_runs")


def entry_point(name: str) -> str:
    """A console script of this environment (next to the interpreter running the tests), found without PATH."""
    import sys
    from pathlib import Path

    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


SMOKE_GROUP = "smoke_session"
SMOKE_STEPS = 3


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory, embedded_cache):
    """One real smoke sweep per test session, shared by every test that needs one: ``gkd-train -m experiment=smoke``
    (original, fp32, continuous; 3 steps each, captures on) through Hydra multirun and the real ms-swift CLI.
    ``GKD_SMOKE_SWEEP=<folder>`` reuses a sweep made by the same command."""
    import subprocess
    from pathlib import Path

    if os.environ.get("GKD_SMOKE_SWEEP"):
        return Path(os.environ["GKD_SMOKE_SWEEP"])
    root = tmp_path_factory.mktemp("smoke_sweep")
    env = dict(os.environ, GKD_OUTPUT_ROOT=str(root), HF_HUB_OFFLINE="1", WANDB_SILENT="true", WANDB_MODE="offline")
    cmd = [
        entry_point("gkd-train"),
        "-m",
        "experiment=smoke",
        f"run.max_steps={SMOKE_STEPS}",
        "monitor.capture=true",
        f"tracking.wandb.group={SMOKE_GROUP}",
        "hydra.callbacks.sweep_status.progress_interval_s=0",
    ]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=1500)
    sweep = root / "multirun" / SMOKE_GROUP
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len([p for p in sweep.iterdir() if (p / "summary.json").exists()]) == 3
    return sweep


OUTCOME_GROUP = "outcome"
OUTCOME_STEPS = 4
OUTCOME_EVAL_EVERY = 2
OUTCOME_SEEDS = (1, 2)


@pytest.fixture(scope="session")
def outcome_sweep(tmp_path_factory, embedded_cache):
    """One short ``experiment=outcome`` per test session, shared by every test that needs one: original and fp32 ×
    seeds 1, 2 × 4 steps on ``model=tiny_distill`` (the teacher trained at set-up, in the session's cache), the
    held-out evaluation every 2 steps and at the end with eval batch 1 (no padding: the saved final student
    recomputes the logged values), a full checkpoint at the last step. Through Hydra multirun and the real ms-swift
    CLI; the group stays ``outcome`` (patched_not_worse is required: the plan configures the held-out evaluation). ``GKD_OUTCOME_SWEEP=<folder>`` reuses a
    sweep made by the same command."""
    import subprocess
    from pathlib import Path

    if os.environ.get("GKD_OUTCOME_SWEEP"):
        return Path(os.environ["GKD_OUTCOME_SWEEP"])
    root = tmp_path_factory.mktemp("outcome_sweep")
    env = dict(os.environ, GKD_OUTPUT_ROOT=str(root), HF_HUB_OFFLINE="1", WANDB_SILENT="true", WANDB_MODE="offline")
    cmd = [
        entry_point("gkd-train"),
        "-m",
        "experiment=outcome",
        f"run.max_steps={OUTCOME_STEPS}",
        f"run.seed={','.join(map(str, OUTCOME_SEEDS))}",
        f"monitor.eval.every_n_steps={OUTCOME_EVAL_EVERY}",
        "monitor.eval.batch_size=1",
        f"run.save_steps={OUTCOME_STEPS}",
        "hydra.callbacks.sweep_status.progress_interval_s=0",
    ]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=1500)
    sweep = root / "multirun" / OUTCOME_GROUP
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len([p for p in sweep.iterdir() if (p / "summary.json").exists()]) == 2 * len(OUTCOME_SEEDS)
    return sweep
