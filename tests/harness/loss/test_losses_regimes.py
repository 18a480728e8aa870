"""Issue 13's regimes: the checks the certificate's hard families do not already make.

The certificate (test_certificate.py: ``gkd-certify --strict`` on ``fp32`` and ``fp64``, both β forms) holds the
patched loss to the suite's tolerances in the hard regimes: logits of ±1e2 … ±1e4 and the issue's ±1e4 repro
("extreme logits"), β ∈ {1e-6, 1e-3, 0.999, 1 − 1e-6} ("beta near an endpoint"), FP16 students under a 2^16 loss
scale, partially −inf top-k rows, independent logits of std 10 and 30, vocab-sharded primitives and a BF16
gradient of ``total / num_valid``. What stays here (loss value ``1e-5·|ref| + 1e-6·N``, student-logit gradient
relative L2 ``1e-4`` for FP32 students, ``1e-4 + 2×`` the dtype's own rounding for BF16/FP16; the FP64 reference
``harness/loss/reference.py``):

1. shifted logits (a row offset of ±L: the ``|κ| > 8`` path) and T ∈ {1e-3, 100}, which no family has, each also
   never more than 2× less accurate than textbook FP32;
2. β = 1e-6 / 1 − 1e-6 on independent logits of std 8 against textbook FP32 (the issue's figures);
3. FP16 under a loss scale where a certificate case cannot go: the explicit ``recompute`` path, V = 32,768, and
   "no representable entry comes back 0";
4. partially −inf rows: reverse KL is +inf like the reference; ``native`` keeps upstream's NaN.
"""

import math

import pytest
import torch
from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.loss.reference import reference_gkd, reference_jsd
from gkd_harness.harness.loss.tolerances import (
    GRAD_REL_L2_AFTER_FP32_DIVISION,
    GRAD_REL_L2_FP32_STUDENT,
    grad_tol,
    loss_tol,
)
from gkd_harness.harness.losses import jsd_per_position, make_gkd_loss, make_jsd_loss
from tests.loss_cases import make_case, seed_of

LOSS_SCALE = 2.0**16


def _rel_l2(grad, ref):
    return float((grad.double() - ref).norm() / ref.norm())


def _jsd_and_grad(fn, s, t, beta):
    """(value, grad) of ``fn(s, t, beta)`` (a ``jsd_loss``) w.r.t. ``s``."""
    sg = s.clone().requires_grad_(True)
    val = fn(sg, t, beta)
    (g,) = torch.autograd.grad(val, sg)
    return float(val.detach()), g


def _ref_jsd_and_grad(s, t, beta, form):
    s64 = s.double().requires_grad_(True)
    val = reference_jsd(s64, t.double(), beta, form).sum()
    (g,) = torch.autograd.grad(val, s64)
    return float(val.detach()), g


# ------------------------------------------------------------------------------------- 1. scaled logits


def _shifted(scale: float, seed: int, rows: int = 16, vocab: int = 64):
    """Near-identical distributions whose logits carry a row offset of ``scale`` (student) and ``−scale``
    (teacher): ``t − s`` rounds at ulp(2·scale), the log-softmaxes do not."""
    g = torch.Generator().manual_seed(seed)
    base = 2 * torch.randn(rows, vocab, generator=g)
    return base + scale, base + 0.03 * torch.randn(rows, vocab, generator=g) - scale


#: β and form: the forms are identical at β ∈ {0, 0.5, 1}.
BETA_FORMS = [
    (0.0, "paper"),
    (1e-3, "paper"),
    (1e-3, "continuous"),
    (0.5, "paper"),
    (0.9, "paper"),
    (0.9, "continuous"),
    (1.0, "paper"),
]


@pytest.mark.parametrize("beta,form", BETA_FORMS)
@pytest.mark.parametrize("scale", [1.0, 300.0, 1e4])
def test_shifted_logits(scale, beta, form):
    """The certificate's "extreme logits" family has level logits ``L·(±1) + 2·randn``; shifted ones (|κ| = 2L)
    take the ``d = log T − log S`` rows, which it never reaches."""
    s, t = _shifted(scale, seed_of("scale", scale, "shifted"))
    n = s.shape[0]
    ref, ref_g = _ref_jsd_and_grad(s, t, beta, form)
    val, g = _jsd_and_grad(make_jsd_loss("fp32", form), s, t, beta)
    tb_val, _ = _jsd_and_grad(make_jsd_loss("native", form), s, t, beta)
    err, tb_err = abs(val - ref), abs(tb_val - ref)
    assert err <= loss_tol(ref, n), (val, ref)
    assert err <= max(2 * tb_err, 1e-6 * abs(ref)), (err, tb_err)
    assert val >= 0
    assert _rel_l2(g, ref_g) <= grad_tol(ref_g, torch.float32)


