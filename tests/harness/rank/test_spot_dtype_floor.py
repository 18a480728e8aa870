"""Issue 19: the spot check logs the student dtype's own share of the gradient tolerance
(``spot/grad_rel_l2_dtype_floor`` = 2x the rounding of the FP64 gradient to the student dtype, the rule of
``gkd_harness.harness.loss.tolerances.grad_tol``), so a BF16/BF16 fp32 run is judged against what BF16 can represent."""

from __future__ import annotations

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.contract import SPOT_GRAD_REL_L2, SPOT_GRAD_REL_L2_DTYPE_FLOOR
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.losses import make_gkd_loss_terms
from gkd_harness.harness.rank.instrument import build_metrics, spot_check

BETA, T = 0.5, 0.9


def _inputs(dtype, n=64, v=300, seed=7):
    g = torch.Generator().manual_seed(seed)
    s = (3 * torch.randn(1, n, v, generator=g, dtype=torch.float64)).to(dtype)
    t = (s.double() + 0.05 * torch.randn(1, n, v, generator=g, dtype=torch.float64)).to(dtype)
    labels = torch.ones(1, n, dtype=torch.long)
    return s, TeacherOutput(full_logits=t, labels=labels), labels


def test_bf16_bf16_floor_is_twice_the_bf16_rounding_of_the_independent_fp64_gradient():
    s, teacher, labels = _inputs(torch.bfloat16)
    vals = spot_check(
        make_gkd_loss_terms("fp32", "paper"),
        make_gkd_loss_terms("fp64", "paper"),
        s,
        teacher,
        labels,
        BETA,
        T,
        max_tokens=10_000,
    )
    total, n, ref_grad = reference_gkd(s, labels, BETA, T, teacher_full=teacher.full_logits)
    g64 = ref_grad.double()
    rounding = float((g64.to(torch.bfloat16).double() - g64).norm() / g64.norm())
    assert vals[SPOT_GRAD_REL_L2_DTYPE_FLOOR] > 1e-3  # BF16's rounding alone is beyond the flat 1e-3
    assert abs(vals[SPOT_GRAD_REL_L2_DTYPE_FLOOR] - 2 * rounding) <= 0.05 * 2 * rounding
    assert vals[SPOT_GRAD_REL_L2] <= 1e-3 + vals[SPOT_GRAD_REL_L2_DTYPE_FLOOR]  # the sign-off's allowance


def test_fp32_student_has_no_floor_and_the_metric_is_registered():
    s, teacher, labels = _inputs(torch.float32)
    vals = spot_check(
        make_gkd_loss_terms("fp32", "paper"),
        make_gkd_loss_terms("fp64", "paper"),
        s,
        teacher,
        labels,
        BETA,
        T,
        max_tokens=10_000,
    )
    assert vals[SPOT_GRAD_REL_L2_DTYPE_FLOOR] < 1e-6
    assert SPOT_GRAD_REL_L2_DTYPE_FLOOR in build_metrics()
