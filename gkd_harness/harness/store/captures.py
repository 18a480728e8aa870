"""Captures of GKD loss inputs: one safetensors file per (step, writing rank), readable by ``gkd-replay``.

A capture holds the rows the loss saw, never more: the call's active positions (``extract_active``'s pairing of
student and teacher rows), the first ``max_tokens`` of them (the rows the FP64 spot check recomputes when both
caps are equal). Two formats, named by the metadata ``format``:

* ``topk_gathered`` (the teacher sent top-k log-probs): tensors ``student_topk_logits`` ``[n, K]`` (the student's
  logits gathered at the teacher's ids, through the call's own ``gather_fn``, so a vocab-parallel student is
  gathered whole), ``teacher_topk_logprobs`` ``[n, K]``, ``teacher_topk_indices`` ``[n, K]`` (global vocabulary
  ids), ``labels`` ``[n]``; metadata ``student_vocab`` (the full vocabulary width). In top-k mode the loss reads
  the student only at those ids, so the capture replays exactly, at ``n·K`` instead of ``B·S·V`` values.
* ``rows`` (full vocabulary): ``student_logits`` ``[n, V]``, ``teacher_full_logits`` ``[n, V']``, ``labels``
  ``[n]``. Under tensor parallelism the caller gathers the vocabulary shards first (``gkd_harness.harness.rank.capture``).

Files written before these formats (no ``format``: ``student_logits`` ``[B, S, V]``, ``labels`` ``[B, S]``,
``teacher_full_logits`` or ``teacher_topk_*`` ``[B, S, ·]``, optional ``teacher_labels``) still load.

Metadata (strings): ``beta``, ``temperature``, ``format``, ``rows_active`` (the call's active rows before the
cap), ``tp_size`` and, when known, ``precision``, ``beta_form``, ``step``, ``rank``. Tensors keep the dtype they
had at the loss boundary, so a replay sees exactly what the loss saw.

:func:`load_capture` returns every format as loss inputs (``student_logits [1, n, W]``, ``TeacherOutput``,
``labels [1, n]``): a top-k capture with local ids ``0 … K−1`` over the gathered values, on which the loss and
its gradient are the run's (the gradient is 0 at the ids the teacher did not send).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from swift.rlhf_trainers.gkd_loss import TeacherOutput, default_gather

REQUIRED_META = ("beta", "temperature")
#: ``format`` metadata values.
TOPK_GATHERED, ROWS = "topk_gathered", "rows"
#: Tensor names of the two formats.
STUDENT_TOPK, STUDENT_FULL, LABELS = "student_topk_logits", "student_logits", "labels"
TEACHER_TOPK_LOGPROBS, TEACHER_TOPK_INDICES, TEACHER_FULL = (
    "teacher_topk_logprobs",
    "teacher_topk_indices",
    "teacher_full_logits",
)


class CaptureError(ValueError):
    """A capture file is unreadable or inconsistent, or a capture cannot be built (the message names it)."""


# ----------------------------------------------------------------------------------------------------------
# building a capture from one loss call
# ----------------------------------------------------------------------------------------------------------
def capture_rows(
    teacher_output: TeacherOutput, labels: torch.Tensor, max_tokens: Optional[int]
) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """The call's active rows as ``extract_active`` pairs them, capped at ``max_tokens``.

    Args:
        teacher_output: the call's teacher (its ``labels`` select the teacher rows; ``None`` = the student's).
        labels: ``[B, S]``, -100 inactive.
        max_tokens: keep the first this many (``None``: all).
    Returns:
        ``(student row ids [n], teacher row ids [n], active rows before the cap)``; top-k rows whose log-probs
        are all ``-inf`` are dropped first, as upstream drops them.
    """
    s_mask = (labels != -100).reshape(-1)
    t_labels = teacher_output.labels
    t_mask = s_mask if t_labels is None else (t_labels != -100).reshape(-1)
    s_ids, t_ids = s_mask.nonzero().squeeze(-1), t_mask.nonzero().squeeze(-1)
    if s_ids.shape[0] != t_ids.shape[0]:
        raise CaptureError(f"student and teacher label masks select {s_ids.shape[0]} and {t_ids.shape[0]} positions")
    if teacher_output.is_topk_mode:
        lp = teacher_output.topk_logprobs.reshape(-1, teacher_output.topk_logprobs.shape[-1])
        keep = ~torch.isinf(lp[t_ids]).all(-1)
        s_ids, t_ids = s_ids[keep], t_ids[keep]
    active = int(s_ids.shape[0])
    n = active if max_tokens is None else min(active, int(max_tokens))
    return s_ids[:n], t_ids[:n], active


def capture_tensors(
    student_logits: torch.Tensor,
    teacher_output: TeacherOutput,
    labels: torch.Tensor,
    max_tokens: Optional[int] = None,
    gather_fn: Callable = default_gather,
    vocab_size: Optional[int] = None,
) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """The capture of one loss call as ``(tensors, metadata)``, detached, on the inputs' device.

    Args:
        student_logits: ``[B, S, V]`` (``V`` may be this rank's vocabulary shard in top-k mode, with ``gather_fn``
            the call's vocab-parallel gather; a collective then, so every rank of the group calls this).
        teacher_output: full ``[B, S, V']`` or top-k ``[B, S, K]``; labels: ``[B, S]``.
        max_tokens: cap on the rows (``None``: all active rows).
        gather_fn: the call's ``(logits [n, V], ids [n, K]) -> [n, K]``.
        vocab_size: the full vocabulary width (default ``V``); only top-k captures record it.
    Returns:
        Tensors of the ``topk_gathered`` or ``rows`` format (each a fresh tensor, never a view of the inputs)
        and the metadata ``format`` and ``rows_active``.
    """
    s_ids, t_ids, active = capture_rows(teacher_output, labels, max_tokens)
    vocab = student_logits.shape[-1]
    flat = student_logits.detach().reshape(-1, vocab)
    lab = labels.detach().reshape(-1)[s_ids]
    if teacher_output.is_topk_mode:
        k = teacher_output.topk_indices.shape[-1]
        ids = teacher_output.topk_indices.detach().reshape(-1, k)[t_ids]
        tensors = {
            STUDENT_TOPK: gather_rows(flat, s_ids, ids, gather_fn),
            TEACHER_TOPK_LOGPROBS: teacher_output.topk_logprobs.detach().reshape(-1, k)[t_ids],
            TEACHER_TOPK_INDICES: ids,
            LABELS: lab,
        }
        meta = {"format": TOPK_GATHERED, "student_vocab": str(int(vocab_size or vocab))}
    elif teacher_output.full_logits is not None:
        t = teacher_output.full_logits.detach()
        tensors = {STUDENT_FULL: flat[s_ids], TEACHER_FULL: t.reshape(-1, t.shape[-1])[t_ids], LABELS: lab}
        meta = {"format": ROWS}
    else:
        raise CaptureError("teacher_output has neither full_logits nor top-k tensors")
    meta["rows_active"] = str(active)
    return tensors, meta


#: Elements of the student rows copied at once for a caller's own ``gather_fn`` (2^23: 32 MiB in FP32).
GATHER_CHUNK_ELEMENTS = 1 << 23


def gather_rows(
    flat: torch.Tensor,
    s_ids: torch.Tensor,
    ids: torch.Tensor,
    gather_fn: Callable,
    rows_per_chunk: Optional[int] = None,
) -> torch.Tensor:
    """``flat[s_ids]`` ``[n, V]`` gathered at ``ids`` ``[n, K]`` -> ``[n, K]``, without an ``[n, V]`` copy: indexed
    directly for the default gather; for another (e.g. vocab-parallel) ``gather_fn`` on row chunks of
    ``rows_per_chunk`` rows (default: :data:`GATHER_CHUNK_ELEMENTS` elements). A vocab-parallel gather is a
    collective, so it is called even for ``n = 0``. Used by captures and by the FP64 spot check."""
    n, k = ids.shape
    if gather_fn is default_gather:
        return flat[s_ids[:, None], ids]
    step = rows_per_chunk or max(1, GATHER_CHUNK_ELEMENTS // max(1, flat.shape[-1]))
    if n == 0:
        return gather_fn(flat[s_ids], ids).detach()
    return torch.cat([gather_fn(flat[s_ids[i : i + step]], ids[i : i + step]).detach() for i in range(0, n, step)])


# ----------------------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------------------
def write_capture(path: str | os.PathLike, tensors: Dict[str, torch.Tensor], metadata: Dict[str, Any]) -> Path:
    """Write host tensors and string metadata to ``path`` atomically (a temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={k: str(v) for k, v in metadata.items()}
        )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def capture_metadata(beta: float, temperature: float, meta: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
    """The metadata strings of a capture: ``meta`` plus ``beta`` and ``temperature`` (exact reprs)."""
    metadata = {k: str(v) for k, v in (meta or {}).items()}
    metadata.update(beta=repr(float(beta)), temperature=repr(float(temperature)))
    return metadata


def save_capture(
    path: str | os.PathLike,
    student_logits: torch.Tensor,
    teacher_output: TeacherOutput,
    labels: torch.Tensor,
    beta: float,
    temperature: float,
    meta: Optional[Dict[str, Any]] = None,
    max_tokens: Optional[int] = None,
    gather_fn: Callable = default_gather,
) -> Path:
    """Capture one single-process loss call to ``path`` now (:func:`capture_tensors`, then :func:`write_capture`).

    Training captures go through ``gkd_harness.harness.rank.capture`` (vocab shards gathered, written off the hot path).
    """
    tensors, fmt = capture_tensors(student_logits, teacher_output, labels, max_tokens, gather_fn)
    metadata = capture_metadata(beta, temperature, {**(meta or {}), **fmt})
    return write_capture(path, {k: v.cpu() for k, v in tensors.items()}, metadata)


def _read(path: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    if not path.is_file():
        raise CaptureError(f"{path}: no such capture file")
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise CaptureError(f"{path}: not a readable safetensors capture ({e})") from e
    return tensors, meta


def _need(path: Path, tensors: Dict[str, torch.Tensor], *keys: str) -> None:
    for key in keys:
        if key not in tensors:
            raise CaptureError(f"{path}: missing tensor {key!r}")


def _check_ids(path: Path, idx: torch.Tensor, vocab: int) -> None:
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab):
        raise CaptureError(f"{path}: top-k indices outside the student vocabulary [0, {vocab})")


def _load_topk_gathered(path: Path, tensors, meta) -> Dict[str, Any]:
    """``topk_gathered`` -> loss inputs ``[1, n, K]`` over local ids ``0 … K−1`` (the global ids as ``vocab_ids``)."""
    _need(path, tensors, STUDENT_TOPK, TEACHER_TOPK_LOGPROBS, TEACHER_TOPK_INDICES, LABELS)
    s, lp, idx, lab = (tensors[k] for k in (STUDENT_TOPK, TEACHER_TOPK_LOGPROBS, TEACHER_TOPK_INDICES, LABELS))
    if not (s.dim() == 2 and s.shape == lp.shape == idx.shape and lab.shape == s.shape[:1]):
        raise CaptureError(
            f"{path}: {STUDENT_TOPK} {tuple(s.shape)} / {TEACHER_TOPK_LOGPROBS} {tuple(lp.shape)} / "
            f"{TEACHER_TOPK_INDICES} {tuple(idx.shape)} / labels {tuple(lab.shape)} are not [n, K] "
            "/ [n, K] / [n, K] / [n]"
        )
    try:
        vocab = int(meta["student_vocab"])
    except (KeyError, ValueError) as e:
        raise CaptureError(f"{path}: metadata student_vocab missing or not an integer") from e
    _check_ids(path, idx, vocab)
    n, k = s.shape
    labels = torch.zeros((1, n), dtype=torch.long)
    local = torch.arange(k).expand(1, n, k)
    teacher = TeacherOutput(topk_logprobs=lp[None], topk_indices=local, labels=labels)
    return dict(student_logits=s[None], labels=labels, teacher_output=teacher, vocab_ids=idx, token_ids=lab)


def _load_rows(path: Path, tensors, meta) -> Dict[str, Any]:
    """``rows`` -> loss inputs ``[1, n, V]``."""
    _need(path, tensors, STUDENT_FULL, TEACHER_FULL, LABELS)
    s, t, lab = tensors[STUDENT_FULL], tensors[TEACHER_FULL], tensors[LABELS]
    if not (s.dim() == 2 and t.dim() == 2 and s.shape[0] == t.shape[0] and lab.shape == s.shape[:1]):
        raise CaptureError(
            f"{path}: {STUDENT_FULL} {tuple(s.shape)} / {TEACHER_FULL} {tuple(t.shape)} / labels "
            f"{tuple(lab.shape)} are not [n, V] / [n, V'] / [n]"
        )
    labels = torch.zeros((1, s.shape[0]), dtype=torch.long)
    return dict(
        student_logits=s[None],
        labels=labels,
        teacher_output=TeacherOutput(full_logits=t[None], labels=labels),
        token_ids=lab,
    )


def _load_legacy(path: Path, tensors, meta) -> Dict[str, Any]:
    """The first format: the call's ``[B, S, ·]`` tensors as they were."""
    _need(path, tensors, STUDENT_FULL, LABELS)
    s, labels = tensors[STUDENT_FULL], tensors[LABELS]
    if s.shape[:-1] != labels.shape:
        raise CaptureError(f"{path}: student_logits {tuple(s.shape)} does not match labels {tuple(labels.shape)}")
    t_labels = tensors.get("teacher_labels", labels)
    if TEACHER_FULL in tensors:
        t = tensors[TEACHER_FULL]
        if t.shape[:-1] != t_labels.shape:
            raise CaptureError(f"{path}: teacher_full_logits {tuple(t.shape)} does not match labels")
        teacher = TeacherOutput(full_logits=t, labels=t_labels)
    elif TEACHER_TOPK_LOGPROBS in tensors and TEACHER_TOPK_INDICES in tensors:
        lp, idx = tensors[TEACHER_TOPK_LOGPROBS], tensors[TEACHER_TOPK_INDICES]
        if lp.shape != idx.shape or lp.shape[:-1] != t_labels.shape:
            raise CaptureError(
                f"{path}: top-k logprobs {tuple(lp.shape)} / indices {tuple(idx.shape)} / labels "
                f"{tuple(t_labels.shape)} are inconsistent"
            )
        _check_ids(path, idx, s.shape[-1])
        teacher = TeacherOutput(topk_logprobs=lp, topk_indices=idx, labels=t_labels)
    else:
        raise CaptureError(f"{path}: needs teacher_full_logits or teacher_topk_logprobs + teacher_topk_indices")
    if int((labels != -100).sum()) != int((t_labels != -100).sum()):
        raise CaptureError(f"{path}: student and teacher label masks select different numbers of positions")
    return dict(student_logits=s, labels=labels, teacher_output=teacher)


_LOADERS = {TOPK_GATHERED: _load_topk_gathered, ROWS: _load_rows, None: _load_legacy}


def load_capture(path: str | os.PathLike) -> Dict[str, Any]:
    """Read and validate a capture (any format).

    Returns a dict with the loss inputs ``student_logits`` ``[B, S, W]``, ``labels`` ``[B, S]`` and
    ``teacher_output`` (a ``TeacherOutput``; ``[1, n, ·]`` for the ``rows`` and ``topk_gathered`` formats),
    ``beta``, ``temperature`` (floats), ``meta`` (all metadata strings), ``path``; a ``topk_gathered`` capture adds
    ``vocab_ids`` ``[n, K]`` (the teacher's global ids) and both formats ``token_ids`` ``[n]`` (the labels).
    Raises :class:`CaptureError` naming the file and the problem.
    """
    path = Path(path)
    tensors, meta = _read(path)
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
    fmt = meta.get("format")
    if fmt not in _LOADERS:
        raise CaptureError(f"{path}: metadata format={fmt!r} not one of {sorted(k for k in _LOADERS if k)}")
    out = _LOADERS[fmt](path, tensors, meta)
    if not out["student_logits"].is_floating_point():
        raise CaptureError(f"{path}: student logits must be floating point, got {out['student_logits'].dtype}")
    return dict(out, beta=beta, temperature=temperature, meta=meta, path=path)
