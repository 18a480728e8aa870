"""Issue 48, item 8: after a rank's SIGKILL the wandb history and ``metrics.jsonl`` agree step for step.

A killed rank's ``.wandb`` file can stop before the checkpoint the resume starts from (the reviewer's: checkpoint-15,
file ending at step 13); rewinding wandb to the checkpoint then lost steps 14-15 from wandb for good, and
``gkd-analyze --source wandb-offline`` failed the run for it. Now the resume rewinds wandb to the last row its files
hold and the writer rank replays ``metrics.jsonl``'s rows from there to the checkpoint. Real offline wandb runs
throughout (the killed attempt's file, the resumed attempt's), read back with the analysis package's own reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.contract import LOSS_CALLS_TOTAL, WANDB_STEP_FILE
from gkd_harness.harness.launcher.resume import decide_attempt, resume_point
from gkd_harness.harness.rank.wandb_run import replay_rows
from gkd_harness.harness.store.run_folder import RunFolder
from gkd_harness.harness.store.wandb_file import held_history, read_wandb_file, wandb_files

FLAT = flatten({"loss": {"precision": "fp32"}, "run": {"max_steps": 10}})
RUN_ID = "cut0123456789abc"
CHECKPOINT = 6
LOGGED = 8  # metrics.jsonl holds steps 1..8; the killed attempt's wandb file fewer


def _metrics_rows():
    return [{"step": k, "train/loss": 1.0 / k, LOSS_CALLS_TOTAL: float(k)} for k in range(1, LOGGED + 1)]


def _log(run, row, megatron):
    """One metrics row as each backend's wandb callback logs it: HF without a step and with train/global_step,
    ms-swift's Megatron callback with step=iteration."""
    values = {k: v for k, v in row.items() if k != "step"}
    if megatron:
        run.log(values, step=row["step"])
    else:
        run.log({**values, "train/global_step": row["step"]})


