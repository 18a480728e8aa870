"""The cancellation-free generalized JSD and its closed-form gradient (``fp32`` with the default primitives).

See docs/loss_accuracy.md for the formulas and where each one is chosen."""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from gkd_harness.harness.loss.textbook import _weights

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


class TorchRows:
    """Row operations of the stable form on a whole row held here (the default primitives).

    ``log_softmax_pair(zs, zt)`` ``[C, D]`` -> ``(s_log, t_log, κ [C, 1], student argmax [C, 1])``;
    ``reduce(parts)``: the row sums ``[C]`` of a list, summed over the vocabulary shards (here: the list itself);
    ``sharded``: whether a row may be a shard of the vocabulary (False).
    """

    sharded = False

    @staticmethod
    def log_softmax_pair(zs: torch.Tensor, zt: torch.Tensor):
        s_log, t_log = torch.log_softmax(zs, -1), torch.log_softmax(zt, -1)
        kappa, j_s = _kappa_argmax(zs, zt, s_log, t_log)
        return s_log, t_log, kappa, j_s

    @staticmethod
    def reduce(parts: list) -> list:
        return parts


class InjectedRows:
    """The same row operations where a row may be a vocabulary shard (Megatron's vocab-parallel primitives).

    Every row sum is a local ``sum`` over this rank's elements; the partial sums a kernel step needs are stacked
    and summed over the shards in one call of the injected ``kl_div_fn``: ``kl_div_fn(−x[..., None], 0) =
    Σ e^0·(0 − (−x)) = x`` per entry (exact: negation and subtraction from 0 are exact), reduced over the shards by
    the injected function itself (one collective per call at TP > 1; the identity at TP = 1). The log-softmaxes are
    local (``torch.log_softmax`` of the shard) and corrected by ``c = log_softmax_fn(lse)`` applied to the ``[2C, 1]``
    local log-normalisers (``lse_r − log Σ_r e^(lse_r)``: exactly 0 at TP = 1, so the values are the default
    path's); κ is the local κ (at the shard's argmax, :func:`_kappa_argmax`) plus ``c_s − c_t``. Every method is
    called the same number of times on every rank (no data-dependent collectives).
    """

    sharded = True

    def __init__(self, log_softmax_fn, kl_div_fn):
        self.log_softmax_fn, self.kl_div_fn = log_softmax_fn, kl_div_fn

    def log_softmax_pair(self, zs: torch.Tensor, zt: torch.Tensor):
        s_log, t_log = torch.log_softmax(zs, -1), torch.log_softmax(zt, -1)
        m_s, j_s = zs.max(-1, keepdim=True)
        m_t, t_top, s_top = zt.amax(-1, keepdim=True), t_log.amax(-1, keepdim=True), s_log.gather(-1, j_s)
        kappa = (m_t - m_s) + (s_top - t_top)  # the shard's κ, as :func:`_kappa_argmax` forms it
        # [2C, 1]: each shard's log Σ e^z (read at its argmax) -> lse_r − log Σ_r e^(lse_r) (0 exactly at TP = 1)
        c = self.log_softmax_fn(torch.cat([m_s - s_top, m_t - t_top]))
        c_s, c_t = c[: zs.shape[0]], c[zs.shape[0] :]
        s_log.add_(c_s)
        t_log.add_(c_t)
        return s_log, t_log, kappa + (c_s - c_t), j_s

    def reduce(self, parts: list) -> list:
        x = torch.stack(parts, -1)  # [C, k]
        out = self.kl_div_fn(torch.neg(x)[..., None], torch.zeros_like(x)[..., None])
        return list(out.unbind(-1))


