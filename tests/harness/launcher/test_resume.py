"""gkd_harness.harness.launcher.resume: the newest complete ms-swift checkpoint of a run folder (requeue -> resume)."""

import os

from gkd_harness.harness.launcher.resume import latest_checkpoint, resume_args


def _ckpt(root, rel, complete=True, mtime=None):
    path = root / "swift" / rel
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text("{}")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_latest_complete_checkpoint_by_step(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    _ckpt(tmp_path, "v0-20260101-000000/checkpoint-5")
    best = _ckpt(tmp_path, "v1-20260102-000000/checkpoint-20")
    _ckpt(tmp_path, "v1-20260102-000000/checkpoint-9")
    _ckpt(tmp_path, "v1-20260102-000000/checkpoint-30", complete=False)  # cut short by the time limit
    assert latest_checkpoint(tmp_path) == best
    assert resume_args(True, tmp_path) == ["--resume_from_checkpoint", str(best)]
    assert resume_args(False, tmp_path) == []


def test_no_checkpoint_means_fresh_start(tmp_path):
    (tmp_path / "swift" / "v0").mkdir(parents=True)
    assert resume_args(True, tmp_path) == []


# ------------------------------------------------------------------------------------------------ the decision
# decide_attempt is the one home of what a rerun does with its folder (RunFolder.check_prior was a second copy)
import json  # noqa: E402

import pytest  # noqa: E402

from gkd_harness.harness.config.flat import flatten  # noqa: E402
from gkd_harness.harness.launcher.resume import decide_attempt  # noqa: E402
from gkd_harness.harness.store.fingerprint import ConfigMismatch, config_fingerprint  # noqa: E402
from gkd_harness.harness.store.metrics_io import MetricsWriter  # noqa: E402
from gkd_harness.harness.store.provenance import harness_version  # noqa: E402
from gkd_harness.harness.store.run_folder import RunFolder  # noqa: E402

FLAT = flatten(
    {
        "loss": {"precision": "fp32", "beta_form": "paper"},
        "gkd": {"beta": 0.5},
        "model": {"student": "embedded", "teacher": "embedded"},
        "run": {"dataset": None, "max_steps": 3, "output_dir": "/somewhere"},
    }
)


def _folder(root, status, flat=FLAT):
    folder = RunFolder(root).create()
    folder.start_summary("r", "g", flat)
    folder.finish_summary(status, None if status == "completed" else "boom")
    return folder


def _decide(folder, flat, **kw):
    with folder.lock():
        return decide_attempt(folder, flat, overwrite=kw.get("overwrite", False), resume=kw.get("resume", False))


def test_completed_folder_is_skipped_only_when_the_fingerprint_matches(tmp_path):
    """Issue 12 item 4: `model.teacher=/other/teacher` on a completed folder said "completed, skipping"."""
    folder = _folder(tmp_path / "a", "completed")
    stored = folder.read_summary()
    assert stored["fingerprint"] == config_fingerprint(FLAT) and stored["harness_version"] == harness_version()
    assert config_fingerprint(stored["config"]) == stored["fingerprint"]  # what was stored recomputes it
    assert _decide(folder, FLAT).action == "skip"
    changed = {**FLAT, "model.teacher": "/other/teacher"}
    with pytest.raises(ConfigMismatch) as err:
        _decide(folder, changed)
    msg = str(err.value)
    assert err.value.differing == ["model.teacher"]
    assert "\n" not in msg and str(folder.path) in msg and "model.teacher" in msg and "/other/teacher" in msg
    assert "run.overwrite=true" in msg and "tracking.wandb.group" in msg
    attempt = _decide(folder, changed, overwrite=True)
    assert attempt.action == "restart" and "the earlier attempt differs in model.teacher" in attempt.notes
    assert (folder.path / "previous_attempts" / "1" / "summary.json").is_file()
    assert _decide(folder, changed).action == "new"
    assert _decide(_folder(tmp_path / "b", "completed"), FLAT, overwrite=True).action == "restart"


def test_unfinished_attempts_resume_only_with_the_same_config(tmp_path):
    changed = {**FLAT, "gkd.beta": 0.9}
    assert _decide(_folder(tmp_path / "a", "failed"), FLAT).action == "restart"
    # resume asked, same config, no checkpoint: archived and restarted with a note
    attempt = _decide(_folder(tmp_path / "b", "failed"), FLAT, resume=True)
    assert attempt.action == "restart" and "no usable checkpoint" in attempt.notes[0]
    folder = _folder(tmp_path / "c", "failed")
    ckpt = _ckpt(folder.path, "v0/checkpoint-2")
    attempt = _decide(folder, FLAT, resume=True)
    assert attempt.action == "resume" and attempt.checkpoint_step == 2
    assert attempt.resume_args == ["--resume_from_checkpoint", str(ckpt)]
    attempt = _decide(_folder(tmp_path / "d", "failed"), changed)
    assert attempt.action == "restart" and "the earlier attempt differs in gkd.beta" in attempt.notes
    with pytest.raises(ConfigMismatch, match="gkd.beta 0.5 -> 0.9"):
        _decide(_folder(tmp_path / "e", "failed"), changed, resume=True)
    assert _decide(_folder(tmp_path / "f", "failed"), changed, resume=True, overwrite=True).action == "restart"


def test_a_folder_written_by_an_older_harness_is_not_skipped(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    folder.summary_path.write_text(json.dumps({"status": "completed", "config": FLAT}))  # no fingerprint
    with pytest.raises(ConfigMismatch, match="the harness code"):
        _decide(folder, FLAT)
    assert _decide(RunFolder(tmp_path / "empty"), FLAT).action == "new"
    MetricsWriter(tmp_path / "orphan" / "metrics.jsonl").write({"step": 1})
    assert _decide(RunFolder(tmp_path / "orphan"), FLAT).action == "restart"  # files without summary.json


def _megatron_ckpt(root, step, tracker=True, iter_dir=True, name=None):
    """A checkpoint as ms-swift's Megatron trainer writes it (swift/megatron/trainers/base.py: save_checkpoint):
    ``<output_dir>/checkpoint-<N>/iter_<N:07d>/`` then ``latest_checkpointed_iteration.txt`` last."""
    path = root / "swift" / (name or f"checkpoint-{step}")
    (path / "args.json").parent.mkdir(parents=True)
    (path / "args.json").write_text("{}")
    if iter_dir:
        (path / f"iter_{step:07d}").mkdir()
        (path / f"iter_{step:07d}" / "common.pt").write_bytes(b"x")
    if tracker:
        (path / "latest_checkpointed_iteration.txt").write_text(str(step))
    return path


def test_megatron_checkpoints_are_found_and_resumed_with_mcore_model(tmp_path):
    """Issue 31: a requeued Megatron run continues from its newest complete checkpoint (ms-swift's load flags:
    --mcore_model DIR --finetune false loads weights, optimizer, scheduler and iteration); one cut short before its
    tracker was written, or whose tracker names a missing iteration, and LoRA's -merged export are skipped."""
    assert resume_args(True, tmp_path) == []
    _megatron_ckpt(tmp_path, 4)
    best = _megatron_ckpt(tmp_path, 8)
    _megatron_ckpt(tmp_path, 12, tracker=False)  # the time limit hit during the save
    _megatron_ckpt(tmp_path, 16, iter_dir=False)
    _megatron_ckpt(tmp_path, 20, name="checkpoint-20-merged")
    assert latest_checkpoint(tmp_path) == best
    assert resume_args(True, tmp_path) == ["--mcore_model", str(best), "--finetune", "false"]
    folder = _folder(tmp_path / "run", "failed")
    ckpt = _megatron_ckpt(folder.path, 6)
    attempt = _decide(folder, FLAT, resume=True)
    assert attempt.action == "resume" and attempt.checkpoint_step == 6
    assert attempt.resume_args == ["--mcore_model", str(ckpt), "--finetune", "false"]


def test_a_resume_rewinds_the_wandb_run_to_the_checkpoint(tmp_path):
    """Issue 41, item 6: a resumed attempt kept WANDB_RESUME=allow, so wandb dropped Megatron's resumed values for
    the steps between the checkpoint and the last logged step (step=iteration; monotonic steps) and appended HF's
    after the first attempt's. Now it rewinds: HF to the step the rank recorded at save time, Megatron to the
    checkpoint's iteration; nothing known -> the plain resume."""
    from gkd_harness.harness.contract import WANDB_STEP_FILE
    from gkd_harness.harness.launcher.resume import rewind_wandb_env, wandb_rewind_step

    folder = _folder(tmp_path / "hf", "failed")
    ckpt = _ckpt(folder.path, "v0-20260101-000000/checkpoint-4")
    assert wandb_rewind_step(ckpt) is None and _decide(folder, FLAT, resume=True).wandb_step is None
    (ckpt / WANDB_STEP_FILE).write_text('{"run_id": "abc", "wandb_step": 7}')
    attempt = _decide(folder, FLAT, resume=True)
    assert attempt.action == "resume" and attempt.checkpoint_step == 4 and attempt.wandb_step == 7
    assert wandb_rewind_step(_megatron_ckpt(tmp_path / "mg", 6)) == 6

    env = {"WANDB_RUN_ID": "0123abcd", "WANDB_RESUME": "allow", "WANDB_MODE": "offline"}
    assert rewind_wandb_env(env, 7) == {
        "WANDB_RUN_ID": "0123abcd",
        "WANDB_MODE": "offline",
        "WANDB_RESUME_FROM": "0123abcd?_step=7",
    }
    assert rewind_wandb_env(env, None) == env and "WANDB_RESUME" in env  # the input is not changed


def test_the_rank_records_the_wandb_step_at_each_hf_checkpoint(tmp_path, monkeypatch):
    """transformers' real WandbCallback and a real (offline) wandb run: its on_save writes the run id and the last
    committed step into the checkpoint folder just saved."""
    import json
    from types import SimpleNamespace

    import wandb
    from transformers.integrations.integration_utils import WandbCallback
    from transformers.trainer_callback import TrainerControl, TrainerState

    from gkd_harness.harness.contract import WANDB_STEP_FILE
    from gkd_harness.harness.rank.wandb_run import record_wandb_step_at_save

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    original = WandbCallback.on_save
    run = wandb.init(project="p", id="steps123")
    try:
        assert record_wandb_step_at_save(WandbCallback) and record_wandb_step_at_save(WandbCallback)  # idempotent
        for i in range(5):
            wandb.log({"train/loss": float(i), "train/global_step": i + 1})
        (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
        state = TrainerState(global_step=5, is_world_process_zero=True)
        WandbCallback().on_save(SimpleNamespace(output_dir=str(tmp_path / "out")), state, TrainerControl())
        saved = json.loads((tmp_path / "out" / "checkpoint-5" / WANDB_STEP_FILE).read_text())
        assert saved == {"run_id": "steps123", "wandb_step": 4}  # rows 0..4 committed: the 5th is step 4
    finally:
        WandbCallback.on_save = original
        run.finish()
