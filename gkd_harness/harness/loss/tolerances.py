"""Every numerical tolerance of the loss suite, in one place, with the measurement behind it.

Measured on this CPU (torch 2.13.0) by `python scripts/measure_tolerances.py` over the loss-suite grid
(β ∈ {0, 1e-3, 0.1, 0.5, 0.9, 0.999, 1} × T ∈ {0.5, 0.9, 1, 2} × paper/continuous × full/top-k ×
near-identical/distinct distributions, 42 active positions of V = 96) for the *fp32* variant against the
independent FP64 reference in ``harness/loss/reference.py``:

    inputs (student/teacher)   max |Δloss|/|ref|   max |Δloss|/N    max grad rel-L2
    fp32 / bf16                1.7e-06             3.1e-07          7.4e-06
    fp32 / fp32                1.5e-06             1.4e-07          6.0e-06
    bf16 / bf16                5.2e-07             2.7e-07          2.8e-03  (bf16 gradient dtype)
    fp16 / fp16                3.7e-07             2.1e-07          0.97     (fp16 gradients underflow)
    fp64 / fp64, fp64 / bf16   2.2e-10             5.1e-16          1.3e-11

(The textbook formula in FP32, as first written, measured 5e-05 relative and 5e-3 gradient error on the
same grid, at β = 1e-3 with near-identical distributions: hence the cancellation-free form in
``gkd_harness.harness.loss.stable._jsd_stable``. Under TP/CP with injected vocab-parallel primitives, then on the textbook
formula, tests/harness/loss/test_losses_parallel.py measured ≤ 1.1e-7 per position and ≤ 9.1e-6 gradient error;
they take the cancellation-free form since issue 22, see docs/loss_accuracy.md.)

Issue 13's regimes (tests/harness/loss/test_losses_regimes.py; `python scripts/measure_tolerances.py --regimes`): logit
scale swept 1 … 1e4 ≤ 1.5e-7 relative / 4.0e-7 gradient (levels) and ≤ 1.2e-6 / 3.7e-6 (shifted logits; textbook
FP32 0.11–0.16 relative); β = 1e-6 / 1 − 1e-6 on logits of std 8: 1.5e-7 / 1.0e-6; FP16 students under a loss
scale of 2^16: within 2× FP16's own rounding of the gradient; partially −inf top-k rows: exact.

A pure relative bound is not reachable in FP32 where the loss is ~1e-7 per position (near-identical
distributions, or the paper form at β = 1e-3), so value tolerances are ``rtol·|ref| + atol·N``.
"""

from typing import Optional

import torch

# Loss value: |loss_total − ref_total| ≤ LOSS_RTOL·|ref_total| + LOSS_ATOL_PER_POSITION·N.
# Measured maxima 1.7e-6 relative and 3.1e-7 per position: 6× and 3× headroom.
LOSS_RTOL = 1e-5
LOSS_ATOL_PER_POSITION = 1e-6

# Gradient w.r.t. the student logits, relative L2 against FP64, FP32 (or wider) student.
# Measured maximum 9.1e-6 (TP) / 7.4e-6 (single process): 10× headroom, a tenth of the 1e-3 acceptance bound.
GRAD_REL_L2_FP32_STUDENT = 1e-4

# gkd_loss at T = 1e-3: dividing ordinary logits by T in FP32 rounds each scaled logit at ulp(|z/T|) ≈ 2.4e-4
# before any loss arithmetic (the reference divides in FP64). Measured ≤ 2.8e-4 gradient error (textbook FP32:
# up to 0.71); on the FP32-scaled tensors themselves the fp32 loss meets GRAD_REL_L2_FP32_STUDENT. Bound: the issue's
# acceptance bound for FP32 students, 1e-3.
GRAD_REL_L2_AFTER_FP32_DIVISION = 1e-3

# FP64 path against the FP64 reference (different but exact formulas): measured 1.5e-10 / 1.3e-11.
FP64_RTOL = 1e-9
FP64_GRAD_REL_L2 = 1e-9

# A BF16/FP16 student's gradient is rounded to its own dtype. Its error is bounded by the rounding of the
# FP64 gradient to that dtype (measured exactly per case) times this factor, plus the FP32 bound.
LOW_PRECISION_GRAD_FACTOR = 2.0

# A BF16 student's gradient of total / num_valid (num_valid not a power of two) rounded once to BF16: within this
# factor of the rounding of the FP64 gradient to BF16 (issue 30; the certificate's "BF16 gradient of total /
# num_valid" family). Rounded twice (stored in BF16, then scaled) measured 1.47x (total/60) and 1.50x (total/3).
ONE_ROUNDING_GRAD_FACTOR = 1.1


def loss_tol(ref_total: float, n: int) -> float:
    """Allowed |loss_total − ref_total| for ``n`` active positions."""
    return LOSS_RTOL * abs(ref_total) + LOSS_ATOL_PER_POSITION * n


def grad_tol(ref_grad: torch.Tensor, student_dtype: torch.dtype, factor: Optional[float] = None) -> float:
    """Allowed relative L2 error of the student-logit gradient for a student of ``student_dtype``.

    The gradient is returned in the student's dtype, so the bound is ``GRAD_REL_L2_FP32_STUDENT`` plus
    ``LOW_PRECISION_GRAD_FACTOR`` times the rounding of the FP64 reference to that dtype. For an FP32 student
    that rounding is ~6e-8 (negligible) unless the gradient itself lies in FP32's subnormal range (|g| < 1.2e-38,
    e.g. nearly one-hot rows at T = 1e-3 with disjoint argmaxes), where no FP32 arithmetic can do better.
    ``factor`` replaces ``LOW_PRECISION_GRAD_FACTOR`` (``ONE_ROUNDING_GRAD_FACTOR``: rounded once).
    """
    if student_dtype == torch.float64:
        return GRAD_REL_L2_FP32_STUDENT
    ref = ref_grad.double()
    rounding = float((ref.to(student_dtype).double() - ref).norm() / ref.norm())
    return GRAD_REL_L2_FP32_STUDENT + (LOW_PRECISION_GRAD_FACTOR if factor is None else factor) * rounding