def _direct_bounds(beta: float):
    """``(d_T, d_S)`` for 0 < β < 1: the T side uses the direct form for ``d > d_T`` (M/T < 1/4), the S side for
    ``d < d_S`` (M/S < 1/4); ``±inf`` where that ratio never falls below 1/4 (1/4 ≤ β ≤ 3/4). At β = 0 and β = 1
    ``1 + u = e^(∓d)`` is computed directly, so only overflow (|d| > cut) selects the direct form."""
    if beta in (0.0, 1.0):
        return math.inf, -math.inf
    d_t = -math.log((_RATIO_FLOOR - beta) / (1.0 - beta)) if beta < _RATIO_FLOOR else math.inf
    d_s = math.log((beta - (1.0 - _RATIO_FLOOR)) / beta) if beta > 1.0 - _RATIO_FLOOR else -math.inf
    return d_t, d_s


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
    # The teacher's argmax is not needed, only its values: log_softmax is monotone, so t_log's maximum is t_log at
    # zt's argmax (equal values at ties), and a maximum without indices is several times cheaper on short rows.
    m_t, t_top = zt.amax(-1, keepdim=True), t_log.amax(-1, keepdim=True)
    return (m_t - m_s) + (s_log.gather(-1, j_s) - t_top), j_s


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
    kl_t = torch.where(big_t, q * t_over_m + (1.0 - beta) * (p - q), q * _psi((1.0 - beta) * torch.expm1(-d_tpsi))).sum(
        -1
    )
    kl_s = torch.where(big_s, beta * (q - p) - p * m_over_s, p * _psi(beta * torch.expm1(d_spsi))).sum(-1)
    w_t, w_s = _weights(beta, beta_form)
    return w_t * kl_t + w_s * kl_s


