"""Upstream ms-swift's arithmetic, op for op, with a selectable β form (``precision=native``)."""

from __future__ import annotations

from typing import Callable

import torch

from gkd_harness.harness.contract import PAPER


def _jsd_native_chunk(
    s_log: torch.Tensor, t_log: torch.Tensor, beta: float, beta_form: str, kl_div_fn: Callable
) -> torch.Tensor:
    """Upstream's arithmetic, op for op (β as a tensor of the student's dtype), with a selectable form."""
    if beta == 0:
        return kl_div_fn(s_log, t_log)
    if beta == 1:
        return kl_div_fn(t_log, s_log)
    beta_t = torch.tensor(beta, dtype=s_log.dtype, device=s_log.device)
    log_beta = torch.log(beta_t)
    log_1_minus_beta = torch.log1p(-beta_t)
    m_log = torch.logsumexp(torch.stack([s_log + log_1_minus_beta, t_log + log_beta]), dim=0)
    if beta_form == PAPER:
        return beta_t * kl_div_fn(m_log, t_log) + (1 - beta_t) * kl_div_fn(m_log, s_log)
    return (1 - beta_t) * kl_div_fn(m_log, t_log) + beta_t * kl_div_fn(m_log, s_log)
