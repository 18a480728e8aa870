"""The FP64 spot check of one loss call (``spot/*``), and the parameter-gradient comparison
(``spot/param_grad_rel_l2``); :class:`gkd_harness.harness.rank.instrument.LossInstrument` runs them on spot steps.

Inputs are the caller's: :func:`spot_inputs` copies the rows the check recomputes, and the instrument takes that
copy **before** the loss call, so a loss that writes into its inputs (an in-place shift of the teacher's logits,
say) is judged against the inputs the trainer handed it, not against what it left behind. The copy is the capped
problem only: ``[n, K]`` gathered values in top-k mode, ``[n, V]`` rows (student and teacher) for the full
vocabulary, ``n ≤ monitor.spot_check.max_tokens``.

Imports torch and ms-swift's loss file only (no trainer, no ``swift.utils``), so the bare GPU proof
(``launch/gpu_bare.py``) runs it on an image without ms-swift's dependencies.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput, default_gather

from gkd_harness.harness.contract import (
    SPOT_GRAD_REL_L2,
    SPOT_GRAD_REL_L2_DTYPE_FLOOR,
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    SPOT_SIGN_MISMATCH,
)
from gkd_harness.harness.loss.tolerances import LOW_PRECISION_GRAD_FACTOR
from gkd_harness.harness.store.captures import capture_rows, gather_rows

#: The extra arguments of ms-swift's ``gkd_loss`` after ``temperature``, in order.
_LOSS_EXTRA_ARGS = ("gather_fn", "log_softmax_fn", "kl_div_fn", "chunk_size")

#: Elements of one row chunk of a full-vocabulary spot check, per device type. On a CPU 2^20 (4 rows at
#: V = 248,320; 8 MiB per FP64 ``[rows, V]`` tensor, so the FP64 evaluation's temporaries are reused by the
#: allocator instead of being page-faulted afresh: measured 1.7x a loss call at V = 248,320, against 2.1x at
#: 2^23; docs/performance.md). On CUDA 2^23 (64 MiB as FP64): few kernel launches, a few per cent of the loss's
#: own ``[N, V]`` tensors.
SPOT_CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 23}
_SPOT_CHUNK_ELEMENTS_OTHER = 1 << 22


def _chunk_rows(vocab: int, device) -> int:
    """Rows per spot-check chunk: :data:`SPOT_CHUNK_ELEMENTS` of the device type ÷ the row width (at least 1)."""
    budget = SPOT_CHUNK_ELEMENTS.get(torch.device(device).type, _SPOT_CHUNK_ELEMENTS_OTHER)
    return max(1, budget // max(1, vocab))


def loss_kwargs(args: tuple, kwargs: dict) -> dict:
    """The call's extra ``gkd_loss`` arguments (positional or keyword) by name."""
    if len(args) > len(_LOSS_EXTRA_ARGS):
        raise TypeError(f"gkd_loss takes at most {len(_LOSS_EXTRA_ARGS)} arguments after temperature")
    return {**dict(zip(_LOSS_EXTRA_ARGS, args)), **kwargs}


def _active_rows(student_logits: torch.Tensor, teacher_output: TeacherOutput, labels: torch.Tensor, max_tokens: int):
    """Row indices of the call's active positions as ``extract_active`` pairs them, capped at ``max_tokens``: the
    rows a capture of the call holds (``gkd_harness.harness.store.captures.capture_rows``), so replay and spot check agree.

    Returns ``(student rows [R, V] (a view where possible), student row ids [n], teacher row ids [n])``; nothing
    of size ``[n, V]`` is copied here.
    """
    s_ids, t_ids, _ = capture_rows(teacher_output, labels, max_tokens)
    return student_logits.detach().reshape(-1, student_logits.shape[-1]), s_ids, t_ids