def _jsd_stable_and_grad(
    zs: torch.Tensor,
    zt: torch.Tensor,
    beta: float,
    beta_form: str,
    need_grad: bool,
    cut: float = _CUT,
    rows=TorchRows,
    sync_free: bool = False,
):
    """Per-position JSD of :func:`_jsd_stable`'s form and its closed-form gradient, with few full-size temporaries.

    Same quantities and per-element formula choice as :func:`_jsd_stable`: ``p = softmax(zs)``, ``q =
    softmax(zt)``, ``d = log T − log S`` (:func:`_log_ratio`), ``x = expm1(d)``, ``ℓ = log(M/S)``:

    * ψ elements: ``KL(T‖M)_i = q·ψ((1−β)·expm1(−d))``, ``KL(S‖M)_i = p·ψ(β·x)``, ``ℓ = log1p(β·x)``;
    * direct elements (on those elements only; per side, see :func:`_jsd_stable`): ``KL(T‖M)_i = q·log(T/M) +
      (1−β)(p − q)`` with ``log(T/M) = −logaddexp(log β, log(1−β) − d)``; ``KL(S‖M)_i = −p·ℓ + β(q − p)``,
      ``ℓ = logaddexp(log(1−β), log β + d)``.

    Gradient: ``∂L/∂zs = p·h − p·Σ p·h`` with ``p·h`` = ``−(1−β)·p·ℓ`` (paper),
    ``p·[(1−β)(2β−1)·x/(1+βx) − β·ℓ]`` (continuous, ``x/(1+βx) = e^(d−ℓ) − e^(−ℓ)`` on direct S elements),
    ``p − q`` (β = 0), ``−p·d`` (β = 1). For 0 < β < 1, where the teacher's share vanishes (d → −∞) h tends to
    a constant ``c`` and ``h − Σ p·h`` would cancel (student and teacher confident on different tokens): those
    elements (``ℓ < log(1−β)/2``) hold ``h − c`` instead, from ``ℓ' = ℓ − log(1−β) = softplus(d + log(β/(1−β)))``
    and ``e^(d−ℓ)`` (see :func:`_gradient_from_h`).

    Args:
        zs, zt: ``[C, D]`` temperature-scaled logits in the compute dtype; consumed (modified in place).
        rows: the row operations (:class:`TorchRows`, or :class:`InjectedRows` for a vocabulary shard).
        sync_free: no host read: every per-element formula choice (direct elements, far rows, shifted elements)
            is made with ``torch.where`` over the whole block instead of asking the host whether a mask has an
            element and computing on the selected ones (:func:`_Masked`). The same formulas per element; more
            arithmetic on blocks with no such element, no pipeline stall on a GPU.
    Returns:
        ``(loss [C], grad [C, D] w.r.t. zs, or None)``.
    """
    s_log, t_log, kappa, j_s = rows.log_softmax_pair(zs, zt)
    d = zt.sub_(zs).sub_(kappa)  # (zt − zs) − κ, in zt's storage
    del zs, zt
    far = (kappa.abs() > _KAPPA_MAX).squeeze(-1)
    if sync_free:
        torch.where(far[:, None], t_log - s_log, d, out=d)
    elif bool(far.any()):
        if bool(far.all()):
            torch.sub(t_log, s_log, out=d)
        else:
            d[far] = t_log[far] - s_log[far]
    p = s_log.exp_()
    q = t_log.exp_()
    del s_log, t_log
    d_t, d_s = _direct_bounds(beta)
    # A masked vocabulary (−inf logits of both sides on the same ids): d = −inf − (−inf) = NaN where p = q = 0.
    # Those elements weigh nothing (0·log 0 = 0, and p·h = 0), so d is 0 there; NaN logits keep p and q NaN.
    # One pass and one host read for the block's range of d (not needed sync-free): a mask is made and asked
    # only when some element may fall in it.
    if sync_free:
        d_min, d_max = -math.inf, math.inf
        d.nan_to_num_(0.0, math.inf, -math.inf)
    else:
        d_min, d_max = map(float, torch.aminmax(d))
        if math.isnan(d_min) or math.isnan(d_max):
            d_min, d_max = map(float, torch.aminmax(d.nan_to_num_(0.0, math.inf, -math.inf)))
    ph, shifted, c = None, None, 0.0
    weights: tuple[float, ...] = (1.0,)  # of the loss's partial row sums
    if beta == 0.0:

        def big():
            m = d < -cut
            return m | (d > d_t) if d_t < math.inf else m

        term = torch.neg(d).expm1_().add_(d).mul_(q)  # q·(expm1(−d) + d)
        on = _Masked(big, sync_free, maybe=not (d_min >= -cut and d_max <= d_t))
        if on.any:
            db, pb, qb = on.sel(d), on.sel(p), on.sel(q)
            on.put(term, (pb - qb) + _times(qb, db))
        parts = [term.sum(-1)]
        del term
        if need_grad:
            up = _Masked(lambda: d > cut, sync_free, maybe=not d_max <= cut)  # −p·expm1(d) may overflow: p − q
            ph = torch.expm1(d).mul_(p).neg_()
            if up.any:
                up.put(ph, up.sel(p) - up.sel(q))
    elif beta == 1.0:
        term = torch.expm1(d).sub_(d).mul_(p)  # p·(expm1(d) − d)
        on = _Masked(lambda: d > cut, sync_free, maybe=not d_max <= cut)
        if on.any:
            db, pb, qb = on.sel(d), on.sel(p), on.sel(q)
            on.put(term, (qb - pb) - _times(pb, db))
        parts = [term.sum(-1)]
        del term
        if need_grad:
            ph = torch.mul(p, d).neg_()
            if sync_free or d_max == math.inf:  # a student-only masked entry: p = 0, d = +inf (0·log 0 = 0)
                ph.masked_fill_(p == 0, 0.0)
    else:
        w_t, w_s = _weights(beta, beta_form)
        log_b, log_1mb = math.log(beta), math.log1p(-beta)

        def big_s():
            m = d > cut
            return m | (d < d_s) if d_s > -math.inf else m

        def big_t():
            m = d < -cut
            return m | (d > d_t) if d_t < math.inf else m

        on_s = _Masked(big_s, sync_free, maybe=not (d_max <= cut and d_min >= d_s))
        on_t = _Masked(big_t, sync_free, maybe=not (d_min >= -cut and d_max <= d_t))
        # S side: p·ψ(β·x) and ℓ = log1p(β·x).
        xs = torch.expm1(d)  # x (may be inf where d > 88: those elements are direct)
        bx = torch.mul(xs, beta)
        ell = torch.log1p(bx)
        term = bx.sub_(ell).mul_(p)
        del bx
        if on_s.any:
            pb, qb = on_s.sel(p), on_s.sel(q)
            dsb = _live(on_s.sel(d), pb)  # p = 0: every S-side quantity is weighted by p; keep it finite
            ellb = torch.logaddexp(torch.full_like(dsb, log_1mb), dsb + log_b)
            on_s.put(term, beta * (qb - pb) - pb * ellb)
            on_s.put(ell, ellb)
        parts, weights = [term.sum(-1)], (w_s, w_t)
        # T side: q·ψ((1−β)·expm1(−d)), computed in term's storage.
        u = torch.neg(d, out=term).expm1_().mul_(1.0 - beta)
        lg = torch.log1p(u)
        u.sub_(lg).mul_(q)
        del lg
        if on_t.any:
            db, pb, qb = on_t.sel(d), on_t.sel(p), on_t.sel(q)
            tmb = torch.logaddexp(torch.full_like(db, log_b), log_1mb - _live(db, qb)).neg_()  # log(T/M)
            on_t.put(u, _times(qb, tmb) + (1.0 - beta) * (pb - qb))
        parts.append(u.sum(-1))
        del u, term
        if need_grad:
            # Elements near h's limit c (the teacher's share vanishes): ℓ < log(1−β)/2.
            lim = 0.5 * log_1mb
            # No shifted element where the block's least ℓ is not below the limit (one pass, one host read instead
            # of three passes and one). Each shard decides for itself: the sums that need every shard's shifted
            # elements are made on every shard (:func:`_gradient_from_h`).
            maybe = sync_free or not float(ell.amin()) >= lim
            on_sh = _Masked(lambda: (ell < lim) & (p > 0), sync_free, maybe=maybe)
            shifted = on_sh.mask if on_sh.any else None
            if beta_form == "paper":
                c = -(1.0 - beta) * log_1mb
                if shifted is not None:
                    on_sh.put(ell, _softplus(on_sh.sel(d) + (log_b - log_1mb)))  # ℓ' = ℓ − log(1−β)
                ph = ell.mul_(p).mul_(-(1.0 - beta))  # shifted elements: −(1−β)·ℓ' = h − c
            else:
                c = -(2.0 * beta - 1.0) + beta * (-log_1mb)
                y = xs.div_(torch.mul(xs, beta).add_(1.0))  # x/(1+βx)
                if on_s.any:
                    on_s.put(y, torch.exp(dsb - ellb) - torch.exp(-ellb))
                if shifted is not None and beta > 0.5:
                    # h − c without the cancellation of its two terms (β near 1): y = 0, β·ℓ = −(h − c) below.
                    on_sh.put(y, 0.0)
                    on_sh.put(ell, _continuous_h_minus_c(on_sh.sel(d) + (log_b - log_1mb), beta).div_(-beta))
                elif shifted is not None:
                    dsh = on_sh.sel(d)
                    ell_sh = _softplus(dsh + (log_b - log_1mb))
                    e_dl = torch.exp(dsh - log_1mb - ell_sh)  # e^(d−ℓ)
                    # h − c = (2β−1)·e^(d−ℓ) − β·ℓ', written so the common code below forms it.
                    on_sh.put(y, e_dl / (1.0 - beta))  # times (1−β)(2β−1) below
                    on_sh.put(ell, ell_sh)
                ph = y.mul_((1.0 - beta) * (2.0 * beta - 1.0)).sub_(ell, alpha=beta).mul_(p)
        del xs
    if ph is not None:
        p_j = p.gather(-1, j_s)  # the student's share at its (shard's) argmax, read before p is overwritten
        _gradient_from_h(ph, p, shifted, c, rows, mixture=0.0 < beta < 1.0)
        # Each row of the exact gradient sums to 0 (the JSD is invariant under a constant added to a row of student
        # logits). At the argmax of a nearly one-hot row (logits / T in the thousands) ``p·h − p·Σ p·h`` cancels to
        # rounding (``1 − p_j`` below ulp(1)), while the other entries are products of small factors: in rows with
        # p_j > 1/2 the argmax entry is set to minus the sum of the others (on a shard: over every shard, in the
        # same reduction as the loss's partial sums).
        at_j = ph.gather(-1, j_s)
        top = p_j > 0.5
        others = ph.sum(-1, keepdim=True).sub_(torch.where(top, at_j, 0.0) if rows.sharded else at_j)
        *parts, others = rows.reduce(parts + [others.squeeze(-1)])
        ph.scatter_(-1, j_s, torch.where(top, others[:, None].neg(), at_j))
    else:
        parts = rows.reduce(parts)
    loss = parts[0] if len(parts) == 1 else weights[0] * parts[0] + weights[1] * parts[1]
    return loss, ph


