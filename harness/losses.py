"""GKD / generalized-JSD loss variants: upstream ms-swift ("native") and the patched forms.

Two independent axes select a variant:

* ``precision``
    - ``"native"``: upstream ms-swift arithmetic. Temperature scaling, log-softmax and exp run in whatever
      dtype each side arrives in (BF16 teacher logits stay BF16), which makes the JSD negative on
      near-identical distributions (report 000).
    - ``"fp32"``: BF16/FP16 logits are promoted to FP32 *before* temperature scaling; FP64 stays FP64; mixed
      inputs compute in the widest dtype. Top-k: the student is gathered at the teacher's ids first, then
      upcast. With the default primitives it computes the cancellation-free form (``_jsd_stable``) and its
      closed-form gradient chunk by chunk (``_FusedChunkedJSD``): promotion per chunk, the gradient kept in
      the student's dtype, no activation graph, so no FP32 copy of a whole ``[N, V]`` BF16 tensor is ever
      alive. With injected primitives (Megatron's vocab-parallel ones) the textbook formula runs per chunk
      with recompute-in-backward. The formula is chosen per row/element where a single one would lose digits
      (logits/T in the thousands, β within ~1/4 of an endpoint, |log T/S| > 30, nearly one-hot rows, −inf
      top-k log-probs); FP16 students' stored gradient is scaled per row by a power of two so a loss scale
      cannot meet an underflowed value. See docs/loss_accuracy.md.
    - ``"fp64"``: everything in FP64 (textbook formula; NaN-safe KL for −inf top-k log-probs).
* ``beta_form``
    - ``"paper"``: ``β·KL(T‖M) + (1−β)·KL(S‖M)``, ``M = (1−β)·S + β·T`` (GKD paper, upstream).
    - ``"continuous"``: ``(1−β)·KL(T‖M) + β·KL(S‖M)`` with the same M: continuous at β→0/1 where the limits
      are the pure KLs returned by the endpoint branches (report 001). β=0, β=1 and β=0.5 are identical
      to the paper form.

At the endpoints both forms return ``β=0 → KL(T‖S)`` (forward KL) and ``β=1 → KL(S‖T)`` (reverse KL).
No variant clamps anything.

Public API (contract in DESIGN.md)::

    make_gkd_loss(precision, beta_form)        # drop-in for swift.rlhf_trainers.gkd_loss.gkd_loss
    make_jsd_loss(precision, beta_form)        # drop-in for swift.rlhf_trainers.gkd_loss.jsd_loss
    make_gkd_loss_terms(precision, beta_form)  # same signature as gkd_loss -> GKDTerms(total, num_valid, per_position)

``make_gkd_loss("native", "paper")`` *is* the installed ms-swift function.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers.gkd_loss import (TeacherOutput, default_gather, default_kl_div, default_log_softmax,
                                          extract_active)

PRECISIONS = ("native", "fp32", "fp64")
BETA_FORMS = ("paper", "continuous")
#: Config / CLI dtype names (``model.student_dtype``, ``gkd-replay --student-dtype``) and their torch dtypes.
DTYPES_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                  "float64": torch.float64}

__all__ = [
    "PRECISIONS",
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
    if precision not in PRECISIONS:
        raise ValueError(f"loss.precision must be one of {PRECISIONS}, got {precision!r}")
    if beta_form not in BETA_FORMS:
        raise ValueError(f"loss.beta_form must be one of {BETA_FORMS}, got {beta_form!r}")


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
    if precision == "native":
        return None
    if precision == "fp64":
        return torch.float64
    out = torch.float32
    for dt in dtypes:
        out = torch.promote_types(out, dt)
    return out


# ---------------------------------------------------------------------------
# Per-chunk JSD math
# ---------------------------------------------------------------------------

#: |d| beyond which expm1(±d) may overflow: those elements use the direct form.
_CUT = 30.0
#: A mixture ratio M/T (or M/S) below this forms ``1 + u`` from ``u ≈ −1`` with cancellation (β within ~1/4 of an
#: endpoint, e.g. β = 1e-6): those elements use the direct form, which has no cancellation there.
_RATIO_FLOOR = 0.25
#: Rows whose log-normaliser difference |κ| exceeds this take ``d = log T − log S`` from the two log-softmaxes: the
#: logit difference ``t − s`` would be rounded at ulp(|κ|) (shifted logits, top-k log-probs against raw logits).
_KAPPA_MAX = 8.0
#: FP16 students: per row, ∂JSD/∂z is stored times 2^(k) so that its largest entry lies in [2^14, 2^15).
_FP16_ROW_TOP = 15


def _weights(beta: float, beta_form: str):
    """(weight of KL(T‖M), weight of KL(S‖M)) for 0<β<1."""
    if beta_form == "paper":
        return beta, 1.0 - beta
    return 1.0 - beta, beta


def _direct_bounds(beta: float):
    """``(d_T, d_S)`` for 0 < β < 1: the T side uses the direct form for ``d > d_T`` (M/T < 1/4), the S side for
    ``d < d_S`` (M/S < 1/4); ``±inf`` where that ratio never falls below 1/4 (1/4 ≤ β ≤ 3/4). At β = 0 and β = 1
    ``1 + u = e^(∓d)`` is computed directly, so only overflow (|d| > cut) selects the direct form."""
    if beta in (0.0, 1.0):
        return math.inf, -math.inf
    d_t = -math.log((_RATIO_FLOOR - beta) / (1.0 - beta)) if beta < _RATIO_FLOOR else math.inf
    d_s = math.log((beta - (1.0 - _RATIO_FLOOR)) / beta) if beta > 1.0 - _RATIO_FLOOR else -math.inf
    return d_t, d_s


def _safe_kl(input_log: torch.Tensor, target_log: torch.Tensor) -> torch.Tensor:
    """KL(target‖input) per row ``[C, D] -> [C]`` with ``0·log 0 = 0`` (targets of probability 0 contribute 0).

    Same value as upstream's ``default_kl_div`` wherever that is finite; used in its place by the patched
    variants so a top-k row with some −inf teacher log-probs stays finite (upstream gives NaN there).
    """
    tp = target_log.exp()
    live = tp > 0
    return (tp * (torch.where(live, target_log, 0.0) - torch.where(live, input_log, 0.0))).sum(-1)


def _jsd_from_logprobs(s_log: torch.Tensor, t_log: torch.Tensor, beta: float, beta_form: str,
                       kl_div_fn: Callable) -> torch.Tensor:
    """Per-position generalized JSD from log-probabilities (textbook formula, β as a python float).

    Args:
        s_log: ``[C, D]`` student log-probs; t_log: ``[C, D]`` teacher log-probs (same dtype).
        beta: python float in [0, 1]; never turned into a low-precision tensor.
    Returns:
        ``[C]`` per-position divergence.
    """
    if beta == 0.0:
        return kl_div_fn(s_log, t_log)  # KL(T‖S)
    if beta == 1.0:
        return kl_div_fn(t_log, s_log)  # KL(S‖T)
    m_log = torch.logsumexp(torch.stack([s_log + math.log1p(-beta), t_log + math.log(beta)]), dim=0)
    w_t, w_s = _weights(beta, beta_form)
    return w_t * kl_div_fn(m_log, t_log) + w_s * kl_div_fn(m_log, s_log)


def _psi(x: torch.Tensor) -> torch.Tensor:
    """``x − log(1 + x)``: non-negative for x > −1, and accurate for small x (no cancellation left)."""
    return x - torch.log1p(x)


def _kappa(zs: torch.Tensor, zt: torch.Tensor, s_log: torch.Tensor, t_log: torch.Tensor) -> torch.Tensor:
    """``κ = logsumexp(zt) − logsumexp(zs)`` per row ``[C, 1]``, consistent with the computed log-softmaxes.

    At a row's argmax the log-softmax is ``−log Σ exp(z − max)`` exactly, so ``κ = (max zt − max zs) +
    (s_log[argmax zs] − t_log[argmax zt])`` never forms ``max + log Σ`` (which rounds at ulp(max): 1e-3 for
    logits of 1e4).
    """
    return _kappa_argmax(zs, zt, s_log, t_log)[0]


def _kappa_argmax(zs, zt, s_log, t_log):
    """``(κ [C, 1], argmax of zs [C, 1])``; see :func:`_kappa`."""
    m_s, j_s = zs.max(-1, keepdim=True)
    m_t, j_t = zt.max(-1, keepdim=True)
    return (m_t - m_s) + (s_log.gather(-1, j_s) - t_log.gather(-1, j_t)), j_s


def _zero_sum_at_argmax(grad: torch.Tensor, j: torch.Tensor, p_j: torch.Tensor) -> torch.Tensor:
    """In rows whose student argmax ``j`` ``[C, 1]`` has ``p_j > 1/2``, set ``grad[j] = −Σ_{i≠j} grad[i]`` (in place).

    The JSD is invariant under adding a constant to a row of student logits, so each row of its gradient sums
    to 0. At the argmax of a nearly one-hot row (logits / T in the thousands) ``p·h − p·Σ p·h`` cancels to
    rounding (``1 − p_j`` below ulp(1)), while the other entries are products of small factors; their sum is
    accurate. ``grad`` ``[C, D]`` in the compute dtype, equal student/teacher vocabularies.
    """
    at_j = grad.gather(-1, j)
    others = grad.sum(-1, keepdim=True).sub_(at_j)
    return grad.scatter_(-1, j, torch.where(p_j > 0.5, others.neg_(), at_j))


def _log_ratio(zs: torch.Tensor, zt: torch.Tensor, s_log: torch.Tensor, t_log: torch.Tensor) -> torch.Tensor:
    """``d = log T − log S`` ``[C, D]`` (a new tensor), each row from its more accurate formula.

    ``(zt − zs) − κ`` is exact for near-identical logits (the difference of the inputs carries no log-normaliser
    rounding), but ``zt − zs`` rounds at ulp(|κ|); rows with ``|κ| > _KAPPA_MAX`` (shifted logits, top-k
    log-probs against raw logits) use ``t_log − s_log``, whose error is ulp of the log-probs themselves.
    """
    kappa = _kappa(zs, zt, s_log, t_log)
    far = kappa.abs() > _KAPPA_MAX
    d = (zt - zs) - kappa
    if bool(far.any()):
        d = torch.where(far, t_log - s_log, d)
    return d


def _jsd_stable(s: torch.Tensor, t: torch.Tensor, beta: float, beta_form: str, cut: float = _CUT) -> torch.Tensor:
    """Per-position generalized JSD from (temperature-scaled) logits, written without cancellation (autograd form).

    ``p = softmax(s)`` and ``q = softmax(t)`` come from their own log-softmax (accurate at any logit scale);
    ``d = log T − log S`` from :func:`_log_ratio`. Every KL is then a sum of non-negative terms:

    * ``KL(T‖M) = Σ q·ψ((1−β)·expm1(−d))``, ``KL(S‖M) = Σ p·ψ(β·expm1(d))``, ``ψ(x) = x − log1p(x)``;
    * ``KL(T‖S) = Σ q·(expm1(−d) + d)`` (β = 0), ``KL(S‖T) = Σ p·(expm1(d) − d)`` (β = 1).

    The dropped first-order terms ``Σ q·x`` and ``Σ p·y`` are identically zero (``Σ p = Σ q = 1``), in value and
    in gradient, and ψ is insensitive to a row-constant error of d at first order. Per element and per side the
    direct form ``q·log(T/M) + (1−β)(p − q)`` resp. ``β(q − p) − p·log(M/S)`` replaces ψ where ``expm1`` could
    overflow (|d| > cut) or where the mixture ratio M/T resp. M/S is below 1/4 (β near an endpoint: ``1 + u``
    would cancel); ``0·log 0 = 0`` for probability-0 entries (−inf top-k log-probs). No clamping; ≥ 0 by
    construction (up to rounding of terms that are each ≥ 0 or of a sum of them).

    Args:
        s, t: ``[C, D]`` scaled logits in the compute dtype. Returns ``[C]``.
    """
    s_log = torch.log_softmax(s, -1)
    t_log = torch.log_softmax(t, -1)
    d = _log_ratio(s, t, s_log, t_log)
    p, q = s_log.exp(), t_log.exp()
    zero = torch.zeros_like(d)
    d_t, d_s = _direct_bounds(beta)
    big_t = (d < -cut) | (d > d_t)  # T side: expm1(−d) overflows, or M/T < 1/4
    big_s = (d > cut) | (d < d_s)  # S side: expm1(d) overflows, or M/S < 1/4
    d_tpsi = torch.where(big_t, zero, d)  # finite in the branch torch.where drops (no NaN gradients)
    d_spsi = torch.where(big_s, zero, d)
    d_tdir = torch.where(big_t & (q > 0), d, zero)  # q = 0: the direct term is (1−β)·p (0·log 0 = 0)
    d_sdir = torch.where(big_s & (p > 0), d, zero)
    if beta == 0.0:
        return torch.where(big_t, (p - q) + q * d_tdir, q * (torch.expm1(-d_tpsi) + d_tpsi)).sum(-1)
    if beta == 1.0:
        return torch.where(big_s, (q - p) - p * d_sdir, p * (torch.expm1(d_spsi) - d_spsi)).sum(-1)
    log_b, log_1mb = math.log(beta), math.log1p(-beta)
    t_over_m = -torch.logaddexp(torch.full_like(d, log_b), log_1mb - d_tdir)  # log(T/M)
    m_over_s = torch.logaddexp(torch.full_like(d, log_1mb), log_b + d_sdir)  # log(M/S)
    kl_t = torch.where(big_t, q * t_over_m + (1.0 - beta) * (p - q),
                       q * _psi((1.0 - beta) * torch.expm1(-d_tpsi))).sum(-1)
    kl_s = torch.where(big_s, beta * (q - p) - p * m_over_s, p * _psi(beta * torch.expm1(d_spsi))).sum(-1)
    w_t, w_s = _weights(beta, beta_form)
    return w_t * kl_t + w_s * kl_s


def _jsd_native_chunk(s_log: torch.Tensor, t_log: torch.Tensor, beta: float, beta_form: str,
                      kl_div_fn: Callable) -> torch.Tensor:
    """Upstream's arithmetic, op for op (β as a tensor of the student's dtype), with a selectable form."""
    if beta == 0:
        return kl_div_fn(s_log, t_log)
    if beta == 1:
        return kl_div_fn(t_log, s_log)
    beta_t = torch.tensor(beta, dtype=s_log.dtype, device=s_log.device)
    log_beta = torch.log(beta_t)
    log_1_minus_beta = torch.log1p(-beta_t)
    m_log = torch.logsumexp(torch.stack([s_log + log_1_minus_beta, t_log + log_beta]), dim=0)
    if beta_form == "paper":
        return beta_t * kl_div_fn(m_log, t_log) + (1 - beta_t) * kl_div_fn(m_log, s_log)
    return (1 - beta_t) * kl_div_fn(m_log, t_log) + beta_t * kl_div_fn(m_log, s_log)


def _prepare_chunk(s: torch.Tensor, t: torch.Tensor, cdtype: torch.dtype, temperature: Optional[float],
                   align_vocab: bool):
    """Cast a chunk to the compute dtype, then align vocabularies and scale by temperature."""
    s = s.to(cdtype)
    t = t.to(cdtype)
    if align_vocab and s.shape[-1] != t.shape[-1]:
        s, t = upstream._align_vocab(s, t)
    if temperature is not None:
        s = s / temperature
        t = t / temperature
    return s, t


def _chunk_fn(precision, cdtype, temperature, align_vocab, beta, beta_form, log_softmax_fn, kl_div_fn):
    """The per-chunk computation ``(s [C, D], t [C, D']) -> [C]`` of a patched variant.

    ``fp32`` with the default primitives uses the cancellation-free form; ``fp64`` (the reference) and any
    injected primitives use the textbook formula.
    """
    stable = precision == "fp32" and log_softmax_fn is default_log_softmax and kl_div_fn is default_kl_div
    if kl_div_fn is default_kl_div:
        kl_div_fn = _safe_kl  # same values, but 0·log 0 = 0 on probability-0 entries (−inf top-k log-probs)

    def fn(s_c: torch.Tensor, t_c: torch.Tensor) -> torch.Tensor:
        s_c, t_c = _prepare_chunk(s_c, t_c, cdtype, temperature, align_vocab)
        if stable:
            return _jsd_stable(s_c, t_c, beta, beta_form)
        # Injected (e.g. vocab-parallel) primitives: the textbook formula through them, in the compute dtype.
        return _jsd_from_logprobs(log_softmax_fn(s_c), log_softmax_fn(t_c), beta, beta_form, kl_div_fn)

    return fn


class _RecomputedChunkedJSD(torch.autograd.Function):
    """Per-position JSD over row chunks; activations are recomputed chunk by chunk in backward.

    Only the inputs are saved, so peak memory is the inputs plus one chunk's working set, in whatever
    dtype the chunk computes in. Injected ``log_softmax_fn`` / ``kl_div_fn`` (e.g. Megatron's vocab-parallel
    ones with their collectives) run identically in forward and in the recompute.
    """

    @staticmethod
    def forward(ctx, s, t, fn, rows, out_dtype):
        n = s.shape[0]
        out = torch.empty(n, dtype=out_dtype, device=s.device)
        with torch.no_grad():
            for start in range(0, n, rows):
                out[start:start + rows] = fn(s[start:start + rows], t[start:start + rows])
        ctx.fn, ctx.rows = fn, rows
        ctx.save_for_backward(s, t)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        s, t = ctx.saved_tensors
        need_s, need_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_s = torch.zeros_like(s) if need_s else None
        grad_t = torch.zeros_like(t) if need_t else None
        for start in range(0, s.shape[0], ctx.rows):
            sl = slice(start, start + ctx.rows)
            with torch.enable_grad():
                s_c = s[sl].detach().requires_grad_(need_s)
                t_c = t[sl].detach().requires_grad_(need_t)
                out = ctx.fn(s_c, t_c)
                inputs = [x for x, need in ((s_c, need_s), (t_c, need_t)) if need]
                grads = torch.autograd.grad(out, inputs, grad_outputs=grad_out[sl])
            it = iter(grads)
            if need_s:
                grad_s[sl] = next(it)
            if need_t:
                grad_t[sl] = next(it)
        return grad_s, grad_t, None, None, None


def _scaled(x: torch.Tensor, cd: torch.dtype, temperature: Optional[float]) -> torch.Tensor:
    """``x`` in ``cd`` divided by ``temperature`` as a new tensor (never aliases ``x``), in as few passes as possible.

    Same arithmetic as :func:`_prepare_chunk` (cast, then divide), so both paths see identical scaled logits.
    """
    y = x.to(cd)
    if y is x:
        return x / temperature if temperature is not None else x.clone()
    return y.div_(temperature) if temperature is not None else y


def _jsd_stable_and_grad(zs: torch.Tensor, zt: torch.Tensor, beta: float, beta_form: str, need_grad: bool,
                         cut: float = _CUT):
    """Per-position JSD of :func:`_jsd_stable`'s form and its closed-form gradient, with few full-size temporaries.

    Same quantities and per-element formula choice as :func:`_jsd_stable`: ``p = softmax(zs)``, ``q =
    softmax(zt)``, ``d = log T − log S`` (:func:`_log_ratio`), ``x = expm1(d)``, ``ℓ = log(M/S)``:

    * ψ elements: ``KL(T‖M)_i = q·ψ((1−β)·expm1(−d))``, ``KL(S‖M)_i = p·ψ(β·x)``, ``ℓ = log1p(β·x)``;
    * direct elements (on those elements only; per side, see :func:`_jsd_stable`): ``KL(T‖M)_i = q·log(T/M) +
      (1−β)(p − q)`` with ``log(T/M) = −logaddexp(log β, log(1−β) − d)``; ``KL(S‖M)_i = −p·ℓ + β(q − p)``,
      ``ℓ = logaddexp(log(1−β), log β + d)``.

    Gradient: ``∂L/∂zs = p·h − p·Σ p·h`` with ``p·h`` = ``−(1−β)·p·ℓ`` (paper),
    ``p·[(1−β)(2β−1)·x/(1+βx) − β·ℓ]`` (continuous, ``x/(1+βx) = e^(d−ℓ) − e^(−ℓ)`` on direct S elements),
    ``p − q`` (β = 0), ``−p·d`` (β = 1).

    Args:
        zs, zt: ``[C, D]`` temperature-scaled logits in the compute dtype; consumed (modified in place).
    Returns:
        ``(loss [C], grad [C, D] w.r.t. zs, or None)``.
    """
    s_log = torch.log_softmax(zs, -1)
    t_log = torch.log_softmax(zt, -1)
    kappa, j_s = _kappa_argmax(zs, zt, s_log, t_log)
    d = zt.sub_(zs).sub_(kappa)  # (zt − zs) − κ, in zt's storage
    del zs, zt
    far = (kappa.abs() > _KAPPA_MAX).squeeze(-1)
    if bool(far.any()):
        if bool(far.all()):
            torch.sub(t_log, s_log, out=d)
        else:
            d[far] = t_log[far] - s_log[far]
    p = s_log.exp_()
    q = t_log.exp_()
    del s_log, t_log
    d_t, d_s = _direct_bounds(beta)
    ph = None
    if beta == 0.0:
        big = d < -cut
        if d_t < math.inf:
            big |= d > d_t
        term = torch.neg(d).expm1_().add_(d).mul_(q)  # q·(expm1(−d) + d)
        if bool(big.any()):
            db, pb, qb = d[big], p[big], q[big]
            term[big] = (pb - qb) + _times(qb, db)
        loss = term.sum(-1)
        del term
        if need_grad:
            up = d > cut  # −p·expm1(d) may overflow: p − q there
            ph = torch.expm1(d).mul_(p).neg_()
            if bool(up.any()):
                ph[up] = p[up] - q[up]
    elif beta == 1.0:
        big = d > cut
        term = torch.expm1(d).sub_(d).mul_(p)  # p·(expm1(d) − d)
        if bool(big.any()):
            db, pb, qb = d[big], p[big], q[big]
            term[big] = (qb - pb) - _times(pb, db)
        loss = term.sum(-1)
        del term
        if need_grad:
            ph = torch.mul(p, d).neg_()
    else:
        w_t, w_s = _weights(beta, beta_form)
        log_b, log_1mb = math.log(beta), math.log1p(-beta)
        big_s = d > cut
        if d_s > -math.inf:
            big_s |= d < d_s
        big_t = d < -cut
        if d_t < math.inf:
            big_t |= d > d_t
        any_s, any_t = bool(big_s.any()), bool(big_t.any())
        # S side: p·ψ(β·x) and ℓ = log1p(β·x).
        xs = torch.expm1(d)  # x (may be inf where d > 88: those elements are direct)
        bx = torch.mul(xs, beta)
        ell = torch.log1p(bx)
        term = bx.sub_(ell).mul_(p)
        del bx
        if any_s:
            pb, qb = p[big_s], q[big_s]
            dsb = _live(d[big_s], pb)  # p = 0: every S-side quantity is weighted by p; keep it finite
            ellb = torch.logaddexp(torch.full_like(dsb, log_1mb), dsb + log_b)
            term[big_s] = beta * (qb - pb) - pb * ellb
            ell[big_s] = ellb
        loss = w_s * term.sum(-1)
        # T side: q·ψ((1−β)·expm1(−d)), computed in term's storage.
        u = torch.neg(d, out=term).expm1_().mul_(1.0 - beta)
        lg = torch.log1p(u)
        u.sub_(lg).mul_(q)
        del lg
        if any_t:
            db, pb, qb = d[big_t], p[big_t], q[big_t]
            tmb = torch.logaddexp(torch.full_like(db, log_b), log_1mb - _live(db, qb)).neg_()  # log(T/M)
            u[big_t] = _times(qb, tmb) + (1.0 - beta) * (pb - qb)
        loss = loss + w_t * u.sum(-1)
        del u, term
        if need_grad:
            if beta_form == "paper":
                ph = ell.mul_(p).mul_(-(1.0 - beta))
            else:
                y = xs.div_(torch.mul(xs, beta).add_(1.0))  # x/(1+βx)
                if any_s:
                    y[big_s] = torch.exp(dsb - ellb) - torch.exp(-ellb)
                ph = y.mul_((1.0 - beta) * (2.0 * beta - 1.0)).sub_(ell, alpha=beta).mul_(p)
        del xs
    if ph is not None:
        p_j = p.gather(-1, j_s)
        ph.sub_(p.mul_(ph.sum(-1, keepdim=True)))
        _zero_sum_at_argmax(ph, j_s, p_j)
    return loss, ph


def _times(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``w·v`` with ``0·(±inf) = 0`` (the limit ``0·log 0`` of a probability-0 entry)."""
    return torch.where(w == 0, 0.0, w * v)


def _live(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``d`` where the weight ``w`` is non-zero, else 0 (keeps ±inf out of a term whose weight is 0)."""
    return torch.where(w == 0, 0.0, d)


class _FusedChunkedJSD(torch.autograd.Function):
    """Per-position JSD (:func:`_jsd_stable`) and its closed-form gradient in one pass per row chunk.

    Only for ``fp32`` with the default primitives, equal vocabularies and a teacher without gradient. Forward
    keeps ``∂JSD_i/∂z_s`` ``[N, D]`` in the student's dtype (no activation graph, nothing recomputed, no FP32
    copy of BF16 inputs); backward scales it by the incoming per-position gradient (in the compute dtype).
    """

    @staticmethod
    def forward(ctx, s, t, cd, temperature, beta, beta_form, rows):
        n = s.shape[0]
        need = ctx.needs_input_grad[0]
        out = torch.empty(n, dtype=cd, device=s.device)
        # ∂JSD_i/∂z_s in the student's dtype: never a full-width FP32 copy for BF16 inputs (DESIGN contract).
        dz = torch.empty(s.shape, dtype=s.dtype, device=s.device) if need else None
        # FP16 has 5 exponent bits: ∂JSD/∂z (before the loss scale reaches it in backward) would underflow to 0.
        # Each row is stored times a power of two (exact) and the factor undone in backward.
        row_scale = torch.ones(n, dtype=cd, device=s.device) if need and s.dtype == torch.float16 else None
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            loss, g = _jsd_stable_and_grad(_scaled(s[sl], cd, temperature), _scaled(t[sl], cd, temperature), beta,
                                           beta_form, need)
            out[sl] = loss
            if need:
                if temperature is not None:
                    g.div_(temperature)
                if row_scale is not None:
                    row_scale[sl] = _pow2_row_scale(g)
                    g.mul_(row_scale[sl, None])
                dz[sl] = g
                del g
        ctx.save_for_backward(dz, row_scale)
        ctx.rows, ctx.cd = rows, cd
        return out

    @staticmethod
    def backward(ctx, grad_out):
        dz, row_scale = ctx.saved_tensors
        grad_s = None
        if dz is not None and ctx.needs_input_grad[0]:
            grad_s = torch.empty_like(dz)
            go = grad_out.to(ctx.cd)
            if row_scale is not None:
                go = go / row_scale
            for start in range(0, dz.shape[0], ctx.rows):
                sl = slice(start, start + ctx.rows)
                grad_s[sl] = dz[sl].to(ctx.cd) * go[sl, None]
        return grad_s, None, None, None, None, None, None


def _pow2_row_scale(g: torch.Tensor) -> torch.Tensor:
    """Per-row power of two ``[C]`` that puts the row's largest ``|g|`` (``g`` ``[C, D]``) in [2^14, 2^15).

    Exact in any binary float; all-zero rows get 2^15, and the exponent is kept within ±100 so the factor stays
    a finite FP32 number.
    """
    _, e = torch.frexp(g.abs().amax(-1))
    e = torch.where(e < -100, -100, torch.where(e > 100, 100, e))
    return torch.ldexp(torch.ones_like(g[:, 0]), _FP16_ROW_TOP - e)


def _rows_per_chunk(n: int, chunk_size: int, in_itemsize: int, compute_itemsize: int) -> int:
    """Rows per chunk so a chunk's compute-dtype working set is no larger than upstream's would be.

    Upstream works on ``min(N, chunk_size)`` rows in the input dtype; an FP32 chunk of BF16 inputs gets
    proportionally fewer rows.
    """
    base = max(1, min(n, chunk_size))
    return max(1, (base * in_itemsize) // max(compute_itemsize, in_itemsize))


def jsd_per_position(
    s_logits: torch.Tensor,
    t_logits: torch.Tensor,
    beta: float,
    *,
    precision: str = "fp32",
    beta_form: str = "paper",
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
        empty = s_logits.new_zeros((0, ))
        cd = compute_dtype(precision, s_logits.dtype, t_logits.dtype)
        total = s_logits.sum() if cd is None else s_logits.to(cd).sum()
        return empty if cd is None else empty.to(cd), total

    if precision == "native":
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
    if (recompute is None and precision == "fp32" and log_softmax_fn is default_log_softmax
            and kl_div_fn is default_kl_div and s_logits.shape[-1] == t_logits.shape[-1]
            and not t_logits.requires_grad):
        # Fused closed-form gradient: no activation graph, no recompute. Narrow (top-k) inputs in one chunk.
        in_itemsize = min(s_logits.element_size(), t_logits.element_size())
        rows = n if width <= 1024 else _rows_per_chunk(n, chunk_size, in_itemsize,
                                                       torch.empty((), dtype=cd).element_size())
        per_position = _FusedChunkedJSD.apply(s_logits, t_logits, cd, temperature, beta, beta_form, rows)
        return per_position, per_position.sum()
    fn = _chunk_fn(precision, cd, temperature, align_vocab, beta, beta_form, log_softmax_fn, kl_div_fn)
    if recompute is None:
        recompute = width > 1024
    in_itemsize = min(s_logits.element_size(), t_logits.element_size())
    rows = _rows_per_chunk(n, chunk_size, in_itemsize, torch.empty((), dtype=cd).element_size())
    if recompute:
        per_position = _RecomputedChunkedJSD.apply(s_logits, t_logits, fn, rows, cd)
    else:
        per_position = torch.cat([fn(s_logits[i:i + rows], t_logits[i:i + rows]) for i in range(0, n, rows)])
    return per_position, per_position.sum()


# ---------------------------------------------------------------------------
# Drop-in factories
# ---------------------------------------------------------------------------


def make_jsd_loss(precision: str = "fp32", beta_form: str = "paper") -> Callable:
    """A drop-in for ``swift.rlhf_trainers.gkd_loss.jsd_loss`` with the chosen variant.

    The returned function has upstream's signature
    ``(s_logits [N, D], t_logits [N, D], beta, log_softmax_fn=..., kl_div_fn=..., chunk_size=512) -> total``
    where inputs are already temperature-scaled and ``total`` is the unnormalised scalar sum.
    """
    _check_variant(precision, beta_form)
    if precision == "native" and beta_form == "paper":
        return upstream.jsd_loss

    def jsd_loss(s_logits: torch.Tensor,
                 t_logits: torch.Tensor,
                 beta: float,
                 log_softmax_fn: Callable = default_log_softmax,
                 kl_div_fn: Callable = default_kl_div,
                 chunk_size: int = 512) -> torch.Tensor:
        _, total = jsd_per_position(s_logits, t_logits, beta, precision=precision, beta_form=beta_form,
                                    log_softmax_fn=log_softmax_fn, kl_div_fn=kl_div_fn, chunk_size=chunk_size)
        return total

    jsd_loss.__qualname__ = jsd_loss.__name__ = f"jsd_loss_{precision}_{beta_form}"
    jsd_loss.precision, jsd_loss.beta_form = precision, beta_form
    return jsd_loss


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
    precision: str = "fp32",
    beta_form: str = "paper",
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
    per_position, total = jsd_per_position(s_logits, t_logits, beta, precision=precision, beta_form=beta_form,
                                           temperature=temperature, log_softmax_fn=lsf, kl_div_fn=kdf,
                                           chunk_size=chunk_size, align_vocab=align)
    return GKDTerms(total, num_valid, per_position)


def make_gkd_loss_terms(precision: str = "fp32", beta_form: str = "paper") -> Callable[..., GKDTerms]:
    """Like :func:`make_gkd_loss` but returning :class:`GKDTerms` (with the per-position JSD).

    For ``native``/``paper`` the total is bit-identical to the installed ms-swift ``gkd_loss``.
    """
    _check_variant(precision, beta_form)

    def gkd_loss_terms(student_logits, teacher_output, labels, beta, temperature, gather_fn=default_gather,
                       log_softmax_fn=default_log_softmax, kl_div_fn=default_kl_div, chunk_size=512) -> GKDTerms:
        return gkd_per_position(student_logits, teacher_output, labels, beta, temperature, gather_fn,
                                log_softmax_fn, kl_div_fn, chunk_size, precision=precision, beta_form=beta_form)

    gkd_loss_terms.precision, gkd_loss_terms.beta_form = precision, beta_form
    return gkd_loss_terms


def make_gkd_loss(precision: str = "fp32", beta_form: str = "paper") -> Callable:
    """A drop-in for ``swift.rlhf_trainers.gkd_loss.gkd_loss`` with the chosen variant.

    Signature: ``(student_logits [B, S, V], teacher_output, labels [B, S], beta, temperature, gather_fn=...,
    log_softmax_fn=..., kl_div_fn=..., chunk_size=512) -> (total scalar, num_valid scalar)``.
    ``("native", "paper")`` returns the installed ms-swift function itself.
    """
    _check_variant(precision, beta_form)
    if precision == "native" and beta_form == "paper":
        return upstream.gkd_loss
    terms = make_gkd_loss_terms(precision, beta_form)

    def gkd_loss(student_logits, teacher_output, labels, beta, temperature, gather_fn=default_gather,
                 log_softmax_fn=default_log_softmax, kl_div_fn=default_kl_div, chunk_size=512):
        out = terms(student_logits, teacher_output, labels, beta, temperature, gather_fn, log_softmax_fn, kl_div_fn,
                    chunk_size)
        return out.total, out.num_valid

    gkd_loss.__qualname__ = gkd_loss.__name__ = f"gkd_loss_{precision}_{beta_form}"
    gkd_loss.precision, gkd_loss.beta_form = precision, beta_form
    return gkd_loss
