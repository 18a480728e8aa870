"""Issue 13: the four regimes where the patched loss used to be less accurate than it should be.

Each family is checked against the independent FP64 reference in ``harness/loss/reference.py`` (log-space mixture,
``0·log 0 = 0``) with the suite's tolerances (``harness/loss/tolerances.py``): loss value ``1e-5·|ref| + 1e-6·N``,
student-logit gradient relative L2 ``1e-4`` for FP32 students, and ``1e-4 + 2×`` the dtype's own rounding of the
reference gradient for BF16/FP16 students. Where it is meaningful the patched value is also compared with the
textbook formula in FP32 on the same inputs (upstream's arithmetic, ``native``): never more than 2× less
accurate, above FP32's own rounding (1e-6 relative).

1. scaled logits in the thousands (logits ±1e4 at T = 1, a logit-scale sweep 1 … 1e4, ordinary logits at
   T ∈ {1e-3, 100});
2. β within 1e-6 of an endpoint, both forms;
3. FP16 students under a loss scale of 2^16 (the fused path stores ∂JSD/∂z before the scale reaches it);
4. top-k rows in which some, not all, teacher log-probs are −inf (upstream: NaN; exact: finite, 0·log 0 = 0).
"""
import math

import pytest
import torch

from harness.losses import jsd_per_position, make_gkd_loss, make_gkd_loss_terms, make_jsd_loss
from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers.gkd_loss import TeacherOutput
from tests.loss_cases import make_case, seed_of
from harness.loss.reference import reference_gkd, reference_jsd
from harness.loss.tolerances import GRAD_REL_L2_AFTER_FP32_DIVISION, GRAD_REL_L2_FP32_STUDENT, grad_tol, loss_tol

LOSS_SCALE = 2.0**16


def _rel_l2(grad, ref):
    return float((grad.double() - ref).norm() / ref.norm())


def _jsd_and_grad(fn, s, t, beta):
    """(value, grad) of ``fn(s, t, beta)`` (a ``jsd_loss``) w.r.t. ``s``."""
    sg = s.clone().requires_grad_(True)
    val = fn(sg, t, beta)
    (g, ) = torch.autograd.grad(val, sg)
    return float(val.detach()), g


def _ref_jsd_and_grad(s, t, beta, form):
    s64 = s.double().requires_grad_(True)
    val = reference_jsd(s64, t.double(), beta, form).sum()
    (g, ) = torch.autograd.grad(val, s64)
    return float(val.detach()), g


# ------------------------------------------------------------------------------------- 1. scaled logits


@pytest.mark.parametrize("form", ["paper", "continuous"])
def test_issue_repro_logits_1e4(form):
    """The issue's repro: s = [1e4, 1e4, -1e4, -1e4], t = [-1e4, 1e4, 1e4, -1e4], β = 0 gave 9997.878 (exact 1e4)."""
    s = torch.tensor([[1e4, 1e4, -1e4, -1e4]])
    t = torch.tensor([[-1e4, 1e4, 1e4, -1e4]])
    val, _ = _jsd_and_grad(make_jsd_loss("fp32", form), s, t, 0.0)
    ref = float(reference_jsd(s, t, 0.0, form).sum())
    assert ref == pytest.approx(1e4, rel=1e-12)
    assert abs(val - ref) <= loss_tol(ref, 1), val
    for beta in (0.5, 1.0, 1e-6):
        val, _ = _jsd_and_grad(make_jsd_loss("fp32", form), s, t, beta)
        ref = float(reference_jsd(s, t, beta, form).sum())
        assert abs(val - ref) <= loss_tol(ref, 1), (beta, val, ref)


def _levels(scale: float, seed: int, rows: int = 16, vocab: int = 64):
    """Logits ``scale·b + 2·randn`` with ``b ∈ {−1, +1}``; the teacher flips 20 % of the levels.

    At every scale each row keeps several entries within O(1) of its maximum, so the distributions (and their
    gradients) stay non-degenerate while the logits reach ±scale.
    """
    g = torch.Generator().manual_seed(seed)
    bs = torch.randint(0, 2, (rows, vocab), generator=g).float() * 2 - 1
    bt = torch.where(torch.rand(rows, vocab, generator=g) < 0.2, -bs, bs)
    s = scale * bs + 2 * torch.randn(rows, vocab, generator=g)
    t = scale * bt + 2 * torch.randn(rows, vocab, generator=g)
    return s, t


def _shifted(scale: float, seed: int, rows: int = 16, vocab: int = 64):
    """Near-identical distributions whose logits carry a row offset of ``scale`` (student) and ``−scale``
    (teacher): ``t − s`` rounds at ulp(2·scale), the log-softmaxes do not."""
    g = torch.Generator().manual_seed(seed)
    base = 2 * torch.randn(rows, vocab, generator=g)
    return base + scale, base + 0.03 * torch.randn(rows, vocab, generator=g) - scale


SCALES = [1.0, 10.0, 100.0, 300.0, 1e3, 3e3, 1e4]


@pytest.mark.parametrize("family", ["levels", "shifted"])
@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [0.0, 1e-3, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("scale", SCALES)
def test_logit_scale_sweep(scale, beta, form, family):
    s, t = (_levels if family == "levels" else _shifted)(scale, seed_of("scale", scale, family))
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
@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [0.0, 1e-6, 0.5, 1 - 1e-6, 1.0])
@pytest.mark.parametrize("temp", [1e-3, 100.0])
@pytest.mark.parametrize("pair", [("fp32", "fp32"), ("fp32", "bf16")])
def test_extreme_temperatures(pair, temp, beta, form, near):
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
    case = make_case(*pair, "full", near, seed_of("temp", pair, temp, beta, form, near))
    # 1. the loss on the FP32-scaled tensors, against FP64 on exactly those tensors
    scaled = (case.student.float() / temp, case.teacher.full_logits.float() / temp)
    ref_total, n, ref_grad = reference_gkd(scaled[0], case.labels, beta, 1.0, form, teacher_full=scaled[1])
    s = scaled[0].clone().requires_grad_(True)
    total, num = make_gkd_loss("fp32", form)(s, TeacherOutput(full_logits=scaled[1], labels=case.labels),
                                             case.labels, beta, 1.0)
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


