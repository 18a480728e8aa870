"""Independent FP64 reference for the generalized JSD and the GKD pipeline.

Written from the formulas, not from the code under test: log-probabilities in FP64, the mixture
``M = (1-β)·S + β·T`` formed in log space (``logaddexp``, so it neither underflows at logit scales of 1e4 nor
rounds below FP64), and KL terms as sums of ``p·(log p − log q)`` with ``0·log 0 = 0``. Gradients come from FP64
autograd through these formulas (``KL(S‖M)`` written relative to its vanishing-teacher limit for the gradient, see
:func:`_jsd_for_gradient`), with each row's entry at the student's argmax set from the row's zero sum.
"""

from __future__ import annotations

import math

import torch

from gkd_harness.harness.contract import CONTINUOUS, PAPER

F64 = torch.float64


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) per row, ``[N, D] -> [N]``; terms with P = 0 contribute 0."""
    p = p_log.exp()
    live = p > 0  # the dropped branch gets finite inputs too, so no NaN reaches a gradient
    terms = torch.where(live, p * (torch.where(live, p_log, 0.0) - torch.where(live, q_log, 0.0)), 0.0)
    return terms.sum(-1)


def reference_jsd(s_logits, t_logits, beta: float, beta_form: str = PAPER, temperature: float = 1.0):
    """Per-position divergence ``[N]`` in FP64 for logits ``[N, D]`` (any dtype, upcast exactly to FP64).

    β = 0 → KL(T‖S); β = 1 → KL(S‖T); otherwise paper ``β·KL(T‖M) + (1−β)·KL(S‖M)`` or continuous
    ``(1−β)·KL(T‖M) + β·KL(S‖M)`` with ``M = (1−β)·S + β·T``.
    """
    s = s_logits.to(F64) / temperature
    t = t_logits.to(F64) / temperature
    ls = s - torch.logsumexp(s, -1, keepdim=True)
    lt = t - torch.logsumexp(t, -1, keepdim=True)
    if beta == 0:
        return _kl(lt, ls)
    if beta == 1:
        return _kl(ls, lt)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))  # log((1-β)·S + β·T)
    kl_t, kl_s = _kl(lt, lm), _kl(ls, lm)
    if beta_form == PAPER:
        return beta * kl_t + (1 - beta) * kl_s
    if beta_form == CONTINUOUS:
        return (1 - beta) * kl_t + beta * kl_s
    raise ValueError(beta_form)


def _jsd_for_gradient(s_logits, t_logits, beta: float, beta_form: str, temperature: float):
    """A per-position function ``[N]`` with the same gradient as :func:`reference_jsd` (FP64 autograd).

    For 0 < β < 1, ``KL(S‖M) = Σ p·log(p/M) = −log(1−β)·Σ p − Σ p·softplus(d + log(β/(1−β)))`` with
    ``d = log q − log p``; ``Σ p = 1`` has zero gradient, so that term is dropped. Autograd of the textbook
    ``Σ p·log(p/M)`` forms ``h − Σ p·h`` with ``h → −log(1−β)`` wherever the teacher's share vanishes (student and
    teacher confident on different tokens), which cancels below FP64; ``softplus`` (``logaddexp(x, 0)``) is 0 in
    that limit. ``KL(T‖M)`` and the endpoint KLs have no such constant and stay textbook.
    """
    if beta in (0.0, 1.0):
        return reference_jsd(s_logits, t_logits, beta, beta_form, temperature)
    s = s_logits.to(F64) / temperature
    t = t_logits.to(F64) / temperature
    ls = s - torch.logsumexp(s, -1, keepdim=True)
    lt = t - torch.logsumexp(t, -1, keepdim=True)
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))
    x = (lt - ls) + (math.log(beta) - math.log1p(-beta))
    kl_s_shifted = -(ls.exp() * torch.logaddexp(x, torch.zeros_like(x))).sum(-1)
    w_t, w_s = (beta, 1 - beta) if beta_form == PAPER else (1 - beta, beta)
    return w_t * _kl(lt, lm) + w_s * kl_s_shifted


def reference_gkd(
    student_logits,
    labels,
    beta,
    temperature,
    beta_form=PAPER,
    teacher_full=None,
    teacher_topk=None,
    teacher_labels=None,
):
    """FP64 GKD loss (total, num_valid) and d(total/num_valid)/d student_logits, from first principles.

    Args:
        student_logits: ``[B, S, V]``; labels: ``[B, S]`` (-100 inactive, already shifted).
        teacher_full: ``[B, S, V']`` teacher logits, or teacher_topk: ``(logprobs [B,S,K], indices [B,S,K])``.
    Semantics copied from the behaviour upstream documents: positions masked by labels; in top-k mode the
    student is evaluated on the teacher's ids and positions whose top-k log-probs are all -inf are dropped;
    differing vocabularies are aligned by giving the shorter side the other side's logits for the extra ids.
    Returns:
        ``(total float, num_valid int, grad [B, S, V] float64)``.
    """
    s_all = student_logits.detach().to(F64).requires_grad_(True)
    t_mask = (labels if teacher_labels is None else teacher_labels) != -100
    s = s_all[labels != -100]
    if teacher_topk is not None:
        lp, idx = teacher_topk
        lp, idx = lp[t_mask].to(F64), idx[t_mask]
        keep = ~torch.isinf(lp).all(-1)
        s, lp, idx = s[keep], lp[keep], idx[keep]
        s_k = torch.gather(s, -1, idx)
        per = reference_jsd(s_k, lp, beta, beta_form, temperature) if len(s_k) else s_k.sum(-1)
        per_g = _jsd_for_gradient(s_k, lp, beta, beta_form, temperature) if len(s_k) else per
    else:
        t = teacher_full[t_mask].to(F64)
        vs, vt = s.shape[-1], t.shape[-1]
        if vs < vt:
            s = torch.cat([s, t[:, vs:]], -1)
        elif vt < vs:
            t = torch.cat([t, s[:, vt:]], -1)  # upstream: the teacher borrows the student logits (graph kept)
        per = reference_jsd(s, t, beta, beta_form, temperature) if len(s) else s.sum(-1)
        per_g = _jsd_for_gradient(s, t, beta, beta_form, temperature) if len(s) else per
    n = int(per.shape[0])
    total = per.sum()
    loss = per_g.sum() / n if n else per_g.sum() * 0  # same gradient as total / n
    (grad,) = torch.autograd.grad(loss, s_all, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(s_all)
    rows = labels != -100
    if teacher_topk is not None:
        # The loss sees the student only at the teacher's ids: the argmax among those (gradient 0 elsewhere).
        s_act, idx_act = student_logits.detach()[rows].double(), teacher_topk[1][t_mask]
        j = idx_act.gather(-1, s_act.gather(-1, idx_act).argmax(-1, keepdim=True))
        grad = _zero_sum_at_argmax(grad, rows, j)
    elif teacher_full.shape[-1] == student_logits.shape[-1]:
        grad = _zero_sum_at_argmax(grad, rows, student_logits.detach()[rows].double().argmax(-1, keepdim=True))
    return float(total.detach()), n, grad


def _zero_sum_at_argmax(grad: torch.Tensor, rows: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Replace each active row's gradient at the student's argmax ``j`` (``[N, 1]`` column of each of the ``N``
    rows selected by the bool mask ``rows``) by minus the sum of the row's other entries.

    The loss is invariant under adding a constant to a row of the student logits it sees (equal vocabularies,
    or the teacher's top-k ids), so each row of the exact gradient sums to 0. At the argmax of a nearly one-hot
    row (logits / T of thousands, or a dominant logit at low T) autograd forms ``p·(1 − p)``-like differences that
    FP64 cannot resolve (``1 − p ≈ 1e-27``), while every other entry is a product of small factors, accurate to
    FP64 rounding. Elsewhere the change is at FP64 rounding level.
    """
    grad = grad.clone()
    g = grad[rows]
    at_j = g.gather(-1, j)
    g.scatter_(-1, j, -(g.sum(-1, keepdim=True) - at_j))
    grad[rows] = g
    return grad
