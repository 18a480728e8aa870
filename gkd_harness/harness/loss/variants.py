"""GKD / generalized-JSD loss variants: upstream ms-swift ("native") and the patched forms.

Two independent axes select a variant:

* ``precision``
    - ``"native"``: upstream ms-swift arithmetic. Temperature scaling, log-softmax and exp run in whatever
      dtype each side arrives in (BF16 teacher logits stay BF16), which makes the JSD negative on
      near-identical distributions (the precision defect, docs/defects.md).
    - ``"fp32"``: BF16/FP16 logits are promoted to FP32 *before* temperature scaling; FP64 stays FP64; mixed
      inputs compute in the widest dtype. Top-k: the student is gathered at the teacher's ids first, then
      upcast. With the default primitives it computes the cancellation-free form (``_jsd_stable``) and its
      closed-form gradient chunk by chunk (``_FusedChunkedJSD``): promotion per chunk, the gradient kept in
      the student's dtype, no activation graph, so no FP32 copy of a whole ``[N, V]`` BF16 tensor is ever
      alive. With injected primitives (Megatron's vocab-parallel ones) the same form, blocks and closed-form
      gradient run with each kernel step's row sums through the injected ``kl_div_fn`` in one reduction
      (``gkd_harness.harness.loss.stable.InjectedRows``), a student narrower than the teacher included
      (upstream's alignment); the textbook formula (per chunk, recompute-in-backward) is left for a teacher
      narrower than the student or with a
      gradient or an explicit ``recompute``. The formula is chosen per row/element where a single one would lose digits
      (logits/T in the thousands, β within ~1/4 of an endpoint, |log T/S| > 30, nearly one-hot rows, −inf
      top-k log-probs); FP16 students' stored gradient is scaled per row by a power of two so a loss scale
      cannot meet an underflowed value. See docs/loss_accuracy.md.
    - ``"fp64"``: everything in FP64: the same cancellation-free form and closed-form gradient (exact on
      super-confident and disjoint rows; the spot check's and gkd-replay's reference), the textbook formula
      where ``fp32`` would use it (NaN-safe KL for −inf top-k log-probs).
* ``beta_form``
    - ``"paper"``: ``β·KL(T‖M) + (1−β)·KL(S‖M)``, ``M = (1−β)·S + β·T`` (GKD paper, upstream).
    - ``"continuous"``: ``(1−β)·KL(T‖M) + β·KL(S‖M)`` with the same M: continuous at β→0/1 where the limits
      are the pure KLs returned by the endpoint branches (the β defect, docs/defects.md). β=0, β=1 and β=0.5 are identical
      to the paper form.

At the endpoints both forms return ``β=0 → KL(T‖S)`` (forward KL) and ``β=1 → KL(S‖T)`` (reverse KL).
No variant clamps anything.

Public API (the contract in docs/architecture.md)::

    make_gkd_loss(precision, beta_form)        # drop-in for swift.rlhf_trainers.gkd_loss.gkd_loss
    make_jsd_loss(precision, beta_form)        # drop-in for swift.rlhf_trainers.gkd_loss.jsd_loss
    make_gkd_loss_terms(precision, beta_form)  # same signature as gkd_loss -> GKDTerms(total, num_valid, per_position)

``make_gkd_loss("native", "paper")`` *is* the installed ms-swift function.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, TypeVar

import torch
from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers.gkd_loss import (
    TeacherOutput,
    default_gather,
    default_kl_div,
    default_log_softmax,
    extract_active,
)

from gkd_harness.harness.contract import BETA_FORMS, BUILTIN_PRECISIONS, DTYPE_NAMES, FP32, FP64, NATIVE, PAPER
from gkd_harness.harness.loss.chunked import (
    _chunk_fn,
    _FusedChunkedJSD,
    _RecomputedChunkedJSD,
    _rows_per_chunk,
    block_rows,
)
from gkd_harness.harness.loss.native import _jsd_native_chunk
from gkd_harness.harness.loss.stable import InjectedRows, TorchRows

#: Config / CLI dtype names (``model.student_dtype``, ``gkd-replay --student-dtype``) and their torch dtypes.
DTYPES_BY_NAME: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


__all__ = [
    "BUILTIN_PRECISIONS",
    "BETA_FORMS",
    "DTYPES_BY_NAME",
    "GKDTerms",
    "compute_dtype",
    "make_gkd_loss",
    "make_jsd_loss",
    "make_gkd_loss_terms",
    "jsd_per_position",
    "gkd_per_position",
]


class GKDTerms(NamedTuple):
    """Result of one GKD loss call with its per-position breakdown.

    total: scalar, unnormalised sum of per-position JSD (exactly what ``make_gkd_loss`` returns).
    num_valid: scalar int tensor, number of active positions (upstream semantics: after dropping
        positions whose top-k log-probs are all -inf).
    per_position: ``[N]`` per-position JSD of the active positions, attached to the graph.
    """

    total: torch.Tensor
    num_valid: torch.Tensor
    per_position: torch.Tensor


def _check_variant(precision: str, beta_form: str) -> None:
    if precision not in BUILTIN_PRECISIONS:
        raise ValueError(f"loss.precision must be one of {BUILTIN_PRECISIONS}, got {precision!r}")
    if beta_form not in BETA_FORMS:
        raise ValueError(f"loss.beta_form must be one of {BETA_FORMS}, got {beta_form!r}")


_Fn = TypeVar("_Fn", bound=Callable)


def _named_variant(fn: _Fn, precision: str, beta_form: str, rename: bool = True) -> _Fn:
    """``fn`` carrying its variant: ``fn.precision``, ``fn.beta_form`` and (``rename``) the name
    ``<name>_<precision>_<beta_form>`` that tracebacks and profiles show."""
    if rename:
        fn.__qualname__ = fn.__name__ = f"{fn.__name__}_{precision}_{beta_form}"
    setattr(fn, "precision", precision)
    setattr(fn, "beta_form", beta_form)
    return fn


def _check_beta(beta: float) -> float:
    beta = float(beta)
    if not (0.0 <= beta <= 1.0) or math.isnan(beta):
        raise ValueError(f"gkd.beta must lie in [0, 1], got {beta!r}")
    return beta


def compute_dtype(precision: str, *dtypes: torch.dtype) -> Optional[torch.dtype]:
    """The dtype the loss arithmetic runs in, or None for ``native`` (each side keeps its own dtype).

    ``fp32``: the widest of FP32 and the input dtypes (BF16/FP16 → FP32, FP64 stays FP64).
    ``fp64``: always FP64.
    """
    if precision == NATIVE:
        return None
    if precision == FP64:
        return torch.float64
    out = torch.float32
    for dt in dtypes:
        out = torch.promote_types(out, dt)
    return out


def jsd_per_position(
    s_logits: torch.Tensor,
    t_logits: torch.Tensor,
    beta: float,
    *,
    precision: str = FP32,
    beta_form: str = PAPER,
    temperature: Optional[float] = None,
    log_softmax_fn: Callable = default_log_softmax,
    kl_div_fn: Callable = default_kl_div,
    chunk_size: int = 512,
    align_vocab: bool = False,
    recompute: Optional[bool] = None,
):
    """Per-position generalized JSD of ``N`` rows, plus the total summed as the variant sums it.

    Args:
        s_logits: ``[N, D]`` student logits (any float dtype).
        t_logits: ``[N, D']`` teacher logits or log-probs (``D' != D`` only with ``align_vocab``).
        beta: interpolation in [0, 1] (0 = forward KL(T‖S), 1 = reverse KL(S‖T)).
        precision, beta_form: the variant (see module docstring).
        temperature: if given, logits are divided by it *after* promotion (patched) or in the input dtype
            (native). ``None`` means the inputs are already temperature-scaled (the ``jsd_loss`` contract).
        log_softmax_fn: ``[C, D] -> [C, D]``; kl_div_fn: ``(input_log [C, D], target_log [C, D]) -> [C]``,
            i.e. KL(target‖input) per position.
        chunk_size: upstream's row chunk.
        align_vocab: apply upstream's vocabulary alignment (pad the smaller side) before scaling.
        recompute: recompute activations in backward (default: on for patched precisions when D > 1024).

    Returns:
        ``(per_position [N], total scalar)``.
    """
    _check_variant(precision, beta_form)
    beta = _check_beta(beta)
    n = s_logits.shape[0]
    if n == 0:
        # Empty partition (e.g. a CP rank with no valid token): keep the student graph connected.
        empty = s_logits.new_zeros((0,))
        cd = compute_dtype(precision, s_logits.dtype, t_logits.dtype)
        total = s_logits.sum() if cd is None else s_logits.to(cd).sum()
        return empty if cd is None else empty.to(cd), total

    if precision == NATIVE:
        if align_vocab:
            s_logits, t_logits = upstream._align_vocab(s_logits, t_logits)
        if temperature is not None:
            s_logits = s_logits / temperature
            t_logits = t_logits / temperature
        total = s_logits.new_zeros(())
        parts = []
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            s_log = log_softmax_fn(s_logits[start:end])
            t_log = log_softmax_fn(t_logits[start:end])
            jsd = _jsd_native_chunk(s_log, t_log, beta, beta_form, kl_div_fn)
            total = total + jsd.sum()
            parts.append(jsd)
        return torch.cat(parts), total

    cd = compute_dtype(precision, s_logits.dtype, t_logits.dtype)
    width = max(s_logits.shape[-1], t_logits.shape[-1])
    # The fused closed-form path: no activation graph, no recompute. A teacher without gradient, as wide as the
    # student, or wider under upstream's alignment (the student takes the teacher's extra logits).
    fused = (
        recompute is None
        and not t_logits.requires_grad
        and (s_logits.shape[-1] == t_logits.shape[-1] or (align_vocab and s_logits.shape[-1] < t_logits.shape[-1]))
    )
    if fused:
        # Row sums through the injected primitives where a row may be a vocabulary shard (one reduction per kernel
        # step, not one per sum). fp32: row blocks sized from the width and the device, whatever the primitives;
        # fp64 (the reference): blocks no larger than upstream's chunks.
        default = log_softmax_fn is default_log_softmax and kl_div_fn is default_kl_div
        ops = TorchRows if default else InjectedRows(log_softmax_fn, kl_div_fn)
        if precision == FP32:
            rows = block_rows(n, width, s_logits.device)
        else:
            in_itemsize = min(s_logits.element_size(), t_logits.element_size())
            cd_itemsize = torch.empty((), dtype=cd).element_size()
            rows = n if width <= 1024 else _rows_per_chunk(n, chunk_size, in_itemsize, cd_itemsize)
        per_position = _FusedChunkedJSD.apply(s_logits, t_logits, cd, temperature, beta, beta_form, rows, ops)
        return per_position, per_position.sum()
    fn = _chunk_fn(precision, cd, temperature, align_vocab, beta, beta_form, log_softmax_fn, kl_div_fn)
    if recompute is None:
        recompute = width > 1024
    in_itemsize = min(s_logits.element_size(), t_logits.element_size())
    rows = _rows_per_chunk(n, chunk_size, in_itemsize, torch.empty((), dtype=cd).element_size())
    if recompute:
        per_position = _RecomputedChunkedJSD.apply(s_logits, t_logits, fn, rows, cd)
    else:
        per_position = torch.cat([fn(s_logits[i : i + rows], t_logits[i : i + rows]) for i in range(0, n, rows)])
    return per_position, per_position.sum()


def make_jsd_loss(precision: str = FP32, beta_form: str = PAPER) -> Callable:
    """A drop-in for ``swift.rlhf_trainers.gkd_loss.jsd_loss`` with the chosen variant.

    The returned function has upstream's signature
    ``(s_logits [N, D], t_logits [N, D], beta, log_softmax_fn=..., kl_div_fn=..., chunk_size=512) -> total``
    where inputs are already temperature-scaled and ``total`` is the unnormalised scalar sum.
    """
    _check_variant(precision, beta_form)
    if precision == NATIVE and beta_form == PAPER:
        return upstream.jsd_loss

    def jsd_loss(
        s_logits: torch.Tensor,
        t_logits: torch.Tensor,
        beta: float,
        log_softmax_fn: Callable = default_log_softmax,
        kl_div_fn: Callable = default_kl_div,
        chunk_size: int = 512,
    ) -> torch.Tensor:
        _, total = jsd_per_position(
            s_logits,
            t_logits,
            beta,
            precision=precision,
            beta_form=beta_form,
            log_softmax_fn=log_softmax_fn,
            kl_div_fn=kl_div_fn,
            chunk_size=chunk_size,
        )
        return total

    return _named_variant(jsd_loss, precision, beta_form)


def gkd_per_position(
    student_logits: torch.Tensor,
    teacher_output: TeacherOutput,
    labels: torch.Tensor,
    beta: float,
    temperature: float,
    gather_fn: Callable = default_gather,
    log_softmax_fn: Callable = default_log_softmax,
    kl_div_fn: Callable = default_kl_div,
    chunk_size: int = 512,
    *,
    precision: str = FP32,
    beta_form: str = PAPER,
) -> GKDTerms:
    """The full GKD pipeline (mask → prepare → JSD) of the chosen variant, with per-position values.

    Args:
        student_logits: ``[B, S, V]`` (or packed ``[1, T, V]``) student logits.
        teacher_output: ``TeacherOutput`` with ``full_logits [B, S, V']`` or
            ``topk_logprobs/topk_indices [B, S, K]``, and ``labels [B, S]``.
        labels: ``[B, S]`` pre-shifted, -100 for inactive positions.
        beta, temperature: as upstream; ``temperature > 0``.
        gather_fn: ``(logits [N, V], indices [N, K]) -> [N, K]`` (TP-aware under Megatron).
        log_softmax_fn, kl_div_fn: used on the full-vocabulary path (vocab-parallel under TP); the top-k path
            uses the default ones, like upstream.
    Returns:
        ``GKDTerms(total, num_valid, per_position [N])``.
    """
    _check_variant(precision, beta_form)
    if not temperature > 0:
        raise ValueError(f"gkd.temperature must be > 0, got {temperature!r}")
    teacher_output.validate()
    s_active, t_active, num_valid = extract_active(student_logits, teacher_output, labels)
    if t_active.is_topk_mode:
        # Gather at the teacher's top-k ids in the input dtype, then promote the small [N, K] tensors.
        s_logits = gather_fn(s_active, t_active.topk_indices)
        t_logits = t_active.topk_logprobs
        lsf, kdf, align = default_log_softmax, default_kl_div, False
    else:
        s_logits, t_logits = s_active, t_active.full_logits
        lsf, kdf, align = log_softmax_fn, kl_div_fn, True
    per_position, total = jsd_per_position(
        s_logits,
        t_logits,
        beta,
        precision=precision,
        beta_form=beta_form,
        temperature=temperature,
        log_softmax_fn=lsf,
        kl_div_fn=kdf,
        chunk_size=chunk_size,
        align_vocab=align,
    )
    return GKDTerms(total, num_valid, per_position)


def make_gkd_loss_terms(precision: str = FP32, beta_form: str = PAPER) -> Callable[..., GKDTerms]:
    """Like :func:`make_gkd_loss` but returning :class:`GKDTerms` (with the per-position JSD).

    For ``native``/``paper`` the total is bit-identical to the installed ms-swift ``gkd_loss``.
    """
    _check_variant(precision, beta_form)

    def gkd_loss_terms(
        student_logits,
        teacher_output,
        labels,
        beta,
        temperature,
        gather_fn=default_gather,
        log_softmax_fn=default_log_softmax,
        kl_div_fn=default_kl_div,
        chunk_size=512,
    ) -> GKDTerms:
        return gkd_per_position(
            student_logits,
            teacher_output,
            labels,
            beta,
            temperature,
            gather_fn,
            log_softmax_fn,
            kl_div_fn,
            chunk_size,
            precision=precision,
            beta_form=beta_form,
        )

    return _named_variant(gkd_loss_terms, precision, beta_form, rename=False)


def make_gkd_loss(precision: str = FP32, beta_form: str = PAPER) -> Callable:
    """A drop-in for ``swift.rlhf_trainers.gkd_loss.gkd_loss`` with the chosen variant.

    Signature: ``(student_logits [B, S, V], teacher_output, labels [B, S], beta, temperature, gather_fn=...,
    log_softmax_fn=..., kl_div_fn=..., chunk_size=512) -> (total scalar, num_valid scalar)``.
    ``("native", "paper")`` returns the installed ms-swift function itself.
    """
    _check_variant(precision, beta_form)
    if precision == NATIVE and beta_form == PAPER:
        return upstream.gkd_loss
    terms = make_gkd_loss_terms(precision, beta_form)

    def gkd_loss(
        student_logits,
        teacher_output,
        labels,
        beta,
        temperature,
        gather_fn=default_gather,
        log_softmax_fn=default_log_softmax,
        kl_div_fn=default_kl_div,
        chunk_size=512,
    ):
        out = terms(
            student_logits, teacher_output, labels, beta, temperature, gather_fn, log_softmax_fn, kl_div_fn, chunk_size
        )
        return out.total, out.num_valid

    return _named_variant(gkd_loss, precision, beta_form)
