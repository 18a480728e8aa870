"""harness.launcher.resume: the newest complete ms-swift checkpoint of a run folder (requeue -> resume)."""

import os

from harness.launcher.resume import latest_checkpoint, resume_args


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
