"""The cancellation-free form and its closed-form gradient through caller-injected primitives, and in FP64.

``fp32`` with ms-swift's injected ``log_softmax_fn`` / ``kl_div_fn`` (Megatron passes its vocab-parallel ones
at every TP size: at TP=1 they are ``F.log_softmax`` and the textbook KL) and ``fp64`` (the spot check's and
gkd-replay's reference) both run :func:`harness.loss.stable._jsd_stable_and_grad` row chunk by row chunk, with
the row reductions of :class:`~harness.loss.stable.InjectedRows` (a row may be a vocabulary shard) or
:class:`~harness.loss.stable.TorchRows`.
"""
from __future__ import annotations

from typing import Optional

import torch

from harness.loss.stable import _jsd_stable_and_grad, _pow2_row_scale


def _scaled(x: torch.Tensor, cd: torch.dtype, temperature: Optional[float]) -> torch.Tensor:
    """``x`` in ``cd`` divided by ``temperature``, as a new tensor (cast, then divide)."""
    y = x.to(cd)
    if y is x:
        return x / temperature if temperature is not None else x.clone()
    return y.div_(temperature) if temperature is not None else y


class StableJSDWithRows(torch.autograd.Function):
    """Per-position JSD ``[N]`` of ``s`` ``[N, D]`` (student, gradient) against ``t`` ``[N, D]`` (no gradient).

    Forward computes the loss and ``∂JSD_i/∂s`` chunk by chunk (``rows`` rows at a time) in the compute dtype
    ``cd`` and keeps the gradient in the student's dtype (FP16: times a per-row power of two, undone in backward);
    backward scales it by the incoming per-position gradient. Under TP each rank holds the derivative of the
    replicated loss with respect to its own shard, which is what the vocab-parallel backward expects.
    """

    @staticmethod
    def forward(ctx, s, t, cd, temperature, beta, beta_form, rows, ops):
        n = s.shape[0]
        need = ctx.needs_input_grad[0]
        out = torch.empty(n, dtype=cd, device=s.device)
        dz = torch.empty(s.shape, dtype=s.dtype, device=s.device) if need else None
        row_scale = torch.ones(n, dtype=cd, device=s.device) if need and s.dtype == torch.float16 else None
        for start in range(0, n, rows):
            sl = slice(start, start + rows)
            loss, g = _jsd_stable_and_grad(_scaled(s[sl], cd, temperature), _scaled(t[sl], cd, temperature), beta,
                                           beta_form, need, rows=ops)
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
        return grad_s, None, None, None, None, None, None, None