def _spot_pieces(student_logits, teacher_output, labels, max_tokens: int, extra: dict):
    """The capped problem as pieces ``(student [1, r, W], TeacherOutput, labels [1, r], loss kwargs)``.

    Top-k: one piece of the student gathered at the teacher's ids (``[1, n, K]``, through the call's own
    ``gather_fn``, so TP shards gather as in the run), the teacher's ids replaced by ``0 … K−1`` and the default
    gather: the loss and its gradient on the gathered values are the run's (the gradient is 0 elsewhere).
    Full vocabulary: row chunks of at most :data:`SPOT_CHUNK_ELEMENTS` elements (per device type) with the call's
    own primitives.
    """
    s_rows, s_ids, t_ids = _active_rows(student_logits, teacher_output, labels, max_tokens)
    n, vocab = int(s_ids.shape[0]), s_rows.shape[-1]
    dev = labels.device
    if teacher_output.is_topk_mode:
        k = teacher_output.topk_indices.shape[-1]
        ids = teacher_output.topk_indices.reshape(-1, k)[t_ids]
        vals = teacher_output.topk_logprobs.reshape(-1, k)[t_ids].detach()
        # the call's own (TP-aware) gather on row chunks; straight from the rows for the default one
        s_k = gather_rows(s_rows, s_ids, ids, extra.get("gather_fn", default_gather), _chunk_rows(vocab, s_rows.device))
        lab = torch.zeros((1, n), dtype=torch.long, device=dev)
        local = torch.arange(k, device=ids.device).expand(n, k)
        teacher = TeacherOutput(topk_logprobs=vals[None], topk_indices=local[None], labels=lab)
        yield s_k.detach()[None], teacher, lab, {**extra, "gather_fn": default_gather}
        return
    t_rows = teacher_output.full_logits.reshape(-1, teacher_output.full_logits.shape[-1])
    step = _chunk_rows(vocab, s_rows.device)
    for i in range(0, n, step):
        s_c, t_c = s_rows[s_ids[i : i + step]], t_rows[t_ids[i : i + step]].detach()
        lab = torch.zeros((1, s_c.shape[0]), dtype=torch.long, device=dev)
        yield s_c[None], TeacherOutput(full_logits=t_c[None], labels=lab), lab, extra


def _total_and_grad(
    terms_fn: Callable, x: torch.Tensor, teacher: TeacherOutput, labels, beta, temperature, kwargs: dict
):
    """``(total as float, d total / d x)`` of one piece; ``x`` is a leaf (gradient in ``x``'s dtype)."""
    with torch.enable_grad():
        out = terms_fn(x, teacher, labels, beta, temperature, **kwargs)
        (grad,) = torch.autograd.grad(out.total, x, allow_unused=True)
    grad = torch.zeros_like(x) if grad is None else grad
    return float(out.total.detach().to(torch.float64)), grad


