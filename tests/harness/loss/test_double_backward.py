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
