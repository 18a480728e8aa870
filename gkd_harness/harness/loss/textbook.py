"""The textbook generalized JSD from log-probabilities, and the NaN-safe KL (the ``fp64`` reference and the path
through injected primitives)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from gkd_harness.harness.contract import PAPER


def _weights(beta: float, beta_form: str):
    """(weight of KL(T‖M), weight of KL(S‖M)) for 0<β<1."""
    if beta_form == PAPER:
        return beta, 1.0 - beta
    return 1.0 - beta, beta


def _safe_kl(input_log: torch.Tensor, target_log: torch.Tensor) -> torch.Tensor:
    """KL(target‖input) per row ``[C, D] -> [C]`` with ``0·log 0 = 0`` (targets of probability 0 contribute 0).

    Same value as upstream's ``default_kl_div`` wherever that is finite; used in its place by the patched
    variants so a top-k row with some −inf teacher log-probs stays finite (upstream gives NaN there).
    """
    tp = target_log.exp()
    live = tp > 0
    return (tp * (torch.where(live, target_log, 0.0) - torch.where(live, input_log, 0.0))).sum(-1)


def _jsd_from_logprobs(
    s_log: torch.Tensor, t_log: torch.Tensor, beta: float, beta_form: str, kl_div_fn: Callable
) -> torch.Tensor:
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
