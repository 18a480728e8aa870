"""Bytes (and CPU seconds) per captured step, at a given shape: the capture formats of ``gkd_harness.harness.store.captures``
against the first format (the call's whole ``[B, S, V]`` tensors), written for real.

    python scripts/measure_captures.py [--seq 512 --active 448 --vocab 248320 --topk 64 --cap 256]

Defaults: the seed's shape (one sequence of 512 positions, 448 active, Qwen3.5's 248,320-token vocabulary, top-k
64), an FP32 student and a BF16 teacher as at the loss boundary, ``monitor.capture_max_tokens`` 256. For each
teacher mode it prints the file size of the new capture (through :class:`gkd_harness.harness.rank.capture.LossCapture` and
its writer), the seconds the loss call spends in the capture (row selection, gather, queueing) and the seconds
the writer thread spends, and the size of the first format's file for the same call.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.rank.capture import LossCapture


def inputs(seq: int, active: int, vocab: int, topk: int):
    g = torch.Generator().manual_seed(0)
    student = (torch.randn(1, seq, vocab, generator=g) * 2).bfloat16().float()
    teacher = (student + 0.05 * torch.randn(1, seq, vocab, generator=g)).bfloat16()
    labels = torch.randint(0, vocab, (1, seq), generator=g)
    labels[0, : seq - active] = -100
    lp, ids = torch.topk(torch.log_softmax(teacher.float(), -1).bfloat16(), topk, dim=-1)
    return (
        student,
        labels,
        {
            "full": TeacherOutput(full_logits=teacher, labels=labels),
            "topk": TeacherOutput(topk_logprobs=lp, topk_indices=ids, labels=labels),
        },
    )


def first_format_bytes(folder: Path, student, teacher: TeacherOutput, labels) -> int:
    """The file the first format wrote for this call (``student_logits [B, S, V]`` and the teacher as it came)."""
    tensors = {"student_logits": student, "labels": labels}
    if teacher.is_topk_mode:
        tensors.update(teacher_topk_logprobs=teacher.topk_logprobs, teacher_topk_indices=teacher.topk_indices)
    else:
        tensors["teacher_full_logits"] = teacher.full_logits
    path = folder / "first_format.safetensors"
    save_file(tensors, str(path), metadata={"beta": "0.5", "temperature": "0.9"})
    size = path.stat().st_size
    path.unlink()
    return size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--active", type=int, default=448)
    p.add_argument("--vocab", type=int, default=248_320)
    p.add_argument("--topk", type=int, default=64)
    p.add_argument("--cap", type=int, default=256)
    a = p.parse_args()
    student, labels, teachers = inputs(a.seq, a.active, a.vocab, a.topk)
    print(
        f"shape: S={a.seq}, {a.active} active, V={a.vocab}, top-k {a.topk}, FP32 student, BF16 teacher, "
        f"capture_max_tokens={a.cap}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for mode, teacher in teachers.items():
            cap = LossCapture(folder / mode, a.cap, {"precision": "fp32", "beta_form": "paper"})
            t0 = time.perf_counter()
            path = cap(1, student, teacher, labels, 0.5, 0.9)
            hot = time.perf_counter() - t0
            t1 = time.perf_counter()
            assert cap.close() == []
            writer = time.perf_counter() - t1
            size = path.stat().st_size
            old = first_format_bytes(folder, student, teacher, labels)
            print(
                f"{mode:>4}: capture {size:,} bytes ({size / 2**20:,.2f} MiB); in the loss call {hot:.3f} s, "
                f"writer thread {writer:.3f} s; first format {old:,} bytes ({old / 2**20:,.1f} MiB)"
            )


if __name__ == "__main__":
    main()
