"""gkd-harness worked example, BROKEN on purpose: only the student promoted.

It promotes the student logits to FP32 and leaves the BF16 teacher as it is: the teacher's log-softmax
and exp run in BF16, so the JSD of near-identical distributions is still mostly rounding noise.
`gkd-certify examples/candidates/broken_student_only.py` exits 1; the failing row is "mixed FP32/BF16 (the defect)".
Everything but ``jsd_loss`` / ``gkd_loss`` comes from the installed ms-swift (the interface gkd-certify checks).
"""

from typing import Callable

import torch
from swift.rlhf_trainers.gkd_loss import (
    TeacherOutput,
    _align_vocab,
    default_gather,
    default_kl_div,
    default_log_softmax,
    extract_active,
)


def _promote(*tensors):
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return tuple(t.to(dtype) for t in tensors)


def jsd_loss(
    s_logits: torch.Tensor,
    t_logits: torch.Tensor,
    beta: float,
    log_softmax_fn: Callable = default_log_softmax,
    kl_div_fn: Callable = default_kl_div,
    chunk_size: int = 512,
) -> torch.Tensor:
    """Upstream's chunked JSD (paper form)."""
    n = s_logits.size(0)
    if n == 0:
        return s_logits.sum()
    total = s_logits.new_zeros(())
    if beta != 0 and beta != 1:
        beta_t = torch.tensor(beta, dtype=s_logits.dtype, device=s_logits.device)
        log_beta, log_1_minus_beta = torch.log(beta_t), torch.log1p(-beta_t)
    for start in range(0, n, chunk_size):
        s_log = log_softmax_fn(s_logits[start : start + chunk_size])
        t_log = log_softmax_fn(t_logits[start : start + chunk_size])
        if beta == 0:
            jsd = kl_div_fn(s_log, t_log)
        elif beta == 1:
            jsd = kl_div_fn(t_log, s_log)
        else:
            m_log = torch.logsumexp(torch.stack([s_log + log_1_minus_beta, t_log + log_beta]), dim=0)
            jsd = beta_t * kl_div_fn(m_log, t_log) + (1 - beta_t) * kl_div_fn(m_log, s_log)
        total = total + jsd.sum()
    return total


def gkd_loss(
    student_logits,
    teacher_output: TeacherOutput,
    labels,
    beta: float,
    temperature: float,
    gather_fn: Callable = default_gather,
    log_softmax_fn: Callable = default_log_softmax,
    kl_div_fn: Callable = default_kl_div,
    chunk_size: int = 512,
):
    teacher_output.validate()
    s_active, t_active, num_valid = extract_active(student_logits, teacher_output, labels)
    if t_active.is_topk_mode:
        s_logits, t_logits = gather_fn(s_active, t_active.topk_indices), t_active.topk_logprobs
        lsf, kdf = default_log_softmax, default_kl_div
    else:
        s_logits, t_logits = _align_vocab(s_active, t_active.full_logits)
        lsf, kdf = log_softmax_fn, kl_div_fn
    if s_logits.dtype in (torch.bfloat16, torch.float16):
        s_logits = s_logits.float()  # BUG: the teacher is not promoted
    s_logits, t_logits = s_logits / temperature, t_logits / temperature
    total = jsd_loss(s_logits, t_logits, beta, lsf, kdf, chunk_size)
    return total, num_valid
