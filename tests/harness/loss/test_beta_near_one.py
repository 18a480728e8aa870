"""The continuous form at β = 1 − 1e-12 (issue 46, item 7): every row's gradient against the FP64 reference.

At β this close to 1 the shifted elements of the continuous form's gradient (the teacher's share vanishing) meet
``w = e^(d + log(β/(1−β)))`` in the hundred thousands on ordinary rows, where ``z = w/(w+2)`` rounds at ulp(1) in
FP32 and ``atanh z`` with it: one top-k row was 1.0e-2 (relative L2) from FP64 before (8.2e-3 in the issue; the
textbook formula 4.5e-6), now 7e-6. Reference: ``harness/loss/reference.py`` (FP64 autograd of its own form).
"""

import pytest
import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import GRAD_REL_L2_FP32_STUDENT, loss_tol
from gkd_harness.harness.losses import make_gkd_loss

N, V, K = 8, 512, 64


def _inputs(seed: int):
    """``(student [1, N, V] fp32 of BF16 values, teacher top-k log-probs [1, N, K] bf16, ids, full teacher bf16)``:
    independent logits of std 4 (at T = 0.3 the student's and teacher's shares of a token differ by e^±50)."""
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(1, N, V, generator=g) * 4).bfloat16().float()
    t = torch.randn(1, N, V, generator=g) * 4
    lp, ids = torch.log_softmax(t, -1).topk(K, -1)
    return s, lp.bfloat16(), ids, t.bfloat16()


@pytest.mark.parametrize("teacher", ["topk", "full"])
@pytest.mark.parametrize("beta", [1 - 1e-12, 1 - 1e-9, 1 - 1e-6])
@pytest.mark.parametrize("seed", [4, 16])
def test_continuous_beta_next_to_one_every_row_matches_fp64(seed, beta, teacher):
    s, lp, ids, t_full = _inputs(seed)
    labels = torch.zeros(1, N, dtype=torch.long)
    if teacher == "topk":
        to, ref_teacher = TeacherOutput(topk_logprobs=lp, topk_indices=ids, labels=labels), {"teacher_topk": (lp, ids)}
    else:
        to, ref_teacher = TeacherOutput(full_logits=t_full, labels=labels), {"teacher_full": t_full}
    x = s.clone().requires_grad_(True)
    total, n = make_gkd_loss("fp32", "continuous")(x, to, labels, beta, 0.3)
    (total / n).backward()
    ref_total, ref_n, ref_grad = reference_gkd(s, labels, beta, 0.3, "continuous", **ref_teacher)
    assert int(n) == ref_n and abs(float(total.detach()) - ref_total) <= loss_tol(ref_total, ref_n)
    assert x.grad is not None
    rows = (x.grad[0].double() - ref_grad[0]).norm(dim=-1) / ref_grad[0].norm(dim=-1)
    assert float(rows.max()) <= GRAD_REL_L2_FP32_STUDENT, rows.tolist()