def _over_tensor_parallel(device, *squares: float) -> Tuple[float, ...]:
    """``squares`` (sums of squares over this rank's entries) summed over the tensor-parallel group: the squared
    norms of the whole vocabulary, so ``spot/grad_rel_l2`` is the global relative L2 ``‖g − g64‖ / ‖g64‖``.

    Under Megatron TP each rank holds its vocabulary shard of the full-vocabulary gradient (top-k: the gathered
    ``[n, K]`` values, the same on every rank, so the sum scales both norms alike and the ratio is unchanged). Before,
    each rank's own shard ratio went to the metric, whose maximum over ranks is an upper bound, not the named
    value. One all-reduce of a few FP64 numbers per spot check, on the TP group only (the ranks of one stage call
    the loss together); nothing without TP."""
    from gkd_harness.harness.rank.parallel_state import tensor_parallel_group

    group, _, size = tensor_parallel_group()
    if size <= 1:
        return squares
    import torch.distributed as dist

    t = torch.tensor(squares, dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    return tuple(t.tolist())


def _sq(x: torch.Tensor) -> float:
    """``‖x‖²`` accumulated in FP64."""
    return float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2


Piece = Tuple[torch.Tensor, TeacherOutput, torch.Tensor, dict]


def _copy_teacher(t: TeacherOutput) -> TeacherOutput:
    copy = lambda x: None if x is None else x.detach().clone()  # noqa: E731
    return TeacherOutput(
        full_logits=copy(t.full_logits),
        topk_logprobs=copy(t.topk_logprobs),
        topk_indices=copy(t.topk_indices),
        labels=copy(t.labels),
    )


def spot_inputs(student_logits, teacher_output, labels, max_tokens: int, *args, **kwargs) -> List[Piece]:
    """Copies of the capped problem (:func:`_spot_pieces`, every chunk at once), to take before the loss call.

    Every tensor in a piece is a fresh gather or row copy (advanced indexing), never a view of the call's inputs.
    """
    return list(_spot_pieces(student_logits, teacher_output, labels, max_tokens, loss_kwargs(args, kwargs)))


def spot_check(
    run_terms: Callable,
    ref_terms: Callable,
    student_logits,
    teacher_output,
    labels,
    beta,
    temperature,
    max_tokens: int,
    *args,
    **kwargs,
) -> Optional[Dict[str, float]]:
    """FP64 spot check of one loss call (``None`` if the call has no active position); the pieces are made one at
    a time (one chunk's tensors alive at once). :func:`spot_check_pieces` on pieces copied earlier.

    Returns the contract ``spot/*`` values: ``loss`` (run's variant, per-position mean on the capped inputs),
    ``loss_fp64``, ``loss_abs_err``, ``loss_rel_err`` (abs / |fp64|), ``grad_rel_l2``
    (``‖g − g64‖ / ‖g64‖`` of d loss / d student logits), ``sign_mismatch`` (1.0 when signs differ).
    A non-finite loss or gradient on either side makes the comparisons NaN (a failed check, logged as NaN).
    """
    pieces = _spot_pieces(student_logits, teacher_output, labels, max_tokens, loss_kwargs(args, kwargs))
    return spot_check_pieces(run_terms, ref_terms, pieces, beta, temperature)


def spot_check_pieces(
    run_terms: Callable, ref_terms: Callable, pieces, beta, temperature
) -> Optional[Dict[str, float]]:
    """The spot check's values over ``pieces`` (:func:`_spot_pieces` or :func:`spot_inputs`).

    Two loss evaluations per piece, whatever the student's dtype: the run's variant on the student's values, and
    the FP64 variant on the same values as an FP64 leaf (its gradient ``exact``, unrounded). The reference
    gradient ``g64`` is ``exact`` rounded once to the student's dtype: for FP32 and BF16 students bit-identical to
    the FP64 variant's gradient on a student-dtype leaf (the FP64 loss computes in FP64 and rounds once into the
    leaf's dtype), which earlier versions computed in a third evaluation. For FP16 students the loss stores its
    gradient times a power of two per row, so on subnormal entries that storage rounds twice; ``g64`` rounds once
    and no longer shares that storage with the run's gradient (which would hide an error in it): where many entries
    are subnormal, ``grad_rel_l2`` now shows those ulps (e.g. 3e-3 at T = 2, β = 0.05, against a dtype floor of
    0.05). ``exact`` also gives the dtype floor (rounding ``exact → g64``).
    """
    n, run_sum, ref_sum, dn2, gn2, round2, exact2 = 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    low, device = False, None
    for s, teacher, lab, kw in pieces:
        device = s.device
        low = s.dtype not in (torch.float32, torch.float64)  # a BF16/FP16 student: the dtype floor is measured
        if s.shape[1] == 0:
            continue
        n += s.shape[1]
        s = s.detach()  # a fresh gather / row copy: the run's leaf needs no clone of it
        # the run's variant gets its own copy of the teacher: a loss that writes into its inputs must not change
        # what the FP64 evaluation below sees (one chunk's teacher at a time)
        run_total, grad = _total_and_grad(
            run_terms, s.requires_grad_(True), _copy_teacher(teacher), lab, beta, temperature, kw
        )
        s = s.detach()
        x64 = s.to(torch.float64)
        ref_total, exact = _total_and_grad(
            ref_terms, (x64.detach() if x64 is s else x64).requires_grad_(True), teacher, lab, beta, temperature, kw
        )
        del x64
        run_sum, ref_sum = run_sum + run_total, ref_sum + ref_total
        exact = exact.detach()
        g64 = exact.to(s.dtype).to(torch.float64)  # the FP64 gradient as the student's dtype holds it
        gn2 += _sq(g64)
        if low:  # what the student's dtype cannot represent: the floor of the gradient comparison
            exact2 += _sq(exact)
            round2 += _sq(exact.sub_(g64))  # exact is not needed after this
        del exact
        dn2 += _sq(g64.sub_(grad))
        del g64, grad
    if n == 0:
        return None
    dn2, gn2, round2, exact2 = _over_tensor_parallel(device, dn2, gn2, round2, exact2)
    loss, ref = run_sum / n, ref_sum / n
    finite = math.isfinite(loss) and math.isfinite(ref)
    abs_err = abs(loss - ref) if finite else math.nan
    gnorm, dnorm = math.sqrt(gn2), math.sqrt(dn2)
    if not (finite and math.isfinite(gnorm) and math.isfinite(dnorm)):
        grad_rel = math.nan
    else:
        grad_rel = dnorm / gnorm if gnorm > 0 else dnorm
    floor = 0.0
    if low and math.isfinite(exact2) and math.isfinite(round2) and exact2 > 0:
        floor = LOW_PRECISION_GRAD_FACTOR * math.sqrt(round2 / exact2)
    return {
        SPOT_LOSS: loss,
        SPOT_LOSS_FP64: ref,
        SPOT_LOSS_ABS_ERR: abs_err,
        SPOT_LOSS_REL_ERR: (
            math.nan if not finite else abs_err / abs(ref) if ref != 0 else (0.0 if abs_err == 0 else math.inf)
        ),
        SPOT_GRAD_REL_L2: grad_rel,
        SPOT_SIGN_MISMATCH: float((loss < 0) != (ref < 0)) if finite else math.nan,
        SPOT_GRAD_REL_L2_DTYPE_FLOOR: floor,
    }


class ParamGradInputs:
    """What the parameter-gradient check needs from one loss call, copied before the call: the teacher's tensors
    and the labels (the loss may write into them), and the call's extra arguments. The student logits stay the
    trainer's tensor: the check needs its graph to reach the parameters."""

    def __init__(self, teacher_output: TeacherOutput, labels: torch.Tensor, args: tuple, kwargs: dict):
        self.teacher = _copy_teacher(teacher_output)
        self.labels, self.extra = labels.detach().clone(), loss_kwargs(args, kwargs)


def param_grad_rel_l2(
    run_terms: Callable,
    ref_terms: Callable,
    student_logits: torch.Tensor,
    inputs: ParamGradInputs,
    beta,
    temperature,
    params: list,
) -> Optional[float]:
    """``‖∇θ loss_run − ∇θ loss_ref‖ / ‖∇θ loss_ref‖`` over ``params`` (``loss = total / num_valid``), from a graph
    of its own.

    The two losses are evaluated on a detached leaf copy of the student logits (``[B, S, V]``; FP64 for the
    reference), so neither touches the training loss's graph; their logit gradients ``g_run``, ``g_ref`` are then
    pulled back through the model with ``torch.autograd.grad(student_logits, params, grad_outputs=g)``, which
    returns the parameter gradients without accumulating them into ``.grad`` (the graph is retained for the
    trainer's own backward). That pull-back runs the model's backward functions: with Megatron's
    ``gradient_accumulation_fusion`` they write ``main_grad`` themselves, so the check is refused there
    (``gkd_harness.harness.launcher.swift_argv``, and at train begin by ``gkd_harness.harness.rank.callbacks``).
    """
    params = [p for p in params if p.requires_grad]
    if not params or not student_logits.requires_grad:
        return None
    grads = []
    for terms, dtype in ((run_terms, student_logits.dtype), (ref_terms, torch.float64)):
        x = student_logits.detach().to(dtype).requires_grad_(True)
        with torch.enable_grad():  # each evaluation on its own copy of the teacher (the run's may write into it)
            out = terms(x, _copy_teacher(inputs.teacher), inputs.labels.clone(), beta, temperature, **inputs.extra)
            n = int(out.num_valid)
            if not n:
                return None
            (g,) = torch.autograd.grad(out.total / n, x, allow_unused=True)
        grads.append(torch.zeros_like(x) if g is None else g.detach())
        del x, out
    pulled = [
        torch.autograd.grad(
            student_logits, params, grad_outputs=g.to(student_logits.dtype), retain_graph=True, allow_unused=True
        )
        for g in grads
    ]
    num = den = 0.0
    for a, b in zip(*pulled):
        if b is None:
            continue
        a = torch.zeros_like(b) if a is None else a
        num += float((a.double() - b.double()).pow(2).sum())
        den += float(b.double().pow(2).sum())
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)
