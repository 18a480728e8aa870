"""Row-chunked execution of the patched variants: promotion per chunk, recompute-in-backward for injected
primitives, and the fused closed-form gradient for the cancellation-free form."""

from __future__ import annotations

import math
from typing import Optional

import torch
from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers.gkd_loss import default_kl_div, default_log_softmax

from gkd_harness.harness.contract import FP32
from gkd_harness.harness.loss.stable import TorchRows, _jsd_stable, _jsd_stable_and_grad, _pow2_row_scale
from gkd_harness.harness.loss.textbook import _jsd_from_logprobs, _safe_kl


def _prepare_chunk(
    s: torch.Tensor, t: torch.Tensor, cdtype: torch.dtype, temperature: Optional[float], align_vocab: bool
):
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

    Used where the fused path (:class:`_FusedChunkedJSD`) does not apply: unequal vocabularies, a teacher that needs
    a gradient, or an explicit ``recompute``. ``fp32`` with the default primitives uses the cancellation-free form
    and its closed-form student gradient (:class:`_StableJSD`); otherwise the textbook formula runs through the given
    primitives.
    """
    stable = precision == FP32 and log_softmax_fn is default_log_softmax and kl_div_fn is default_kl_div
    if kl_div_fn is default_kl_div:
        kl_div_fn = _safe_kl  # same values, but 0·log 0 = 0 on probability-0 entries (−inf top-k log-probs)

    def fn(s_c: torch.Tensor, t_c: torch.Tensor) -> torch.Tensor:
        s_c, t_c = _prepare_chunk(s_c, t_c, cdtype, temperature, align_vocab)
        if stable:
            need_s = s_c.requires_grad and torch.is_grad_enabled()
            return _StableJSD.apply(s_c, t_c, beta, beta_form, need_s)
        # Injected (e.g. vocab-parallel) primitives: the textbook formula through them, in the compute dtype.
        return _jsd_from_logprobs(log_softmax_fn(s_c), log_softmax_fn(t_c), beta, beta_form, kl_div_fn)

    return fn


class _StableJSD(torch.autograd.Function):
    """Per-position JSD ``[C]`` of :func:`_jsd_stable`'s form for one chunk ``s`` ``[C, D]``, ``t`` ``[C, D]`` (scaled
    and aligned), with the student's gradient in closed form (:func:`_jsd_stable_and_grad`).

    Autograd through :func:`_jsd_stable` forms ``∂L/∂z = p·h − p·Σ p·h``, which cancels where ``h`` is near its
    limit on most of the student's mass (student and teacher confident on different tokens: 4e-3 … 5e-2 rel L2
    from FP64 at T = 0.05, V = 151,936), and, for the continuous form near β = 1, inside ``h`` itself. The closed
    form holds ``h − c`` on those elements (:func:`_gradient_from_h`, :func:`_continuous_h_minus_c`). The teacher's
    gradient (a teacher that needs one, or upstream's alignment when the teacher borrows the student's extra
    logits) is autograd through :func:`_jsd_stable` with the student held fixed; under ``create_graph=True`` both
    gradients are autograd through :func:`_jsd_stable`, so they can be differentiated again.
    """

    @staticmethod
    def forward(ctx, s, t, beta, beta_form, need_s):
        # The kernel only reads its student argument (``s`` may alias the caller's logits) and consumes the teacher's.
        loss, g = _jsd_stable_and_grad(s, t.clone(), beta, beta_form, need_s, sync_free=is_sync_free(s.device))
        ctx.save_for_backward(s, t, g)
        ctx.beta, ctx.beta_form = beta, beta_form
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        s, t, g = ctx.saved_tensors
        need_s, need_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        inputs = [x for x, need in ((s, need_s), (t, need_t)) if need]
        if torch.is_grad_enabled():  # create_graph=True: autograd through the same form, differentiable again
            out = _jsd_stable(s, t, ctx.beta, ctx.beta_form)
            grads = iter(torch.autograd.grad(out, inputs, grad_outputs=grad_out, create_graph=True))
            grad_s = next(grads) if need_s else None
            if grad_s is not None and g is not None:
                # The value is the closed form's (autograd's cancels on disagreeing rows: up to 420x off), the
                # graph autograd's: its derivatives (a Hessian-vector product) are those of the same form.
                grad_s = g * grad_out[:, None] + (grad_s - grad_s.detach())
            return grad_s, (next(grads) if need_t else None), None, None, None
        assert g is not None or not need_s, "the student's gradient was not computed in forward"
        grad_s = g * grad_out[:, None] if need_s else None
        grad_t = None
        if need_t:
            with torch.enable_grad():
                t_c = t.detach().requires_grad_(True)
                (grad_t,) = torch.autograd.grad(_jsd_stable(s.detach(), t_c, ctx.beta, ctx.beta_form), t_c, grad_out)
        return grad_s, grad_t, None, None, None


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
                out[start : start + rows] = fn(s[start : start + rows], t[start : start + rows])
        ctx.fn, ctx.rows = fn, rows
        ctx.save_for_backward(s, t)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        s, t = ctx.saved_tensors
        need_s, need_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if torch.is_grad_enabled():  # create_graph=True: a gradient that can be differentiated again
            return _recomputed_grads_with_graph(ctx.fn, ctx.rows, s, t, grad_out, need_s, need_t) + (None,) * 3
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
            if grad_s is not None:  # need_s
                grad_s[sl] = next(it)
            if grad_t is not None:  # need_t
                grad_t[sl] = next(it)
        return grad_s, grad_t, None, None, None


def _recomputed_grads_with_graph(fn, rows: int, s, t, grad_out, need_s: bool, need_t: bool):
    """``(grad_s, grad_t)`` of :class:`_RecomputedChunkedJSD` under ``create_graph=True``: each row block's graph
    is rebuilt from the saved inputs themselves (not detached copies), so the returned gradients carry a graph to
    ``s``, ``t`` and ``grad_out`` (a Hessian-vector product, a gradient penalty). Blocks joined by ``torch.cat``."""
    parts_s, parts_t = [], []
    for start in range(0, s.shape[0], rows):
        sl = slice(start, start + rows)
        s_c, t_c = s[sl], t[sl]
        out = fn(s_c, t_c)
        inputs = [x for x, need in ((s_c, need_s), (t_c, need_t)) if need]
        grads = iter(torch.autograd.grad(out, inputs, grad_outputs=grad_out[sl], create_graph=True))
        if need_s:
            parts_s.append(next(grads))
        if need_t:
            parts_t.append(next(grads))
    return (torch.cat(parts_s) if need_s else None), (torch.cat(parts_t) if need_t else None)


#: Raised by :class:`_FusedChunkedJSD` under ``create_graph=True`` (its gradient is not a function of a graph).
DOUBLE_BACKWARD_ERROR = (
    "the fp32 and fp64 GKD losses compute d loss / d student logits in closed form (one fused pass, no autograd graph), "
    "so its gradient cannot be differentiated again (create_graph=True, higher-order derivatives); for that, call "
    "gkd_harness.harness.losses.jsd_per_position(..., recompute=True) (autograd through the same "
    "cancellation-free form, recomputed per row block) or use the native variant"
)


def _scaled(x: torch.Tensor, cd: torch.dtype, temperature: Optional[float]) -> torch.Tensor:
    """``x`` in ``cd`` divided by ``temperature`` as a new tensor (never aliases ``x``), in as few passes as possible.

    Same arithmetic as :func:`_prepare_chunk` (cast, then divide), so both paths see identical scaled logits.
    """
    y = x.to(cd)
    if y is x:
        return x / temperature if temperature is not None else x.clone()
    return y.div_(temperature) if temperature is not None else y


class _FusedChunkedJSD(torch.autograd.Function):
    """Per-position JSD ``[N]`` (:func:`_jsd_stable`'s form) of ``s`` ``[N, D]`` (student, gradient) against ``t``
    ``[N, D]`` (no gradient) and its closed-form gradient, in one pass per block of ``rows`` rows.

    A teacher without gradient, as wide as the student or wider (``t`` ``[N, D']``, ``D' ≥ D``: upstream's alignment
    gives the student the teacher's logits for the extra ids, which carry no gradient). ``ops`` does the row
    reductions:
    :class:`~gkd_harness.harness.loss.stable.TorchRows` (the default primitives; ``fp32`` and the ``fp64`` reference) or
    :class:`~gkd_harness.harness.loss.stable.InjectedRows` (ms-swift's injected ``log_softmax_fn`` / ``kl_div_fn``, vocab-parallel
    under TP: a row may be a shard, and each rank keeps the derivative for its own shard). Forward keeps
    ``∂JSD_i/∂z_s`` ``[N, D]`` in the student's dtype (no activation graph, nothing recomputed, no FP32 copy of BF16
    inputs) plus, for a BF16/FP16 student, an int8 residual of its rounding (:func:`_residual`); backward scales it
    by the incoming per-position gradient in the compute dtype and rounds once (a ``1/num_valid`` scale that is not
    a power of two would otherwise round the stored BF16 value a second time).
    """

    @staticmethod
    def forward(ctx, s, t, cd, temperature, beta, beta_form, rows, ops=TorchRows):
        n, width = s.shape
        need = ctx.needs_input_grad[0]
        sync_free = is_sync_free(s.device)
        out = torch.empty(n, dtype=cd, device=s.device)
        # ∂JSD_i/∂z_s in the student's dtype: never a full-width FP32 copy for BF16 inputs (the architecture contract).
        dz = torch.empty(s.shape, dtype=s.dtype, device=s.device) if need else None
        # FP16 has 5 exponent bits: ∂JSD/∂z (before the loss scale reaches it in backward) would underflow to 0.
        # Each row is stored times a power of two (exact) and the factor undone in backward.
        row_scale = torch.ones(n, dtype=cd, device=s.device) if need and s.dtype == torch.float16 else None
        # A student narrower than the compute dtype: dz is ∂JSD/∂z rounded to the student's dtype, so backward's
        # scale (1/num_valid) would round it a second time. An int8 residual per element keeps 7 more bits of it,
        # so the gradient is rounded once, in backward (half the bytes of dz; never an FP32 copy).
        res = (
            torch.empty(s.shape, dtype=torch.int8, device=s.device)
            if need and torch.finfo(s.dtype).bits < torch.finfo(cd).bits
            else None
        )
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            zs, zt = _scaled(s[sl], cd, temperature), _scaled(t[sl], cd, temperature)
            if zt.shape[-1] > width:  # a narrower student takes the teacher's extra logits (upstream's alignment)
                zs = torch.cat([zs, zt[:, width:]], -1)
            loss, g = _jsd_stable_and_grad(zs, zt, beta, beta_form, need, rows=ops, sync_free=sync_free)
            del zs, zt
            out[sl] = loss
            if g is not None and g.shape[-1] > width:
                g = g[:, :width]  # the padded entries are the teacher's: no gradient to the student
            if dz is not None:  # need
                if row_scale is None and res is None and temperature is not None:
                    torch.div(g, temperature, out=dz[sl])  # = g.div_(T) then the cast into dz, in one pass
                else:
                    if temperature is not None:
                        g.div_(temperature)
                    if row_scale is not None:
                        row_scale[sl] = _pow2_row_scale(g)
                        g.mul_(row_scale[sl, None])
                    dz[sl] = g
                    if res is not None:
                        res[sl] = _residual(g, dz[sl])
                del g
        ctx.save_for_backward(dz, row_scale, res)
        ctx.rows, ctx.cd = rows, cd
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():  # create_graph=True: refused rather than a gradient without its graph
            raise RuntimeError(DOUBLE_BACKWARD_ERROR)
        dz, row_scale, res = ctx.saved_tensors
        grad_s = None
        if dz is not None and ctx.needs_input_grad[0]:
            grad_s = torch.empty_like(dz)
            go = grad_out.to(ctx.cd)
            if row_scale is not None:
                go = go / row_scale
            # dz (with its residual: ∂JSD/∂z to ~7 bits beyond the student dtype) × go computes in the compute
            # dtype and rounds once into grad_s. Row blocks: the compute-dtype temporaries stay block-sized.
            for start in range(0, dz.shape[0], ctx.rows):
                sl = slice(start, start + ctx.rows)
                d = dz[sl] if res is None else _with_residual(dz[sl], res[sl], ctx.cd)
                torch.mul(d, go[sl, None], out=grad_s[sl])
        return grad_s, None, None, None, None, None, None, None


def _residual_shift(dtype: torch.dtype) -> int:
    """``k`` with ``|g − hi| · 2^k / |hi| ≤ 128`` for ``hi`` = ``g`` rounded to ``dtype`` (half an ulp is at most
    ``2^-(nmant+1)`` of ``|hi|``): the int8 residual's scale, 2^15 for BF16 and 2^18 for FP16."""
    return round(-math.log2(torch.finfo(dtype).eps)) + 8  # eps = 2^-nmant


def _residual(g: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """The rounding error of ``hi`` (``g`` ``[C, D]`` in the compute dtype, rounded to the student's dtype) in
    units of ``|hi| · 2^-k`` (:func:`_residual_shift`), as int8 ``[C, D]``; consumes ``g``. Where ``hi = 0`` the
    residual is not kept (it multiplies ``|hi|``)."""
    h = hi.to(g.dtype)
    g.sub_(h).div_(h.abs_()).mul_(2.0 ** _residual_shift(hi.dtype))
    return g.nan_to_num_(0.0, 127.0, -127.0).round_().clamp_(-127.0, 127.0).to(torch.int8)


def _with_residual(hi: torch.Tensor, res: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """``hi + res · |hi| · 2^-k`` in ``cd`` ``[C, D]``: ∂JSD/∂z to within ``|hi| · 2^-(k+1)`` (an ulp/256 of BF16)."""
    h = hi.to(cd)
    return torch.addcmul(h, res.to(cd), h.abs(), value=2.0 ** -_residual_shift(hi.dtype))


#: Per device type: does the fused path choose its per-element formulas without host reads
#: (:class:`~gkd_harness.harness.loss.stable._Masked`)? On a GPU every host read of a mask (``bool(mask.any())``,
#: boolean indexing) stalls the pipeline, and a call made 4–9 of them per row block, so their number grew with N
#: and V; sync-free, a call's host synchronisations are a constant (ms-swift's ``extract_active`` and the
#: caller's). On a CPU a host read costs nothing, and branching lets a block skip the formulas none of its
#: elements needs. Other device types: sync-free.
SYNC_FREE = {"cpu": False}


def is_sync_free(device: torch.device) -> bool:
    """Whether the fused path runs sync-free on ``device`` (:data:`SYNC_FREE`)."""
    return SYNC_FREE.get(torch.device(device).type, True)


#: Elements of one row block of the fused path, per device type. Every FP32 temporary of a block is this many
#: elements (about eight are alive at once): on a CPU 2^18 (1 MiB each, so a block's working set stays in the
#: L2/L3 caches and its buffers are reused by the allocator instead of being page-faulted afresh); on a GPU
#: 2^24 (64 MiB each: large enough that kernel launches do not dominate, still a few per cent of a 4k-token
#: ``[N, V]`` BF16 tensor). Chosen from measurements (``gkd-bench``; notes in docs/performance.md).
BLOCK_ELEMENTS = {"cpu": 2**18, "cuda": 2**24}
_BLOCK_ELEMENTS_OTHER = 2**22


def block_rows(n: int, width: int, device: torch.device) -> int:
    """Rows per block of the fused fp32 path: ``BLOCK_ELEMENTS`` of the device type ÷ the row width ``width``.

    Depends on the vocabulary width (``V``, or ``K`` in top-k mode) and the device, never on the caller's
    ``chunk_size`` (upstream's row chunk, which keeps its meaning for ``native``). At least 1, at most ``n``.
    """
    budget = BLOCK_ELEMENTS.get(torch.device(device).type, _BLOCK_ELEMENTS_OTHER)
    return max(1, min(n, budget // max(1, width)))


def _rows_per_chunk(n: int, chunk_size: int, in_itemsize: int, compute_itemsize: int) -> int:
    """Rows per chunk so a chunk's compute-dtype working set is no larger than upstream's would be.

    Upstream works on ``min(N, chunk_size)`` rows in the input dtype; an FP32 chunk of BF16 inputs gets
    proportionally fewer rows.
    """
    base = max(1, min(n, chunk_size))
    return max(1, (base * in_itemsize) // max(compute_itemsize, in_itemsize))
