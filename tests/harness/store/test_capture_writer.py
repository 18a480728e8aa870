"""gkd_harness.harness.store.capture_writer: captures leave the training loop at once and are all written, in order, at close,
at a normal exit and after an exception; a failed write is reported, never raised into training."""

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import torch

from gkd_harness.harness.store.capture_writer import CaptureWriter
from gkd_harness.harness.store.captures import load_capture

REPO_ROOT = Path(__file__).resolve().parents[3]


def _capture(seed: int):
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "student_logits": torch.randn(3, 40, generator=g),
        "teacher_full_logits": torch.randn(3, 40, generator=g).bfloat16(),
        "labels": torch.arange(3),
    }
    return tensors, {"beta": "0.5", "temperature": "0.9", "format": "rows", "step": str(seed)}


class _Gate:
    """A stand-in for the CUDA event of a non-blocking copy: ``synchronize`` waits until the test opens it."""

    def __init__(self):
        self.opened = threading.Event()

    def synchronize(self):
        assert self.opened.wait(30)


class _SlowCopy:
    """A copy that ends a second later."""

    def synchronize(self):
        import time

        time.sleep(1.0)


def test_submit_returns_before_the_write_and_close_writes_everything_in_order(tmp_path):
    writer = CaptureWriter(max_pending=4)
    gate = _Gate()
    first, meta = _capture(1)
    writer.submit(tmp_path / "step1_rank0.safetensors", first, meta, ready=gate)
    for step in (2, 3):
        writer.submit(tmp_path / f"step{step}_rank0.safetensors", *_capture(step))
    assert not list(tmp_path.iterdir())  # nothing written while the "copy" is in flight: submit did not wait
    gate.opened.set()
    assert writer.close() == []
    assert [p.name for p in writer.written] == [f"step{s}_rank0.safetensors" for s in (1, 2, 3)]
    cap = load_capture(tmp_path / "step1_rank0.safetensors")
    assert torch.equal(cap["student_logits"][0], first["student_logits"])
    assert torch.equal(cap["teacher_output"].full_logits[0], first["teacher_full_logits"])
    assert not list(tmp_path.glob("*.tmp"))
    assert writer.close() == []  # idempotent


def test_a_failed_write_is_reported_and_later_captures_still_written(tmp_path):
    (tmp_path / "blocked").write_text("a file where the folder should be")
    writer = CaptureWriter()
    writer.submit(tmp_path / "blocked" / "step1_rank0.safetensors", *_capture(1))
    writer.submit(tmp_path / "ok" / "step2_rank0.safetensors", *_capture(2))
    errors = writer.close()
    assert len(errors) == 1 and "blocked/step1_rank0.safetensors" in errors[0]
    assert (tmp_path / "ok" / "step2_rank0.safetensors").is_file()


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from gkd_harness.harness.store.capture_writer import CaptureWriter
        from tests.harness.store.test_capture_writer import _capture
        from tests.harness.store.test_capture_writer import _SlowCopy
        w = CaptureWriter(max_pending=4)
        for step in range(1, 4):  # the first still "copying" when the process ends
            w.submit({str(tmp_path)!r} + f"/step{{step}}_rank0.safetensors", *_capture(step),
                     ready=_SlowCopy() if step == 1 else None)
    """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_queued_captures_are_written_when_the_process_exits_without_close(tmp_path):
    proc = _run("", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [f"step{s}_rank0.safetensors" for s in (1, 2, 3)]


def test_queued_captures_are_written_when_training_fails(tmp_path):
    proc = _run("raise RuntimeError('non-finite GKD loss at step 3')", tmp_path)
    assert proc.returncode == 1 and "non-finite GKD loss" in proc.stderr
    assert len(list(tmp_path.glob("*.safetensors"))) == 3