@pytest.mark.parametrize("near", [True, False])
@pytest.mark.parametrize(
    "beta,form",
    [
        (0.0, "paper"),
        (1e-6, "paper"),
        (1e-6, "continuous"),
        (0.5, "paper"),
        (1 - 1e-6, "paper"),
        (1 - 1e-6, "continuous"),
        (1.0, "paper"),
    ],
)
@pytest.mark.parametrize("temp", [1e-3, 100.0])
def test_extreme_temperatures(temp, beta, form, near):
    """Ordinary logits at T = 1e-3 (scaled logits of thousands, nearly one-hot rows) and T = 100.

    On the FP32 temperature-scaled tensors themselves (the ``jsd_loss`` contract) the suite's tolerances hold.
    Through ``gkd_loss`` the division by T = 1e-3 in FP32 rounds each scaled logit at ulp(|z/T|) ≈ 2.4e-4
    absolute before any loss arithmetic, which the FP64 reference (dividing in FP64) does not: the gradient
    then carries that input rounding (measured ≤ 2.8e-4; textbook FP32 up to 0.71), checked against the issue's
    1e-3 bound (``GRAD_REL_L2_AFTER_FP32_DIVISION``, value: the issue's ``1e-4·|ref| + 2e-6·N``).

    Distinct distributions at T = 1e-3 make every row one-hot with the teacher's mass elsewhere: the exact
    gradient is ~1e-22 (mpmath, 60 digits, gives ±4.17e-22 on such a row) and FP64 autograd returns ±7.1e-16
    there, so the FP64 reference cannot judge the gradient; only the value is checked for those.
    """
    pair = ("fp32", "bf16")
    case = make_case(*pair, "full", near, seed_of("temp", pair, temp, beta, form, near))
    # 1. the loss on the FP32-scaled tensors, against FP64 on exactly those tensors
    scaled = (case.student.float() / temp, case.teacher.full_logits.float() / temp)
    ref_total, n, ref_grad = reference_gkd(scaled[0], case.labels, beta, 1.0, form, teacher_full=scaled[1])
    s = scaled[0].clone().requires_grad_(True)
    total, num = make_gkd_loss("fp32", form)(
        s, TeacherOutput(full_logits=scaled[1], labels=case.labels), case.labels, beta, 1.0
    )
    (total / num).backward()
    assert abs(float(total) - ref_total) <= loss_tol(ref_total, n), (float(total), ref_total)
    assert float(total) >= 0
    assert bool(torch.isfinite(s.grad).all())
    judge_grad = near or temp > 1
    if judge_grad:
        assert _rel_l2(s.grad, ref_grad) <= grad_tol(ref_grad, s.dtype)
    # 2. gkd_loss dividing by T itself, against FP64 dividing exactly
    ref_total, n, ref_grad = reference_gkd(case.student, case.labels, beta, temp, form, **case.ref_kwargs)
    s = case.student.clone().requires_grad_(True)
    total, num = make_gkd_loss("fp32", form)(s, case.teacher, case.labels, beta, temp)
    (total / num).backward()
    if temp < 1:
        assert abs(float(total) - ref_total) <= 1e-4 * abs(ref_total) + 2e-6 * n, (float(total), ref_total)
    else:
        assert abs(float(total) - ref_total) <= loss_tol(ref_total, n), (float(total), ref_total)
    bound = GRAD_REL_L2_AFTER_FP32_DIVISION - GRAD_REL_L2_FP32_STUDENT if temp < 1 else 0.0
    if judge_grad:
        assert _rel_l2(s.grad, ref_grad) <= grad_tol(ref_grad, s.dtype) + bound


# -------------------------------------------------------------------------------- 2. β near an endpoint


@pytest.mark.parametrize(
    "beta,form", [(1e-6, "continuous"), (1 - 1e-6, "paper"), (1e-6, "paper"), (1 - 1e-6, "continuous")]
)
def test_issue_repro_beta_endpoints_vs_textbook(beta, form):
    """Issue figures: continuous at β=1e-6 was 5.6e-4 relative off FP64; paper at β=1−1e-6 had a 2.1e-3
    logit-gradient error. On independent logits of std 8 the code before the fix measured 2.1e-4 and 4.0e-3.
    Both must now be within tolerance and no worse than 2× textbook FP32."""
    g = torch.Generator().manual_seed(2)
    s = torch.randn(8, 96, generator=g) * 8
    t = torch.randn(8, 96, generator=g) * 8
    ref, ref_g = _ref_jsd_and_grad(s, t, beta, form)
    val, grad = _jsd_and_grad(make_jsd_loss("fp32", form), s, t, beta)
    tb_val, tb_grad = _jsd_and_grad(make_jsd_loss("native", form), s, t, beta)
    assert abs(val - ref) <= loss_tol(ref, 8)
    assert abs(val - ref) <= max(2 * abs(tb_val - ref), 1e-6 * abs(ref))
    assert _rel_l2(grad, ref_g) <= 1e-4
    assert _rel_l2(grad, ref_g) <= max(2 * _rel_l2(tb_grad, ref_g), 1e-6)


