"""Captures of GKD loss inputs: one safetensors file per (step, rank), readable by ``gkd-replay``.

Layout of a capture file:

* tensors ``student_logits`` ``[B, S, V]`` (or ``[N, V]``), ``labels`` ``[B, S]`` (pre-shifted, -100 inactive),
  and either ``teacher_full_logits`` ``[B, S, V']`` or ``teacher_topk_logprobs`` + ``teacher_topk_indices``
  ``[B, S, K]``; optional ``teacher_labels``.
* metadata (strings): ``beta``, ``temperature`` and, when known, ``precision``, ``beta_form``, ``step``, ``rank``.

Tensors are stored in the dtype they had at the loss boundary, so a replay sees exactly what the loss saw.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from swift.rlhf_trainers.gkd_loss import TeacherOutput

REQUIRED_META = ("beta", "temperature")


class CaptureError(ValueError):
    """A capture file is unreadable or inconsistent."""


def save_capture(path: str | os.PathLike,
                 student_logits: torch.Tensor,
                 teacher_output: TeacherOutput,
                 labels: torch.Tensor,
                 beta: float,
                 temperature: float,
                 meta: Optional[Dict[str, Any]] = None) -> Path:
    """Write one loss call's inputs to ``path`` (atomically: a temporary file, then rename)."""
    tensors = {
        "student_logits": student_logits.detach().contiguous().cpu(),
        "labels": labels.detach().contiguous().cpu(),
    }
    if teacher_output.is_topk_mode:
        tensors["teacher_topk_logprobs"] = teacher_output.topk_logprobs.detach().contiguous().cpu()
        tensors["teacher_topk_indices"] = teacher_output.topk_indices.detach().contiguous().cpu()
    elif teacher_output.full_logits is not None:
        tensors["teacher_full_logits"] = teacher_output.full_logits.detach().contiguous().cpu()
    else:
        raise CaptureError("teacher_output has neither full_logits nor top-k tensors")
    if teacher_output.labels is not None and teacher_output.labels is not labels:
        # a copy of its own: safetensors refuses two names for one storage (e.g. a view of ``labels``)
        tensors["teacher_labels"] = teacher_output.labels.detach().cpu().clone()
    metadata = {k: str(v) for k, v in (meta or {}).items()}
    metadata.update(beta=repr(float(beta)), temperature=repr(float(temperature)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)
    return path


def load_capture(path: str | os.PathLike) -> Dict[str, Any]:
    """Read and validate a capture.

    Returns a dict with ``student_logits``, ``labels``, ``teacher_output`` (a ``TeacherOutput``), ``beta``,
    ``temperature`` (floats), ``meta`` (all metadata strings) and ``path``.
    Raises :class:`CaptureError` naming the file and the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise CaptureError(f"{path}: no such capture file")
    try:
        tensors = load_file(str(path))
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise CaptureError(f"{path}: not a readable safetensors capture ({e})") from e
    for key in ("student_logits", "labels"):
        if key not in tensors:
            raise CaptureError(f"{path}: missing tensor {key!r}")
    for key in REQUIRED_META:
        if key not in meta:
            raise CaptureError(f"{path}: missing metadata {key!r}")
    try:
        beta, temperature = float(meta["beta"]), float(meta["temperature"])
    except ValueError as e:
        raise CaptureError(f"{path}: metadata beta/temperature not numbers ({e})") from e
    if not 0.0 <= beta <= 1.0 or math.isnan(beta):
        raise CaptureError(f"{path}: metadata beta={beta} outside [0, 1]")
    if not temperature > 0:
        raise CaptureError(f"{path}: metadata temperature={temperature} must be > 0")
    s, labels = tensors["student_logits"], tensors["labels"]
    if not s.is_floating_point():
        raise CaptureError(f"{path}: student_logits must be floating point, got {s.dtype}")
    if s.shape[:-1] != labels.shape:
        raise CaptureError(f"{path}: student_logits {tuple(s.shape)} does not match labels {tuple(labels.shape)}")
    t_labels = tensors.get("teacher_labels", labels)
    if "teacher_full_logits" in tensors:
        t = tensors["teacher_full_logits"]
        if t.shape[:-1] != t_labels.shape:
            raise CaptureError(f"{path}: teacher_full_logits {tuple(t.shape)} does not match labels")
        teacher = TeacherOutput(full_logits=t, labels=t_labels)
    elif "teacher_topk_logprobs" in tensors and "teacher_topk_indices" in tensors:
        lp, idx = tensors["teacher_topk_logprobs"], tensors["teacher_topk_indices"]
        if lp.shape != idx.shape or lp.shape[:-1] != t_labels.shape:
            raise CaptureError(f"{path}: top-k logprobs {tuple(lp.shape)} / indices {tuple(idx.shape)} / labels "
                               f"{tuple(t_labels.shape)} are inconsistent")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= s.shape[-1]):
            raise CaptureError(f"{path}: top-k indices outside the student vocabulary [0, {s.shape[-1]})")
        teacher = TeacherOutput(topk_logprobs=lp, topk_indices=idx, labels=t_labels)
    else:
        raise CaptureError(f"{path}: needs teacher_full_logits or teacher_topk_logprobs + teacher_topk_indices")
    if int((labels != -100).sum()) != int((t_labels != -100).sum()):
        raise CaptureError(f"{path}: student and teacher label masks select different numbers of positions")
    return dict(student_logits=s, labels=labels, teacher_output=teacher, beta=beta, temperature=temperature,
                meta=meta, path=path)
