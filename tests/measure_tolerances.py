"""Measure the fp32 variant's worst errors against the FP64 reference (the numbers in tests/tolerances.py).

Run: python tests/measure_tolerances.py   (a few minutes on 2 cores)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.losses import make_gkd_loss  # noqa: E402
from tests.loss_cases import grid, make_case, seed_of  # noqa: E402
from tests.reference import reference_gkd  # noqa: E402


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


if __name__ == "__main__":
    main()
