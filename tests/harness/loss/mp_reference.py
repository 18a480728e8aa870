"""An mpmath reference of one row's generalized JSD and its gradient w.r.t. the student logits (50 digits).

Written from the definitions only (no formula of harness/loss): ``p = softmax(zs/T)``, ``q = softmax(zt/T)``,
``M = (1−β)·p + β·q``; the divergence from its KLs; the gradient by the chain rule through the softmax,
``∂L/∂zs_i = p_i·(g_i − Σ_k p_k·g_k) / T`` with ``g_k = ∂L/∂p_k`` (p unconstrained):

* ``∂KL(T‖M)/∂p_k = −(1−β)·q_k/M_k``, ``∂KL(S‖M)/∂p_k = log(p_k/M_k) + 1 − (1−β)·p_k/M_k``;
* β = 0: ``∂KL(T‖S)/∂p_k = −q_k/p_k``; β = 1: ``∂KL(S‖T)/∂p_k = log(p_k/q_k) + 1``.

At 50 significant digits nothing of FP64 inputs cancels. Slow (pure python): meant for a few rows.
"""

from __future__ import annotations

import mpmath
import torch

DPS = 50


def mp_jsd_row(zs: torch.Tensor, zt: torch.Tensor, beta: float, beta_form: str, temperature: float = 1.0):
    """``(loss float, grad [D] float64 tensor)`` of one row; ``zs``, ``zt`` ``[D]`` logits (any float dtype)."""
    with mpmath.workdps(DPS):
        t_inv = 1 / mpmath.mpf(temperature)
        s = [mpmath.mpf(float(v)) * t_inv for v in zs.double().tolist()]
        t = [mpmath.mpf(float(v)) * t_inv for v in zt.double().tolist()]
        p, q = _softmax(s), _softmax(t)
        b = mpmath.mpf(beta)
        if beta == 0.0:
            loss = sum(qk * mpmath.log(qk / pk) for pk, qk in zip(p, q) if qk != 0)
            g = [-qk / pk for pk, qk in zip(p, q)]
        elif beta == 1.0:
            loss = sum(pk * mpmath.log(pk / qk) for pk, qk in zip(p, q) if pk != 0)
            g = [mpmath.log(pk / qk) + 1 for pk, qk in zip(p, q)]
        else:
            m = [(1 - b) * pk + b * qk for pk, qk in zip(p, q)]
            kl_t = sum(qk * mpmath.log(qk / mk) for qk, mk in zip(q, m) if qk != 0)
            kl_s = sum(pk * mpmath.log(pk / mk) for pk, mk in zip(p, m) if pk != 0)
            g_t = [-(1 - b) * qk / mk for qk, mk in zip(q, m)]
            g_s = [mpmath.log(pk / mk) + 1 - (1 - b) * pk / mk for pk, mk in zip(p, m)]
            w_t, w_s = (b, 1 - b) if beta_form == "paper" else (1 - b, b)
            loss = w_t * kl_t + w_s * kl_s
            g = [w_t * a + w_s * c for a, c in zip(g_t, g_s)]
        mean = sum(pk * gk for pk, gk in zip(p, g))
        grad = [pk * (gk - mean) * t_inv for pk, gk in zip(p, g)]
        return float(loss), torch.tensor([float(x) for x in grad], dtype=torch.float64)


def _softmax(z):
    top = max(z)
    e = [mpmath.exp(v - top) for v in z]
    tot = mpmath.fsum(e)
    return [v / tot for v in e]