# ---------------------------------------------------------------------------- 3. FP16 under a loss scale


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fp16_student_under_loss_scale_recompute(beta):
    """``(total / N) · 2^16`` backward through ``jsd_per_position(recompute=True)`` (a switch the certificate cannot
    reach; its "FP16 under loss scaling" family covers the default path, full vocabulary and top-k): FP16 gradient
    entries FP16 can represent must not come back as 0."""
    case = make_case("fp16", "fp16", "full", True, seed_of("fp16-scale", beta, "full"))
    ref_total, n, ref_grad = reference_gkd(case.student, case.labels, beta, 0.9, "paper", **case.ref_kwargs)
    ref_grad = ref_grad * LOSS_SCALE
    s = case.student.clone().requires_grad_(True)
    rows = case.labels != -100
    _, total = jsd_per_position(
        s[rows], case.teacher.full_logits[rows], beta, precision="fp32", temperature=0.9, recompute=True
    )
    (total / n * LOSS_SCALE).backward()
    assert s.grad.dtype == torch.float16
    representable = ref_grad.half() != 0
    zeroed = float(((s.grad == 0) & representable).sum()) / float(representable.sum())
    assert zeroed <= 0.01, zeroed
    assert _rel_l2(s.grad, ref_grad) <= grad_tol(ref_grad, torch.float16)


def test_issue_repro_fp16_loss_scale_65536():
    """Issue figure: at loss scale 65536 about 85 % of representable entries came back 0 (rel-L2 5.5e-2)."""
    g = torch.Generator().manual_seed(3)
    st = (torch.randn(1, 40, 96, generator=g) * 2).half()
    te = (st.float() + 0.03 * torch.randn(1, 40, 96, generator=g)).half()
    labels = torch.zeros(1, 40, dtype=torch.long)
    s = st.clone().requires_grad_(True)
    total, n = make_gkd_loss("fp32", "paper")(s, TeacherOutput(full_logits=te, labels=labels), labels, 0.5, 0.9)
    (total / n * 65536.0).backward()
    ref_grad = reference_gkd(st, labels, 0.5, 0.9, teacher_full=te)[2] * 65536.0
    floor = _rel_l2(ref_grad.half(), ref_grad)
    assert _rel_l2(s.grad, ref_grad) <= 2 * floor
    representable = ref_grad.half() != 0
    assert float(((s.grad == 0) & representable).sum()) == 0


def test_fp16_student_large_vocab_under_loss_scale():
    """V = 32768: most ∂JSD/∂z entries lie below FP16's smallest subnormal before the loss scale multiplies
    them (the code before the fix returned 63 % of the representable entries as 0, rel-L2 5.7e-3)."""
    g = torch.Generator().manual_seed(3)
    st = (torch.randn(1, 8, 32768, generator=g) * 2).half()
    te = (st.float() + 0.03 * torch.randn(1, 8, 32768, generator=g)).half()
    labels = torch.zeros(1, 8, dtype=torch.long)
    s = st.clone().requires_grad_(True)
    total, n = make_gkd_loss("fp32", "paper")(s, TeacherOutput(full_logits=te, labels=labels), labels, 0.5, 0.9)
    (total / n * LOSS_SCALE).backward()
    ref_grad = reference_gkd(st, labels, 0.5, 0.9, teacher_full=te)[2] * LOSS_SCALE
    representable = ref_grad.half() != 0
    assert float(((s.grad == 0) & representable).sum()) / float(representable.sum()) <= 0.001
    assert _rel_l2(s.grad, ref_grad) <= 2 * _rel_l2(ref_grad.half(), ref_grad)


# ------------------------------------------------------------------------ 4. partially −inf top-k rows

ISSUE_LP = [[[-0.1, -2.4, float("-inf")]]]


def _partial_inf_case(student):
    lp = torch.tensor(ISSUE_LP)
    idx = torch.tensor([[[0, 1, 2]]])
    labels = torch.zeros(1, 1, dtype=torch.long)
    return lp, idx, labels, TeacherOutput(topk_logprobs=lp, topk_indices=idx, labels=labels)


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_partially_minus_inf_reverse_kl_is_infinite_like_the_reference(precision):
    """β = 1 is KL(S‖T), +inf when the teacher gives probability 0 where the student does not: the exact value."""
    lp, idx, labels, teacher = _partial_inf_case(None)
    student = torch.tensor([[[1.0, 0.5, -0.3]]])
    ref_total = reference_gkd(student, labels, 1.0, 1.0, teacher_topk=(lp, idx))[0]
    total, _ = make_gkd_loss(precision, "paper")(student, teacher, labels, 1.0, 1.0)
    assert ref_total == math.inf and float(total) == math.inf


def test_native_keeps_upstreams_nan_on_partially_minus_inf_rows():
    """``native``/``paper`` is the installed ms-swift function; its NaN here is documented, not changed."""
    student = torch.tensor([[[1.0, 0.5, -0.3]]])
    lp, idx, labels, teacher = _partial_inf_case(student)
    assert make_gkd_loss("native", "paper") is upstream.gkd_loss
    for beta in (0.0, 0.5):
        assert math.isnan(float(upstream.gkd_loss(student, teacher, labels, beta, 1.0)[0]))
