"""BROKEN on purpose (issue 44): keeps every returned total alive in a module-level list (with its graph:
memory grows with every training step). gkd-certify: FAIL, 'memory across repeated calls'."""

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
_KEPT = []


@functools.wraps(_good.gkd_loss)
def gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
    total, num_valid = _good.gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
    _KEPT.append(total)
    return total, num_valid
