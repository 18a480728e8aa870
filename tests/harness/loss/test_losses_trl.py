"""TRL's pinned tests of ``GKDTrainer.generalized_jsd_loss``: what the certificate's pins cannot say.

Source: huggingface/trl ``tests/test_gkd_trainer.py``, class ``TestGeneralizedJSDLoss`` (commit 06c79aba). TRL's
pins (uniform and identical inputs give 0, the β = 0 / 1 edge cases equal the KLs, β = 0 and 1 differ, T = 1 and 2
differ, β = 0.1 is not symmetric, β = 0.5 is symmetric bit for bit) are cases of the certificate's "pinned (TRL
style)" family, which test_certificate.py runs on ``fp32`` and ``fp64`` in both β forms. Kept here: TRL's
reductions, which only the ``jsd_loss`` / ``jsd_per_position`` API has, and the bit-exact symmetry at β = 0.5 on
inputs larger than TRL's 2×3×5 (several row blocks), which a tolerance cannot express.

Convention mapping (TRL → this harness):

* **Argument order and β**: the same. ``generalized_jsd_loss(student, teacher, beta=β)`` and
  ``jsd_loss(s, t, β)`` both take the student first; β = 0 is KL(teacher‖student), β = 1 is KL(student‖teacher).
* **Shapes**: TRL takes ``[B, S, V]``; ``jsd_loss`` takes ``[N, V]`` rows, so inputs are reshaped to
  ``[B·S, V]``.
* **Temperature**: TRL divides by ``temperature`` inside; ``jsd_loss`` receives temperature-scaled logits (its
  caller, ``gkd_loss``, divides), so the port passes ``logits / T``.
* **Reduction**: ``jsd_loss`` returns the unnormalised sum over positions. TRL's default ``"batchmean"`` without
  labels is ``sum / B``, so the port divides by ``B``; ``"sum"`` is the raw sum; ``"mean"`` is
  ``sum / (B·S·V)``. TRL's ``"none"`` returns per-entry terms ``[B, S, V]``; the harness exposes per-position
  values (``jsd_per_position``, ``[N]``), which the port checks instead.
"""

import pytest
import torch

from gkd_harness.harness.losses import jsd_per_position, make_jsd_loss

PRECISIONS = ["fp32", "fp64"]
BATCH, SEQ, VOCAB = 2, 3, 5


def trl_generalized_jsd(precision, student_logits, teacher_logits, beta=0.5, temperature=1.0, reduction="batchmean"):
    """TRL's ``generalized_jsd_loss(student, teacher, labels=None, beta, temperature, reduction)`` expressed with
    ``make_jsd_loss(precision, "paper")`` (see the module docstring for the mapping)."""
    b, _, v = student_logits.shape
    dtype = torch.float64 if precision == "fp64" else student_logits.dtype
    s = (student_logits / temperature).reshape(-1, v).to(dtype)
    t = (teacher_logits / temperature).reshape(-1, v).to(dtype)
    if reduction == "none":
        return jsd_per_position(s, t, beta, precision=precision, beta_form="paper")[0]
    total = make_jsd_loss(precision, "paper")(s, t, beta)
    if reduction == "batchmean":
        return total / b
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / student_logits.numel()
    raise ValueError(reduction)


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(BATCH, SEQ, VOCAB, generator=g), torch.randn(BATCH, SEQ, VOCAB, generator=g))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_reduction_methods(precision, logits):
    loss_batchmean = trl_generalized_jsd(precision, *logits, reduction="batchmean")
    loss_sum = trl_generalized_jsd(precision, *logits, reduction="sum")
    loss_mean = trl_generalized_jsd(precision, *logits, reduction="mean")
    loss_none = trl_generalized_jsd(precision, *logits, reduction="none")
    assert loss_batchmean.shape == torch.Size([])
    assert loss_sum.shape == torch.Size([])
    assert loss_mean.shape == torch.Size([])
    assert loss_none.shape == (BATCH * SEQ,)  # per position (TRL: per entry, [B, S, V])
    assert float(loss_sum) == pytest.approx(float(loss_batchmean) * BATCH, rel=1e-6)
    assert float(loss_none.sum()) == pytest.approx(float(loss_sum), rel=1e-6)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("seed", range(4))
def test_symmetry_at_half_is_bit_exact_on_larger_inputs(precision, seed):
    """Beyond TRL's 2×3×5 case: swapping student and teacher at β = 0.5 gives the identical bits (and at the
    full vocabulary path, several chunks)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, 40, 1500, generator=g) * 3
    t = s + torch.randn(1, 40, 1500, generator=g) * (0.03 if seed % 2 else 1.0)
    assert torch.equal(trl_generalized_jsd(precision, s, t), trl_generalized_jsd(precision, t, s))
