"""``-inf`` logits (a masked vocabulary) on every path of the patched loss (issue 46, item 3).

Two maskings: both sides ``-inf`` on the same ids (entries masked out of the vocabulary), and the student alone
``-inf`` on some ids. The exact loss is finite wherever the divergence is (``0·log 0 = 0``: a probability-0 entry
contributes nothing), ``+inf`` only where the exact KL is infinite (β = 0 with the student alone masked: the
teacher puts mass where the student has none). Before, fp32 and fp64 gave NaN value and gradient for both sides
masked at every β, and a NaN gradient for the student alone masked at β = 1.

The reference is written here in FP64 from the definitions, with the masking explicit: each KL is a sum over the
support of its first argument only (never ``0·(−inf)``), the mixture over the union of the supports, and the
gradient is FP64 autograd with respect to the student's finite logits alone (0 on the masked ones).
"""

from __future__ import annotations

import math

import pytest
import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.loss import chunked
from gkd_harness.harness.loss.tolerances import GRAD_REL_L2_FP32_STUDENT, loss_tol
from gkd_harness.harness.losses import make_gkd_loss

N, V, K, T = 4, 64, 62, 0.9
BOTH, STUDENT_ONLY = [5, 17, 40], [3, 9]


def _tp1_log_softmax(x):
    """``vocab_parallel_log_softmax`` at TP=1 (Megatron's call path)."""
    return torch.nn.functional.log_softmax(x, dim=-1)


def _tp1_kl_div(input_log, target_log):
    """``vocab_parallel_kl_div`` at TP=1."""
    return (torch.exp(target_log) * (target_log - input_log)).sum(dim=-1)


def _inputs(masking: str):
    """``(student [1, N, V] fp32, teacher [1, N, V] bf16)`` with ``-inf`` on the masked ids."""
    g = torch.Generator().manual_seed(46)
    s = (torch.randn(1, N, V, generator=g) * 2).bfloat16().float()
    t = (s + 0.5 * torch.randn(1, N, V, generator=g)).bfloat16()
    if masking == "both":
        s[..., BOTH] = -math.inf
        t[..., BOTH] = -math.inf
    else:
        s[..., STUDENT_ONLY] = -math.inf
    return s, t


def _reference_row(s: torch.Tensor, t: torch.Tensor, beta: float, form: str):
    """FP64 ``(divergence, d divergence / d s)`` of one row ``s`` ``[D]``, ``t`` ``[D]`` (``-inf`` = masked)."""
    s, t = s.double(), t.double()
    keep, tcols = torch.isfinite(s), torch.isfinite(t)
    x = (s[keep] / T).detach().requires_grad_(True)
    ls = torch.full_like(s, -math.inf).index_put((keep.nonzero().squeeze(-1),), torch.log_softmax(x, -1))
    lt = torch.full_like(t, -math.inf)
    lt[tcols] = torch.log_softmax(t[tcols] / T, -1)

    def kl(a_log, b_log, support):  # Σ over the support of the first argument only
        if bool((support & ~torch.isfinite(b_log)).any()):
            return torch.tensor(math.inf, dtype=torch.float64)
        return (a_log[support].exp() * (a_log[support] - b_log[support])).sum()

    if beta == 0.0:
        value = kl(lt, ls, tcols)
    elif beta == 1.0:
        value = kl(ls, lt, keep)
    else:
        lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
        w_t, w_s = (beta, 1 - beta) if form == "paper" else (1 - beta, beta)
        value = w_t * kl(lt, lm, tcols) + w_s * kl(ls, lm, keep)
    grad = torch.zeros_like(s)
    if math.isfinite(float(value)):
        (gx,) = torch.autograd.grad(value, x)
        grad[keep] = gx / T
    return float(value), grad


def _reference(s, t, beta, form):
    """``(total, grad of total / N [1, N, D])`` over the rows of ``[1, N, D]`` inputs."""
    rows = [_reference_row(s[0, i], t[0, i], beta, form) for i in range(s.shape[1])]
    return sum(v for v, _ in rows), torch.stack([g for _, g in rows])[None] / s.shape[1]


def _call(precision, form, path, s, t, beta):
    """``(total, gradient of total / num_valid, the inputs the loss judged: student, teacher [1, n, D])``."""
    labels = torch.zeros(1, N, dtype=torch.long)
    x = s.clone().requires_grad_(True)
    kwargs = dict(log_softmax_fn=_tp1_log_softmax, kl_div_fn=_tp1_kl_div) if path == "injected" else {}
    if path == "topk":
        lp, ids = torch.log_softmax(t.float() / 1.0, -1).topk(K, -1)  # the masked ids come last, at −inf
        to = TeacherOutput(topk_logprobs=lp, topk_indices=ids, labels=labels)
        judged = (torch.gather(s, -1, ids), lp)
    else:
        to = TeacherOutput(full_logits=t, labels=labels)
        judged = (s, t)
    total, n = make_gkd_loss(precision, form)(x, to, labels, beta, T, **kwargs)
    (total / n).backward()
    grad = x.grad
    assert grad is not None
    if path == "topk":
        grad = torch.gather(grad, -1, ids)
    return float(total.detach()), grad, judged


@pytest.mark.parametrize("precision", ["fp32", "fp64", "fp32 sync-free"])
@pytest.mark.parametrize("path", ["default", "injected", "topk"])
@pytest.mark.parametrize("masking", ["both", "student"])
@pytest.mark.parametrize("beta,form", [(0.0, "paper"), (0.5, "paper"), (0.5, "continuous"), (1.0, "paper")])
def test_masked_entries_value_and_gradient_match_the_masked_reference(
    monkeypatch, precision, path, masking, beta, form
):
    """Every path (the default and Megatron's TP=1 primitives at full vocabulary, top-k), fp32 (host-branching as
    on a CPU, and sync-free as on a GPU) and fp64: the value and gradient of the explicit FP64 reference."""
    if precision == "fp32 sync-free":
        monkeypatch.setattr(chunked, "SYNC_FREE", {"cpu": True}, raising=False)
        precision = "fp32"
    s, t = _inputs(masking)
    total, grad, (s_j, t_j) = _call(precision, form, path, s, t, beta)
    ref_total, ref_grad = _reference(s_j, t_j, beta, form)
    if math.isinf(ref_total):  # β = 0, student alone masked: KL(T‖S) is infinite
        assert total == math.inf
        return
    assert math.isfinite(total), total
    assert abs(total - ref_total) <= loss_tol(ref_total, N), (total, ref_total)
    assert bool(torch.isfinite(grad).all())
    assert bool((grad[torch.isinf(s_j)] == 0).all())  # no gradient into a masked logit
    rel = float((grad.double() - ref_grad).norm() / ref_grad.norm())
    assert rel <= GRAD_REL_L2_FP32_STUDENT, rel
