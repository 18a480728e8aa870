"""FP64 D(β): the β-curve runs the harness's own fp64 loss (gkd_harness.harness.losses); checked against the table in
docs/beta.md, the independent FP64 reference (harness/loss/reference.py) and ms-swift's upstream jsd_loss in FP64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gkd_harness.analysis.signoff.betacurve import (
    beta_defect_inputs,
    capture_inputs,
    endpoint_jumps,
    fp64_beta_curve,
    generalized_jsd_fp64,
)


def test_report001_table_reproduced():
    """The report's table (4 decimals): current = paper form, swapped = continuous form."""
    s, t = beta_defect_inputs()
    c = fp64_beta_curve(s, t, [0.0, 0.001, 0.1, 0.5, 0.9, 0.999, 1.0]).pivot(index="beta", columns="form", values="D")
    expected = {  # beta: (paper, continuous)
        0.0: (1.9262, 1.9262),
        0.001: (0.0019, 1.9069),
        0.1: (0.1454, 1.0605),
        0.5: (0.3492, 0.3492),
        0.9: (0.1474, 1.0635),
        0.999: (0.0020, 2.0119),
        1.0: (2.0450, 2.0450),
    }
    for beta, (paper, cont) in expected.items():
        assert round(c.loc[beta, "paper"], 4) == pytest.approx(paper, abs=1e-12)
        assert round(c.loc[beta, "continuous"], 4) == pytest.approx(cont, abs=1e-12)


def test_endpoint_jump_measured():
    s, t = beta_defect_inputs()
    jumps = endpoint_jumps(fp64_beta_curve(s, t)).set_index("form")
    # paper: D(0.999)/D(1) ~ 0.001 (the jump); continuous: close to 1
    assert jumps.loc["paper", "D(high)/D(1)"] == pytest.approx(0.000992, rel=1e-2)
    assert jumps.loc["paper", "D(low)/D(0)"] == pytest.approx(0.000995, rel=1e-2)
    assert jumps.loc["continuous", "D(high)/D(1)"] > 0.98
    assert jumps.loc["continuous", "D(low)/D(0)"] > 0.98


def _random_logits(seed=0, n=5, v=40):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, v, generator=g, dtype=torch.float64) * 2
    t = s + torch.randn(n, v, generator=g, dtype=torch.float64) * 0.7
    return s, t


@pytest.mark.parametrize("beta", [0.0, 0.001, 0.3, 0.5, 0.9, 0.999, 1.0])
def test_paper_form_matches_upstream_jsd_loss_in_fp64(beta):
    from swift.rlhf_trainers.gkd_loss import jsd_loss

    s, t = _random_logits()
    ours = generalized_jsd_fp64(s, t, beta, "paper", temperature=0.9).sum()
    upstream = jsd_loss(s / 0.9, t / 0.9, beta).item()
    assert ours == pytest.approx(upstream, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [0.0, 0.01, 0.5, 0.8, 1.0])
def test_matches_independent_reference(form, beta):
    from gkd_harness.harness.loss.reference import reference_jsd

    s, t = _random_logits(1)
    ours = generalized_jsd_fp64(s, t, beta, form, temperature=0.7)
    ref = reference_jsd(s, t, beta, form, temperature=0.7).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-15)


def test_is_the_harness_fp64_loss():
    """No second copy of the formula: the curve's value is gkd_harness.harness.losses' fp64 total, bit for bit."""
    from gkd_harness.harness.losses import make_jsd_loss

    s, t = _random_logits(4)
    for form in ("paper", "continuous"):
        total = make_jsd_loss("fp64", form)(s / 0.9, t / 0.9, 0.3).item()
        assert generalized_jsd_fp64(s, t, 0.3, form, 0.9).sum() == pytest.approx(total, rel=1e-15, abs=0)


def test_accepts_bf16_and_numpy_inputs_cast_exactly():
    s, t = _random_logits(5)
    sb, tb = s.bfloat16(), t.bfloat16()
    a = generalized_jsd_fp64(sb, tb, 0.9, "paper")
    b = generalized_jsd_fp64(sb.double().numpy(), tb.double().numpy(), 0.9, "paper")
    assert a.dtype == np.float64 and np.array_equal(a, b)


def test_forms_coincide_exactly_at_0_half_1():
    s, t = _random_logits(2)
    for beta in (0.0, 0.5, 1.0):
        assert np.array_equal(generalized_jsd_fp64(s, t, beta, "paper"), generalized_jsd_fp64(s, t, beta, "continuous"))


@pytest.mark.parametrize("topk", [None, 8])
def test_capture_inputs_match_harness_gkd_fp64(tmp_path, topk):
    """D(β) on a real capture file (gkd_harness.harness.store.captures) equals the harness' fp64 GKD loss / num_valid."""
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    from gkd_harness.harness.losses import make_gkd_loss
    from gkd_harness.harness.store.captures import load_capture, save_capture

    g = torch.Generator().manual_seed(3)
    student = torch.randn(2, 6, 32, generator=g)
    teacher = (student + 0.05 * torch.randn(2, 6, 32, generator=g)).bfloat16()
    labels = torch.randint(0, 32, (2, 6), generator=g)
    labels[0, :2] = -100
    if topk is None:
        out = TeacherOutput(full_logits=teacher, labels=labels.clone())  # see report: shared storage
    else:
        vals, ids = torch.topk(torch.log_softmax(teacher.float(), -1), topk, dim=-1)
        out = TeacherOutput(topk_logprobs=vals, topk_indices=ids, labels=labels.clone())
    path = save_capture(
        tmp_path / "step1_rank0.safetensors",
        student,
        out,
        labels,
        beta=0.9,
        temperature=0.8,
        meta={"beta_form": "paper"},
    )
    s, t, temp, beta = capture_inputs(load_capture(path))
    assert (temp, beta) == (0.8, 0.9)
    for form in ("paper", "continuous"):
        ours = generalized_jsd_fp64(s, t, beta, form, temp).mean()
        total, n = make_gkd_loss("fp64", form)(student, out, labels, beta, 0.8)
        assert ours == pytest.approx((total / n).item(), rel=1e-10)