def _wandb_attempt(run_dir: Path, monkeypatch, rows, megatron, resume_from=None, replay=()):
    """A real offline wandb run of ``run_dir`` (WANDB_DIR as gkd-train sets it) logging ``rows``; with
    ``resume_from`` (``WANDB_RESUME_FROM``, as the resume's plan sets it) it first replays ``replay`` the way the
    writer rank does (:func:`replay_rows`)."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(run_dir / "wandb"))
    monkeypatch.delenv("WANDB_RESUME", raising=False)
    if resume_from is None:
        monkeypatch.delenv("WANDB_RESUME_FROM", raising=False)
    else:
        monkeypatch.setenv("WANDB_RESUME_FROM", resume_from)
    (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
    run = wandb.init(project="p", id=RUN_ID, dir=str(run_dir / "wandb"))
    try:
        assert replay_rows(replay, explicit_step=megatron) == len(replay)
        for row in rows:
            _log(run, row, megatron)
    finally:
        run.finish()
        wandb.teardown()  # waits for wandb's core to write the file out; the next init reads the environment again


def _folder_with_checkpoint(root: Path, megatron: bool) -> RunFolder:
    folder = RunFolder(root).create()
    folder.start_summary("r", "g", FLAT)
    folder.finish_summary("failed", "killed by SIGKILL")
    ckpt = folder.path / "swift" / "v0-20260101-000000" / f"checkpoint-{CHECKPOINT}"
    ckpt.mkdir(parents=True)
    if megatron:
        (ckpt / f"iter_{CHECKPOINT:07d}").mkdir()
        (ckpt / "latest_checkpointed_iteration.txt").write_text(str(CHECKPOINT))
    else:  # HF: the rank recorded wandb's committed step at save time (row 0 is global step 1)
        (ckpt / "trainer_state.json").write_text("{}")
        (ckpt / WANDB_STEP_FILE).write_text(json.dumps({"run_id": RUN_ID, "wandb_step": CHECKPOINT - 1}))
    (folder.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _metrics_rows()))
    return folder


def _synced_history(wandb_dir: Path):
    """{training step: row} wandb keeps once each attempt's file is synced in order (a rewind drops the rows after
    its branch point), read with the analysis package's reader (independent of the harness's)."""
    from gkd_harness.analysis.sweep.wandb_file import read_records

    held = []
    for path in wandb_files(wandb_dir):
        for rec in read_records(path):
            kind = rec.WhichOneof("record_type")
            if kind == "run" and rec.run.branch_point.run:
                held = [r for r in held if r["_step"] <= rec.run.branch_point.value]
            elif kind == "history":
                held.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
    return {int(r.get("train/global_step", r["_step"])): r for r in held}


@pytest.mark.parametrize("megatron", [False, True], ids=["hf", "megatron"])
def test_a_kill_that_cut_the_wandb_file_is_replayed_step_for_step(tmp_path, monkeypatch, megatron):
    folder = _folder_with_checkpoint(tmp_path / "run", megatron)
    rows = _metrics_rows()
    _wandb_attempt(folder.path, monkeypatch, rows[:4], megatron)  # the killed attempt's file ends at step 4

    with folder.lock():
        attempt = decide_attempt(folder, FLAT, overwrite=False, resume=True)
    held_wandb_step = 3 if not megatron else 4  # HF: wandb row 3 is global step 4; Megatron: _step = iteration
    assert attempt.action == "resume" and attempt.checkpoint_step == CHECKPOINT
    assert attempt.wandb_step == held_wandb_step  # before: the checkpoint's (5 / 6), past what wandb holds
    assert attempt.point.wandb_replay == rows[4:CHECKPOINT]  # steps 5 and 6, as metrics.jsonl has them
    assert any("replayed" in n for n in attempt.notes)

    # the resumed attempt: rewound there, the writer rank replays, training goes on from the checkpoint
    _wandb_attempt(
        folder.path,
        monkeypatch,
        rows[CHECKPOINT:],
        megatron,
        resume_from=f"{RUN_ID}?_step={attempt.wandb_step}",
        replay=attempt.point.wandb_replay,
    )
    first, second = wandb_files(folder.path / "wandb")
    assert read_wandb_file(first).rewind_to is None and read_wandb_file(second).rewind_to == attempt.wandb_step
    synced = _synced_history(folder.path / "wandb")
    assert sorted(synced) == [r["step"] for r in rows]  # every step once, none missing
    for r in rows:
        assert synced[r["step"]]["train/loss"] == r["train/loss"]
        assert synced[r["step"]][LOSS_CALLS_TOTAL] == r[LOSS_CALLS_TOTAL]


def test_a_wandb_file_holding_the_checkpoint_is_rewound_to_it_without_replay(tmp_path, monkeypatch):
    folder = _folder_with_checkpoint(tmp_path / "run", megatron=False)
    _wandb_attempt(folder.path, monkeypatch, _metrics_rows()[:7], megatron=False)
    point = resume_point(folder.path)
    assert point.wandb_step == CHECKPOINT - 1 and point.wandb_replay == []


def test_a_torn_wandb_file_holds_what_comes_before_the_tear(tmp_path, monkeypatch):
    """A file cut in the middle of a record (what a SIGKILL of wandb's writer leaves): the rows before the cut are
    held, as the analysis reader reads them; the resume rewinds to the last of them and replays the rest."""
    from gkd_harness.analysis.sweep.wandb_file import read_records

    folder = _folder_with_checkpoint(tmp_path / "run", megatron=True)
    _wandb_attempt(folder.path, monkeypatch, _metrics_rows(), megatron=True)
    (path,) = wandb_files(folder.path / "wandb")
    data = path.read_bytes()
    full = [r.wandb_step for r in read_wandb_file(path).rows]
    assert full == list(range(1, LOGGED + 1))
    lo, hi = 7, len(data)  # the longest cut that holds at most steps 1..3: it tears the record of step 4
    while hi - lo > 1:
        mid = (lo + hi) // 2
        path.write_bytes(data[:mid])
        lo, hi = (mid, hi) if len(read_wandb_file(path).rows) <= 3 else (lo, mid)
    path.write_bytes(data[:lo])
    kept = [
        json.loads(next(i.value_json for i in r.history.item if ("/".join(i.nested_key) or i.key) == "_step"))
        for r in read_records(path)
        if r.WhichOneof("record_type") == "history"
    ]
    assert kept == [1, 2, 3] == [r.wandb_step for r in held_history([path]) or []]
    point = resume_point(folder.path)
    assert point.wandb_step == 3 and [r["step"] for r in point.wandb_replay] == [4, 5, 6]
    assert os.path.getsize(path) < len(data)