@pytest.mark.parametrize("mode", ["full", "topk"])
@pytest.mark.parametrize("noise", [0.03, 1.0, 8.0])
@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [1e-6, 1 - 1e-6])
@pytest.mark.parametrize("pair", [("fp32", "bf16"), ("fp32", "fp32"), ("bf16", "bf16")])
def test_beta_within_1e6_of_an_endpoint(pair, beta, form, noise, mode):
    """Teacher = student + noise·randn; noise 8 puts teacher mass where the student has e^-14 or less (the
    mixture ratio M/T ≈ β: ``1 + u`` cancels in the ψ form)."""
    case = make_case(*pair, mode, noise == 0.03, seed_of("beta-end", pair, beta, form, noise, mode),
                     noise_far=noise)
    ref_total, n, ref_grad = reference_gkd(case.student, case.labels, beta, 0.9, form, **case.ref_kwargs)
    s = case.student.clone().requires_grad_(True)
    total, num = make_gkd_loss("fp32", form)(s, case.teacher, case.labels, beta, 0.9)
    (total / num).backward()
    assert abs(float(total) - ref_total) <= loss_tol(ref_total, n), (float(total), ref_total)
    assert _rel_l2(s.grad, ref_grad) <= grad_tol(ref_grad, s.dtype)


@pytest.mark.parametrize("beta,form", [(1e-6, "continuous"), (1 - 1e-6, "paper"), (1e-6, "paper"),
                                       (1 - 1e-6, "continuous")])
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


# the recompute switch is a jsd_per_position argument: it is exercised on the full vocabulary only
@pytest.mark.parametrize("mode,recompute", [("full", None), ("topk", None), ("full", True)])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fp16_student_under_loss_scale(beta, mode, recompute):
    """``(total / N) · 2^16`` backward: FP16 gradient entries FP16 can represent must not come back as 0."""
    case = make_case("fp16", "fp16", mode, True, seed_of("fp16-scale", beta, mode))
    ref_total, n, ref_grad = reference_gkd(case.student, case.labels, beta, 0.9, "paper", **case.ref_kwargs)
    ref_grad = ref_grad * LOSS_SCALE
    s = case.student.clone().requires_grad_(True)
    if recompute:
        rows = case.labels != -100
        _, total = jsd_per_position(s[rows], case.teacher.full_logits[rows], beta, precision="fp32",
                                    temperature=0.9, recompute=True)
    else:
        total, _ = make_gkd_loss("fp32", "paper")(s, case.teacher, case.labels, beta, 0.9)
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


@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [0.0, 1e-6, 0.5, 0.9, 1 - 1e-6])
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_issue_repro_partially_minus_inf_topk_row(precision, beta, form):
    """Some (not all) teacher log-probs −inf: finite, exact value (0·log 0 = 0) and finite gradients."""
    student = torch.tensor([[[1.0, 0.5, -0.3]]])
    lp, idx, labels, teacher = _partial_inf_case(student)
    ref_total, ref_n, ref_grad = reference_gkd(student, labels, beta, 1.0, form, teacher_topk=(lp, idx))
    assert math.isfinite(ref_total)
    s = student.clone().requires_grad_(True)
    total, n = make_gkd_loss(precision, form)(s, teacher, labels, beta, 1.0)
    (total / n).backward()
    assert math.isfinite(float(total)) and float(total) >= 0
    assert abs(float(total) - ref_total) <= loss_tol(ref_total, 1)
    assert bool(torch.isfinite(s.grad).all())
    assert _rel_l2(s.grad, ref_grad) <= grad_tol(ref_grad, s.dtype)


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


@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [0.0, 1e-3, 0.5, 0.999])
@pytest.mark.parametrize("precision", ["fp32", "fp64"])
def test_partially_minus_inf_rows_in_a_batch(precision, beta, form):
    """A realistic top-k batch where some positions have trailing −inf log-probs (fewer than k candidates)."""
    case = make_case("fp32", "bf16", "topk", True, seed_of("partial-inf", beta, form))
    lp = case.teacher.topk_logprobs.clone()
    lp[0, 5, 10:] = float("-inf")
    lp[1, 7, 1:] = float("-inf")
    lp[1, 9] = float("-inf")  # a fully -inf row is still dropped
    teacher = TeacherOutput(topk_logprobs=lp, topk_indices=case.teacher.topk_indices, labels=case.labels)
    ref_total, ref_n, ref_grad = reference_gkd(case.student, case.labels, beta, 0.9, form,
                                               teacher_topk=(lp, case.teacher.topk_indices))
    s = case.student.clone().requires_grad_(True)
    terms = make_gkd_loss_terms(precision, form)(s, teacher, case.labels, beta, 0.9)
    assert int(terms.num_valid) == ref_n
    assert bool(torch.isfinite(terms.per_position).all())
    assert abs(float(terms.total) - ref_total) <= loss_tol(ref_total, ref_n)
    (terms.total / terms.num_valid).backward()
    assert bool(torch.isfinite(s.grad).all())
    assert _rel_l2(s.grad, ref_grad) <= grad_tol(ref_grad, s.dtype)
