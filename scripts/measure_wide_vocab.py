"""Figures of issue 22's reproductions 1–3 at a wide vocabulary (run it on a tree to measure that tree; nothing
here asserts).

    python scripts/measure_wide_vocab.py [--mp]

* R1a/R1b: V = 151,936, 16 positions, Megatron's TP=1 primitives (``F.log_softmax`` and the textbook KL, as
  ``vocab_parallel_log_softmax`` / ``vocab_parallel_kl_div`` are at TP=1: distinct function objects);
* R2: the default path, student and teacher confident on different tokens (FP32 student / BF16 teacher);
* R3: super-confident rows (dominant logit +25, T = 0.3): the spot check's ``grad_rel_l2`` (fp32 against the
  ``fp64`` variant) and fp32's true error against mpmath.

References: ``gkd_harness.harness.loss.reference`` (FP64) and, with ``--mp``, the mpmath row reference of
``tests/harness/loss/mp_reference.py`` on the worst rows (25 s per row at this width).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/ holds the mpmath reference

from swift.rlhf_trainers.gkd_loss import TeacherOutput  # noqa: E402

from gkd_harness.harness.loss.reference import reference_gkd  # noqa: E402
from gkd_harness.harness.losses import make_gkd_loss_terms  # noqa: E402

V = 151_936


def megatron_tp1_log_softmax(x):
    """``vocab_parallel_log_softmax`` at TP=1."""
    return F.log_softmax(x, dim=-1)


def megatron_tp1_kl_div(input_log, target_log):
    """``vocab_parallel_kl_div`` at TP=1 (no all-reduce)."""
    return (torch.exp(target_log) * (target_log - input_log)).sum(dim=-1)


INJECTED = dict(log_softmax_fn=megatron_tp1_log_softmax, kl_div_fn=megatron_tp1_kl_div)


def run(precision, form, s, t, beta, temp, **kw):
    """``(total, per_position [N], grad of total/N [1, N, V] fp64)`` of ``make_gkd_loss_terms``."""
    x = s.detach().clone().requires_grad_(True)
    lab = torch.zeros(x.shape[:2], dtype=torch.long)
    out = make_gkd_loss_terms(precision, form)(x, TeacherOutput(full_logits=t, labels=lab), lab, beta, temp, **kw)
    (g,) = torch.autograd.grad(out.total / int(out.num_valid), x)
    return float(out.total), out.per_position.detach().double(), g.double()


def rel(a, b):
    return float((a - b).norm() / b.norm())


def report(name, s, t, beta, temp, form, mp=False, **kw):
    lab = torch.zeros(s.shape[:2], dtype=torch.long)
    ref_total, n, ref_grad = reference_gkd(s, lab, beta, temp, form, teacher_full=t)
    total, per, grad = run("fp32", form, s, t, beta, temp, **kw)
    _, _, g64 = run("fp64", form, s, t, beta, temp, **kw)
    line = (
        f"{name}: fp32 total {total:+.3e} (ref {ref_total:+.3e}, |err| {abs(total - ref_total):.2e}, "
        f"tol {1e-4 * abs(ref_total) + 2e-6 * n:.2e}), negative positions {int((per < 0).sum())}/{n}, "
        f"grad rel L2 vs reference {rel(grad, ref_grad):.2e}, spot (fp32 vs fp64 variant) {rel(grad, g64):.2e}"
    )
    print(line, flush=True)
    if mp:
        from tests.harness.loss.mp_reference import mp_jsd_row

        row_err = (grad - ref_grad)[0].norm(dim=-1) / ref_grad[0].norm(dim=-1)
        i = int(row_err.argmax())
        mloss, mgrad = mp_jsd_row(s[0, i], t[0, i], beta, form, temp)
        mgrad = mgrad / n
        print(
            f"   worst row {i} vs mpmath: loss fp32 {float(per[i]):+.6e} mp {mloss:+.6e}; grad rel L2: fp32 "
            f"{rel(grad[0, i], mgrad):.2e}, reference.py {rel(ref_grad[0, i], mgrad):.2e}, fp64 variant "
            f"{rel(g64[0, i], mgrad):.2e}",
            flush=True,
        )


def main(mp: bool) -> None:
    g = torch.Generator().manual_seed(22)
    n = 16
    s = (torch.randn(1, n, V, generator=g) * 2).bfloat16().float()
    report("R1a identical, T=0.3, b=0.05 paper, TP=1 primitives", s, s.bfloat16(), 0.05, 0.3, "paper", **INJECTED)
    t = (s + 0.05 * torch.randn(1, n, V, generator=g)).bfloat16()
    report(
        "R1b near-identical, T=1, b=0.05 continuous, TP=1 primitives", s, t, 0.05, 1.0, "continuous", mp=mp, **INJECTED
    )
    report("R1b same inputs, default primitives", s, t, 0.05, 1.0, "continuous")
    # R2: logit std 5, student dominant on token a, teacher on token b != a.
    s = torch.randn(1, n, V, generator=g) * 5
    t = torch.randn(1, n, V, generator=g) * 5
    ids = torch.arange(n)
    s[0, ids, ids] += 30.0
    t[0, ids, ids + n] += 30.0
    s, t = s.bfloat16().float(), t.bfloat16()
    report("R2 disjoint confident, T=0.7, b=0.5 paper, default", s, t, 0.5, 0.7, "paper", mp=mp)
    report("R2 same, TP=1 primitives", s, t, 0.5, 0.7, "paper", **INJECTED)
    # R3: dominant logit +25, T = 0.3.
    s = torch.randn(1, 4, V, generator=g)
    s[0, :, 7] += 25.0
    t = (s + 0.3 * torch.randn(1, 4, V, generator=g)).bfloat16()
    s = s.bfloat16().float()
    report("R3 super-confident, T=0.3, b=1", s, t, 1.0, 0.3, "paper", mp=mp)
    report("R3 super-confident, T=0.3, b=0.95 continuous", s, t, 0.95, 0.3, "continuous", mp=mp)
    report("R3 same, TP=1 primitives b=0.95 continuous", s, t, 0.95, 0.3, "continuous", **INJECTED)


if __name__ == "__main__":
    main("--mp" in sys.argv)
