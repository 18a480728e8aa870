"""CORRECT, slowly (issue 44): the promote-first fix computed three times per call, forward and backward
(about 3x upstream's time), one run's value and gradient returned. gkd-certify: PASS, with a speed note."""

import functools
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_panel_good_promote_first",
    Path(__file__).resolve().parents[4] / "examples" / "candidates" / "good_promote_first.py",
)
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)
jsd_loss = _good.jsd_loss


@functools.wraps(_good.gkd_loss)
def gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
    runs = [
        _good.gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs) for _ in range(3)
    ]
    # the other two runs' graphs join with weight 0 (exact: backward runs through all three, the gradient is one's)
    return runs[0][0] + 0 * (runs[1][0] + runs[2][0]), runs[0][1]
