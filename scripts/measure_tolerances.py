"""Measure the fp32 variant's worst errors against the FP64 reference (the numbers in harness/loss/tolerances.py).

Run: python scripts/measure_tolerances.py [--regimes]   (a few minutes on 2 cores)

``--regimes`` prints issue 13's regime families instead (tests/harness/loss/test_losses_regimes.py): the logit-scale
sweep (levels and shifted logits, L = 1 … 1e4) against FP64 and textbook FP32 on the same inputs.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gkd_harness.harness.loss.reference import reference_gkd  # noqa: E402
from gkd_harness.harness.losses import make_gkd_loss  # noqa: E402
from tests.loss_cases import grid, make_case, seed_of  # noqa: E402


def main():
    worst = {}
    for (sd, td), beta, temp, form, mode, near in grid():
        case = make_case(sd, td, mode, near, seed_of(sd, td, beta, temp, form, mode, near))
        ref_total, n, ref_grad = reference_gkd(case.student, case.labels, beta, temp, form, **case.ref_kwargs)
        s = case.student.clone().requires_grad_()
        total, num_valid = make_gkd_loss("fp32", form)(s, case.teacher, case.labels, beta, temp)
        (total / num_valid).backward()
        grad_err = float((s.grad.double() - ref_grad).norm() / ref_grad.norm())
        err = abs(float(total.detach()) - ref_total)
        w = worst.setdefault((sd, td), dict(rel=0.0, abs_per_pos=0.0, grad=0.0))
        w["rel"] = max(w["rel"], err / abs(ref_total))
        w["abs_per_pos"] = max(w["abs_per_pos"], err / n)
        w["grad"] = max(w["grad"], grad_err)
    print(f"{'student/teacher':<16} {'max rel':>10} {'max abs/N':>10} {'max grad rel-L2':>16}")
    for (sd, td), w in worst.items():
        print(f"{sd + '/' + td:<16} {w['rel']:>10.2e} {w['abs_per_pos']:>10.2e} {w['grad']:>16.2e}")


def regimes():
    import torch

    from gkd_harness.harness.loss.reference import reference_jsd
    from gkd_harness.harness.losses import make_jsd_loss
    from tests.harness.loss.test_losses_regimes import SCALES, _levels, _shifted

    print(f"{'family':<8} {'L':>7} {'max rel':>9} {'max grad':>9} {'textbook rel':>13}")
    for fam, make in (("levels", _levels), ("shifted", _shifted)):
        for scale in SCALES:
            s, t = make(scale, seed_of("scale", scale, fam))
            rel = grad = tb = 0.0
            for beta in (0.0, 1e-3, 0.5, 0.9, 1.0):
                for form in ("paper", "continuous"):
                    s64 = s.double().requires_grad_(True)
                    ref = reference_jsd(s64, t.double(), beta, form).sum()
                    (g64,) = torch.autograd.grad(ref, s64)
                    sg = s.clone().requires_grad_(True)
                    val = make_jsd_loss("fp32", form)(sg, t, beta)
                    (g,) = torch.autograd.grad(val, sg)
                    ref = float(ref)
                    rel = max(rel, abs(float(val.detach()) - ref) / abs(ref))
                    grad = max(grad, float((g.double() - g64).norm() / g64.norm()))
                    tb = max(tb, abs(float(make_jsd_loss("native", form)(s, t, beta)) - ref) / abs(ref))
            print(f"{fam:<8} {scale:>7g} {rel:>9.1e} {grad:>9.1e} {tb:>13.1e}")


if __name__ == "__main__":
    regimes() if "--regimes" in sys.argv else main()