class _Masked:
    """Elements of a block ``[C, D]`` that take another formula: ``mask`` (bool ``[C, D]``).

    Host-branching (``sync_free`` false, the default on a CPU, where a host read costs nothing): the mask is made
    (``make_mask()``) unless the caller knows it is empty (``maybe`` false, from the block's range of d), and
    :attr:`any` asks the host whether it has an element (one synchronisation), :meth:`sel` picks the masked elements
    (``x[mask]``, 1-D) and :meth:`put` writes values for them (``dst[mask] = v``), so the other formula runs on
    those elements only. Sync-free (on a GPU): :attr:`any` is True without asking, :meth:`sel` is the whole
    block, and :meth:`put` is ``torch.where(mask, v, dst)`` written into ``dst``: the other formula runs on
    every element and is kept where the mask holds, with no host read (the values are the same per element).
    """

    def __init__(self, make_mask: Callable[[], torch.Tensor], sync_free: bool, maybe: bool = True):
        self.sync_free = sync_free
        self.mask: Optional[torch.Tensor] = None
        self.any = sync_free
        if sync_free or maybe:  # ``maybe`` False: the caller knows the mask is empty (no host read, no mask)
            self.mask = make_mask()
            self.any = True if sync_free else bool(self.mask.any())

    def sel(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.sync_free else x[self.mask]

    def put(self, dst: torch.Tensor, value) -> None:
        mask = self.mask
        assert mask is not None, "put() on a mask known to be empty"
        if not self.sync_free:
            dst[mask] = value
        elif isinstance(value, torch.Tensor):
            torch.where(mask, value, dst, out=dst)
        else:
            dst.masked_fill_(mask, value)


def _gradient_from_h(ph: torch.Tensor, p: torch.Tensor, shifted, c: float, rows, mixture: bool) -> torch.Tensor:
    """``∂L/∂z = p·(h − Σ p·h)`` in place in ``ph`` (``[C, D]``, holding ``p·r``; ``p`` is overwritten).

    ``r = h`` except on ``shifted`` elements (bool ``[C, D]`` or None), where ``r = h − c``. With
    ``P_f = Σ_shifted p`` and ``P_n = Σ_rest p`` (each summed over its own elements, so neither is ``1 − ·``):
    ``h_i − Σ p·h = r_i − Σ p·r + c·(P_n if i shifted else −P_f)``. On a vocabulary shard (``rows.sharded``,
    ``mixture``: 0 < β < 1) the three sums are made on every shard, whether or not it has shifted elements, and
    summed over the shards in one reduction.
    """
    if rows.sharded and mixture:
        p_f = torch.where(shifted, p, 0.0).sum(-1) if shifted is not None else torch.zeros_like(p[:, 0])
        p_n = torch.where(shifted, 0.0, p).sum(-1) if shifted is not None else p.sum(-1)
        mean, p_f, p_n = (x[:, None] for x in rows.reduce([ph.sum(-1), p_f, p_n]))
        if shifted is None:  # the other shards' shifted elements: −c·P_f on every element here
            return ph.sub_(p.mul_(mean + p_f * c))
    else:
        mean = rows.reduce([ph.sum(-1)])[0][:, None]
        if shifted is not None:
            p_f = torch.where(shifted, p, 0.0).sum(-1)[:, None]
            p_n = torch.where(shifted, 0.0, p).sum(-1)[:, None]
    if shifted is not None:
        ph.add_(torch.where(shifted, p_n * c, p_f * -c).mul_(p))
    return ph.sub_(p.mul_(mean))


def _continuous_h_minus_c(u: torch.Tensor, beta: float) -> torch.Tensor:
    """``h − c`` of the continuous form on elements near h's limit (β > 1/2), ``u = d + log(β/(1−β))`` ``[n]``.

    With ``w = e^u``: ``h − c = (2β−1)/β·w/(1+w) − β·log1p(w)``, two terms that cancel to ``−(1−β)²/β·w`` at first
    order (β = 0.999: six digits lost; FP32 gradients 1e-3 from FP64 at T = 0.05). Rewritten as
    ``−((1−β)²/β)·log1p(w) − ((2β−1)/β)·g(w)`` with ``g(w) = log1p(w) − w/(1+w) ≥ 0``: both terms ≤ 0 for β > 1/2.
    ``g`` from ``z = w/(2+w)`` (``log1p(w) = 2·atanh z``): ``g = 2z²/(1+z) + 2·(atanh z − z)``, the last term by its
    series ``z³·Σ z^(2k)/(2k+3)`` where ``z < 0.1`` (enough terms for the dtype's precision). Where ``z ≥ 1/2``
    (w ≥ 2) ``g = log1p(w) − w/(1+w)`` directly: ``z`` rounds at ulp(1) there, so ``1 − z`` and ``atanh z`` carry
    a relative error of ulp(1)·(w + 2)/2 (1.3 % at w = 4e5 in FP32, which β = 1 − 1e-12 puts on ordinary rows:
    8e-3 … 1e-2 gradient error on top-k rows), and the direct difference has no cancellation.
    """
    w = torch.exp(torch.where(u > 30.0, 30.0, u))  # shifted elements have w < (1−β)^(−1/2), far below e^30
    log1p_w = torch.where(u > 30.0, u, torch.log1p(w))
    z = w / (w + 2.0)
    near_one = z >= 0.5
    g_direct = log1p_w - w / (w + 1.0)
    zz = z * z
    small = z < 0.1
    series = torch.full_like(z, 1.0 / (2 * _SERIES_TERMS[z.dtype] + 1))
    for k in range(_SERIES_TERMS[z.dtype] - 1, 0, -1):
        series = series.mul_(zz).add_(1.0 / (2 * k + 1))
    tail = torch.where(small, series.mul_(zz).mul_(z), torch.atanh(torch.where(small, 0.5, z)) - z)
    g = zz.mul_(2.0).div_(z.add_(1.0)).add_(tail, alpha=2.0)
    g = torch.where(near_one, g_direct, g)
    return log1p_w.mul_(-((1.0 - beta) ** 2) / beta).sub_(g, alpha=(2.0 * beta - 1.0) / beta)


#: Terms of the series of ``(atanh z − z)/z³`` at z < 0.1 (:func:`_continuous_h_minus_c`): 0.01^(n−1) below the
#: dtype's epsilon.
_SERIES_TERMS = {torch.float16: 3, torch.bfloat16: 3, torch.float32: 5, torch.float64: 9}


def _softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + e^x)``, accurate for any x (``log1p(exp(x))``, and x where ``exp`` overflows)."""
    return torch.where(x > 30.0, x, torch.log1p(torch.exp(torch.where(x > 30.0, 30.0, x))))


def _times(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``w·v`` with ``0·(±inf) = 0`` (the limit ``0·log 0`` of a probability-0 entry)."""
    return torch.where(w == 0, 0.0, w * v)


def _live(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``d`` where the weight ``w`` is non-zero, else 0 (keeps ±inf out of a term whose weight is 0)."""
    return torch.where(w == 0, 0.0, d)


def _pow2_row_scale(g: torch.Tensor) -> torch.Tensor:
    """Per-row power of two ``[C]`` that puts the row's largest ``|g|`` (``g`` ``[C, D]``) in [2^14, 2^15).

    Exact in any binary float; all-zero rows get 2^15, and the exponent is kept within ±100 so the factor stays
    a finite FP32 number.
    """
    _, e = torch.frexp(g.abs().amax(-1))
    e = torch.where(e < -100, -100, torch.where(e > 100, 100, e))
    return torch.ldexp(torch.ones_like(g[:, 0]), _FP16_ROW_TOP - e)
