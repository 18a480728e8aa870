"""Higher-order derivatives (issue 40 item 18): upstream's loss can be differentiated twice; the fp32 and fp64
variants' fused closed-form gradient cannot, and say so in one error (before: a first-order gradient without a
graph, so a Hessian-vector product failed far from the cause, and a gradient penalty silently lost the loss's
part); ``jsd_per_position(..., recompute=True)`` supports it, checked against FP64 autograd."""

from __future__ import annotations

import pytest
import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.loss.reference import reference_jsd
from gkd_harness.harness.losses import jsd_per_position, make_gkd_loss


def _inputs(seed: int = 0, n: int = 6, v: int = 40):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, n, v, generator=g) * 2
    t = (s + 0.3 * torch.randn(1, n, v, generator=g)).bfloat16()
    labels = torch.zeros(1, n, dtype=torch.long)
    return s, TeacherOutput(full_logits=t, labels=labels), labels


@pytest.mark.parametrize("precision", ["fp32", "fp64"])
@pytest.mark.parametrize("form", ["paper", "continuous"])
def test_fused_variants_refuse_create_graph_in_one_line(precision, form):
    s, to, labels = _inputs()
    x = s.requires_grad_(True)
    total, n = make_gkd_loss(precision, form)(x, to, labels, 0.5, 0.9)
    with pytest.raises(RuntimeError, match="cannot be differentiated again .*recompute=True"):
        torch.autograd.grad(total / n, x, create_graph=True)
    # first order is unchanged
    total, n = make_gkd_loss(precision, form)(x, to, labels, 0.5, 0.9)
    (g,) = torch.autograd.grad(total / n, x)
    assert g.grad_fn is None and torch.isfinite(g).all()


def test_upstream_supports_create_graph():
    s, to, labels = _inputs()
    x = s.requires_grad_(True)
    total, n = make_gkd_loss("native", "paper")(x, to, labels, 0.5, 0.9)
    (g,) = torch.autograd.grad(total / n, x, create_graph=True)
    assert g.grad_fn is not None


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("form", ["paper", "continuous"])
def test_recompute_path_hessian_vector_product_matches_fp64(beta, form):
    """H·v of the total over 6 rows (2 row blocks: chunk_size=3 → 3-row blocks), FP32 student, BF16 teacher,
    against FP64 autograd's double backward through the reference formula."""
    s, to, _ = _inputs(seed=1)
    s2, t2 = s[0], to.full_logits[0]
    v = torch.randn(s2.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    x = s2.clone().requires_grad_(True)
    _, total = jsd_per_position(
        x, t2, beta, precision="fp32", beta_form=form, temperature=0.9, recompute=True, chunk_size=3
    )
    (g,) = torch.autograd.grad(total, x, create_graph=True)
    (hv,) = torch.autograd.grad((g * v.float()).sum(), x)

    xr = s2.double().clone().requires_grad_(True)
    total_ref = reference_jsd(xr, t2.double(), beta, form, 0.9).sum()
    (gr,) = torch.autograd.grad(total_ref, xr, create_graph=True)
    (hv_ref,) = torch.autograd.grad((gr * v).sum(), xr)
    assert float((g.detach().double() - gr.detach()).norm() / gr.norm()) < 1e-5
    assert float((hv.double() - hv_ref).norm() / hv_ref.norm()) < 1e-4


@pytest.mark.parametrize("beta_form,beta", [("continuous", 0.98), ("continuous", 0.9), ("paper", 0.5)])
def test_recompute_create_graph_first_order_gradient_on_unequal_widths_matches_fp64(beta_form, beta):
    """Issue 46 (item 7): ``recompute=True`` under ``create_graph=True`` with a 151,936-logit student against a
    152,064-logit teacher, confidently disagreeing rows at T = 0.05: the first-order gradient (the one the
    optimizer sees) within the FP32 bound of FP64 and finite, and it still carries its graph. Before, it was
    autograd's through the ψ form: 3.3e-2 / 3.4e-2 / 2.4e-3 relative L2 from FP64 (now 2.8e-7 … 5.2e-7)."""
    from gkd_harness.harness.loss.reference import _jsd_for_gradient
    from gkd_harness.harness.loss.tolerances import GRAD_REL_L2_FP32_STUDENT
    from tests.harness.loss.test_autograd_path import V_LARGE, V_SMALL, _confident_rows

    s_all, t = _confident_rows(V_LARGE)
    s = s_all[:, :V_SMALL].contiguous()
    x = s.clone().requires_grad_(True)
    _, total = jsd_per_position(
        x, t, beta, precision="fp32", beta_form=beta_form, temperature=0.05, recompute=True, align_vocab=True
    )
    (g,) = torch.autograd.grad(total, x, create_graph=True)
    assert g.grad_fn is not None
    s64 = torch.cat([s.double(), t[:, V_SMALL:].double()], -1).requires_grad_(True)  # upstream's alignment
    _jsd_for_gradient(s64, t.double(), beta, beta_form, 0.05).sum().backward()
    assert s64.grad is not None
    ref = s64.grad[:, :V_SMALL]
    assert bool(torch.isfinite(g).all())
    assert float((g.detach().double() - ref).norm() / ref.norm()) <= GRAD_REL_L2_FP32_STUDENT
