"""Training captures: one loss call's inputs, whole under tensor parallelism, handed to the background writer.

:class:`LossCapture` is called by :class:`gkd_harness.harness.rank.instrument.LossInstrument` on spot-check steps with the
call's own arguments. On the training device it keeps only what the loss saw (``gkd_harness.harness.store.captures``: the
first ``max_tokens`` active rows; in top-k mode the student gathered at the teacher's ids), then starts
non-blocking copies to pinned host memory and queues them on a :class:`~gkd_harness.harness.store.capture_writer.CaptureWriter`;
serialisation and disk writes happen on the writer's thread.

**Tensor parallelism** (Megatron TP > 1: each TP rank holds a vocabulary shard ``[B, S, V/tp]``, rank ``r`` the ids
``[r·V/tp, (r+1)·V/tp)``). A shard is never saved as if it were the whole:

* top-k: the student is gathered through the call's ``gather_fn`` (ms-swift's ``tp_gather_topk``, which gives
  every TP rank the values at the global ids);
* full vocabulary: the capped student and teacher rows are gathered over the TP group to its first rank and
  concatenated in rank order into ``[n, V]``.

Only the TP group's first rank writes (``step{S}_rank{R}.safetensors``, ``R`` its global rank); every TP rank takes
part in the collectives, as every TP rank runs the same loss call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from swift.rlhf_trainers.gkd_loss import TeacherOutput, default_gather

from gkd_harness.harness.rank.parallel_state import tensor_parallel_group
from gkd_harness.harness.store.capture_writer import CaptureWriter
from gkd_harness.harness.store.captures import STUDENT_FULL, TEACHER_FULL, capture_metadata, capture_tensors


def gather_vocab_shards(x: torch.Tensor, group, tp_rank: int, tp_size: int) -> Optional[torch.Tensor]:
    """``[n, V/tp]`` shards of every TP rank -> ``[n, V]`` (rank order) on the group's first rank, None elsewhere.

    A collective over ``group``: every TP rank calls it with the same ``n`` (TP ranks see the same positions).
    """
    x = x.contiguous()
    dst = dist.get_global_rank(group, 0)
    parts = [torch.empty_like(x) for _ in range(tp_size)] if tp_rank == 0 else None
    dist.gather(x, parts, dst=dst, group=group)
    return torch.cat(parts, dim=-1) if parts is not None else None  # parts: the first rank's


def to_host(tensors: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Optional[Any]]:
    """Host copies of ``tensors`` and the event that marks their end.

    CUDA: non-blocking copies into pinned buffers on the current stream, and a CUDA event recorded after them
    (the writer thread waits for it; the training stream does not). CPU: the tensors themselves (the capture's
    tensors are fresh, never views of the loss inputs), event None.
    """
    if not any(t.is_cuda for t in tensors.values()):
        return dict(tensors), None
    host = {}
    for k, t in tensors.items():
        buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        buf.copy_(t, non_blocking=True)
        host[k] = buf
    event = torch.cuda.Event()
    event.record()
    return host, event


class LossCapture:
    """Capture loss calls to ``capture_dir`` off the hot path.

    Args:
        capture_dir: the run folder's ``captures/``.
        max_tokens: rows kept per capture (``monitor.capture_max_tokens``).
        meta: strings stored in every capture (precision, beta_form, ...).
        rank: this process's global rank (names the file).
        max_pending: captures allowed to wait for the writer.
    """

    def __init__(
        self, capture_dir: str | Path, max_tokens: int, meta: Optional[dict] = None, rank: int = 0, max_pending: int = 2
    ):
        self.capture_dir, self.max_tokens = Path(capture_dir), int(max_tokens)
        self.meta, self.rank, self.max_pending = dict(meta or {}), int(rank), max_pending
        self.writer: Optional[CaptureWriter] = None

    def __call__(
        self,
        step: int,
        student_logits: torch.Tensor,
        teacher_output: TeacherOutput,
        labels: torch.Tensor,
        beta: float,
        temperature: float,
        gather_fn: Callable = default_gather,
        **_unused,
    ) -> Optional[Path]:
        """Capture one call (the loss's arguments); returns the file this rank will write, or None (another TP
        rank writes it, or the call has no active position)."""
        group, tp_rank, tp_size = tensor_parallel_group()
        vocab = student_logits.shape[-1] * tp_size
        with torch.no_grad():
            tensors, fmt = capture_tensors(
                student_logits, teacher_output, labels, self.max_tokens, gather_fn, vocab_size=vocab
            )
            if tp_size > 1 and not teacher_output.is_topk_mode:
                for key in (STUDENT_FULL, TEACHER_FULL):
                    full = gather_vocab_shards(tensors[key], group, tp_rank, tp_size)
                    if full is not None:  # the first TP rank; the others return below
                        tensors[key] = full
        if tp_rank != 0 or int(fmt["rows_active"]) == 0:
            return None
        host, ready = to_host(tensors)
        path = self.capture_dir / f"step{step}_rank{self.rank}.safetensors"
        meta = {**self.meta, **fmt, "step": step, "rank": self.rank, "tp_size": tp_size}
        if self.writer is None:
            self.writer = CaptureWriter(self.max_pending)
        self.writer.submit(path, host, capture_metadata(beta, temperature, meta), ready)
        return path

    def close(self) -> list:
        """Write every queued capture and stop the writer; returns the errors of failed writes."""
        return self.writer.close() if self.writer is not None else []
