"""Issue 46, item 4: a requeued multi-node run resumes on every node alike.

On Megatron the rank that writes ``metrics.jsonl`` and owns the wandb run is the last rank, on the last node. Before,
only node 0's launch path gave the plugin the resume totals and rewound the wandb run: node 1 of a 2 x 8 GPU seed run
restarted ``gkd/loss_calls_total``, ``gkd/neg_loss_calls_total`` and ``gkd/nonfinite_calls_total`` at the checkpoint
and wandb dropped the steps it took to go backwards. The test runs ``gkd-train``'s own path for node 1 of 2
(``train`` with ``NNODES=2 NODE_RANK=1``; only ms-swift's process start is replaced, by a recorder of the plan), then
builds the loss in the last rank (global rank 15) from the settings that plan hands to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gkd_harness.harness.config.schema import from_dict
from gkd_harness.harness.contract import (
    LOSS_CALLS_TOTAL,
    NEG_LOSS_CALLS_TOTAL,
    NONFINITE_CALLS_TOTAL,
    SETTINGS_ENV,
    PluginSettings,
)
from gkd_harness.harness.launcher import run as run_module
from gkd_harness.harness.launcher.compose import point_config

CHECKPOINT = 4


def _megatron_checkpoint(run_dir: Path, step: int) -> Path:
    """What ms-swift's Megatron trainer leaves: ``checkpoint-<N>/iter_<N:07d>/`` then its tracker."""
    path = run_dir / "swift" / "v0-20260101-000000" / f"checkpoint-{step}"
    (path / f"iter_{step:07d}").mkdir(parents=True)
    (path / "latest_checkpointed_iteration.txt").write_text(str(step))
    return path


def _killed_attempt(run_dir: Path, last_step: int) -> None:
    """metrics.jsonl of an attempt killed after ``last_step`` (node 0 has not cut it to the checkpoint yet): step k
    holds 2k loss calls, k negative ones and one non-finite call from step 3 on."""
    rows = [
        {"step": k, "train/loss": 0.1 * k, LOSS_CALLS_TOTAL: 2.0 * k, NEG_LOSS_CALLS_TOTAL: float(k)}
        | ({NONFINITE_CALLS_TOTAL: 1.0} if k >= 3 else {})
        for k in range(1, last_step + 1)
    ]
    rows.insert(2, {"step": 2, "eval/jsd": 0.5})  # an evaluation's own record: no counters in it
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def node1_of_2(tmp_path, monkeypatch):
    """``(cfg, run_dir)`` of the seed preset on node 1 of a 2-node job, run.resume=true, with a checkpoint at step 4
    and metrics up to step 6 in the shared run folder."""
    run_dir = tmp_path / "run"
    model = tmp_path / "model"  # a local model folder (nothing loads it: ms-swift's start is recorded, not run)
    model.mkdir()
    (model / "config.json").write_text("{}")
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    cfg = point_config(
        [
            "experiment=seed",
            "loss=fp32",
            f"model.student={model}",
            f"model.teacher={model}",
            f"run.dataset={tmp_path / 'train.jsonl'}",
            f"monitor.eval.dataset={tmp_path / 'train.jsonl'}",
            f"run.output_dir={run_dir}",
            "tracking.wandb.mode=offline",
        ]
    )[0]
    assert cfg.run.resume
    run_dir.mkdir()
    _megatron_checkpoint(run_dir, CHECKPOINT)
    _killed_attempt(run_dir, 6)
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NODEID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29611")
    return cfg, run_dir


def test_node_1_of_2_and_its_last_rank_continue_from_the_checkpoint(node1_of_2, monkeypatch):
    cfg, run_dir = node1_of_2
    started = []
    monkeypatch.setattr(run_module, "execute", lambda plan, log_path, **kw: started.append((plan, log_path)))

    run_module.train(cfg)

    ((plan, log_path),) = started
    assert log_path == run_dir / "swift.node1.log" and plan.layout.node_rank == 1 and plan.layout.nnodes == 2
    ckpt = run_dir / "swift" / "v0-20260101-000000" / f"checkpoint-{CHECKPOINT}"
    assert plan.argv[plan.argv.index("--mcore_model") + 1] == str(ckpt)
    # the wandb run is rewound to the checkpoint's iteration on this node too (Megatron logs step=iteration)
    run_id = plan.env["WANDB_RUN_ID"]
    assert plan.env.get("WANDB_RESUME_FROM") == f"{run_id}?_step={CHECKPOINT}" and "WANDB_RESUME" not in plan.env

    settings = PluginSettings.read(plan.env[SETTINGS_ENV])
    # the counters at the checkpoint's step, not at the killed attempt's last row (step 6)
    want = {LOSS_CALLS_TOTAL: 8.0, NEG_LOSS_CALLS_TOTAL: 4.0, NONFINITE_CALLS_TOTAL: 1.0}
    assert settings.resume_totals == want

    # the last rank of the job (global rank 15, on this node) builds its loss from these settings
    from gkd_harness.harness.rank.plugin import build_loss

    monkeypatch.setenv("RANK", "15")
    _, instrument = build_loss(settings, from_dict(settings.config))
    assert {k: instrument.metrics[k].total for k in want} == want


def test_node_1_and_node_0_plan_the_same_resume(node1_of_2, monkeypatch):
    """One code path: node 0's attempt plan from the same folder gives the same totals and rewind."""
    from gkd_harness.harness.launcher.resume import resume_point

    cfg, run_dir = node1_of_2
    node1 = run_module.other_node_plan(cfg, run_dir, None, "1")
    monkeypatch.setenv("NODE_RANK", "0")
    written = []

    def write(settings):
        written.append(settings)
        return settings.write(run_dir / "settings0.json")

    node0 = run_module.attempt_plan(cfg, run_dir, None, resume_point(run_dir), write)
    assert node0.env["WANDB_RESUME_FROM"] == node1.env["WANDB_RESUME_FROM"]
    assert written[0].resume_totals == PluginSettings.read(node1.env[SETTINGS_ENV]).resume_totals
    assert node0.argv == node1.argv
