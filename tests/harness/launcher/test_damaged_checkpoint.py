"""Issue 48, item 9: a damaged newest checkpoint is named and skipped for the previous one, and a resumed attempt
starts with its own status fields.

Before: a truncated ``model.safetensors`` in the newest checkpoint made the resume fail with a ``SafetensorError``
line that named no file, never fell back to the previous checkpoint (so every requeue failed the same way), and
``summary.json`` kept the previous attempt's ``"signal": "SIGTERM"``. What counts as damaged is checked against the
loaders themselves: ``safetensors`` refuses the truncated file, ``torch.load`` the cut archive.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.schema import to_dict
from gkd_harness.harness.config.secrets import redact
from gkd_harness.harness.launcher import run as run_module
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.resume import checkpoint_damage, decide_attempt, find_checkpoint
from gkd_harness.harness.store.run_folder import RunFolder

TENSORS = {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(3, dtype=torch.bfloat16)}


def _hf_checkpoint(run_dir: Path, step: int) -> Path:
    """A complete HF checkpoint as the trainer saves it: weights, optimizer state, trainer_state.json last."""
    path = run_dir / "swift" / "v0-20260101-000000" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    save_file(TENSORS, str(path / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.zeros(8, 8)}}}, path / "optimizer.pt")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def _cut(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_model_safetensors_is_named_and_skipped(tmp_path):
    good = _hf_checkpoint(tmp_path, 4)
    newest = _hf_checkpoint(tmp_path, 8)
    assert find_checkpoint(tmp_path) == (newest, [])
    _cut(newest / "model.safetensors")
    with pytest.raises(SafetensorError):  # what the resume died on before
        load_file(str(newest / "model.safetensors"))
    assert load_file(str(good / "model.safetensors")).keys() == TENSORS.keys()

    ckpt, skipped = find_checkpoint(tmp_path)
    assert ckpt == good
    (line,) = skipped
    assert str(newest) in line and "model.safetensors: truncated" in line


def test_a_cut_optimizer_state_is_damaged_too(tmp_path):
    ckpt = _hf_checkpoint(tmp_path, 2)
    assert checkpoint_damage(ckpt) is None
    _cut(ckpt / "optimizer.pt", 0.5)
    with pytest.raises(RuntimeError):
        torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert checkpoint_damage(ckpt).startswith("optimizer.pt: truncated")


def test_a_safetensors_file_with_a_longer_tail_or_a_bad_header_is_damaged(tmp_path):
    ckpt = _hf_checkpoint(tmp_path, 2)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    with pytest.raises(SafetensorError):
        load_file(str(weights))
    assert "longer than its header says" in checkpoint_damage(ckpt)
    weights.write_bytes(b"\xff" * 8 + b"{}")
    assert "model.safetensors: truncated" in checkpoint_damage(ckpt)


FLAT = flatten({"loss": {"precision": "fp32"}, "run": {"max_steps": 10}})


def test_the_resume_decision_names_the_damaged_checkpoint_and_restarts_without_a_good_one(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    folder.start_summary("r", "g", FLAT)
    folder.finish_summary("failed", "boom")
    only = _hf_checkpoint(folder.path, 6)
    _cut(only / "model.safetensors")
    with folder.lock():
        attempt = decide_attempt(folder, FLAT, overwrite=False, resume=True)
    assert attempt.action == "restart"  # from step 0, not a requeue that fails the same way every time
    assert any(str(only) in n and "model.safetensors" in n for n in attempt.notes)


def _inputs(tmp_path: Path) -> list:
    model = tmp_path / "model"  # a local model folder (nothing loads it: ms-swift's start is recorded, not run)
    model.mkdir()
    (model / "config.json").write_text("{}")
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    return [f"model.student={model}", f"model.teacher={model}", f"run.dataset={tmp_path / 'train.jsonl'}"]


@pytest.mark.parametrize("damaged", [False, True], ids=["intact", "newest_damaged"])
def test_a_requeue_after_sigterm_resumes_with_fresh_status(tmp_path, monkeypatch, damaged):
    """gkd-train's own main-node path; only ms-swift's start is replaced, by what its writer rank reports. With the
    newest checkpoint damaged it resumes from the previous one."""
    run_dir = tmp_path / "run"
    cfg = point_config(
        [*_inputs(tmp_path), f"run.output_dir={run_dir}", "run.max_steps=10", "run.resume=true", "loss=fp32"]
    )[0]
    folder = RunFolder(run_dir).create()
    folder.start_summary(run_module.run_name_for(cfg, run_dir), None, flatten(redact(to_dict(cfg))))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "train/loss": 1.0}) + "\n" for k in (1, 2)))
    folder.record_interrupt("SIGTERM")  # the previous attempt: preempted
    assert folder.read_summary()["signal"] == "SIGTERM"
    previous, newest = _hf_checkpoint(run_dir, 1), _hf_checkpoint(run_dir, 2)
    if damaged:
        _cut(newest / "model.safetensors")
    good = previous if damaged else newest
    started = []

    def ms_swift(plan, log_path, **kw):  # the writer rank's reports of a run that trained steps 2..10
        started.append(plan)
        RunFolder(run_dir).update_summary(world_size=1, loss_calls=9, steps_trained=9)

    monkeypatch.setattr(run_module, "execute", ms_swift)
    summary = run_module.train(cfg)
    (plan,) = started
    assert plan.argv[plan.argv.index("--resume_from_checkpoint") + 1] == str(good)
    assert summary["status"] == "completed" and summary["resumed_from"] == str(good)
    assert summary.get("signal") is None and summary["error"] is None  # before: "signal": "SIGTERM" stayed
