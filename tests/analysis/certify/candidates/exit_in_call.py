"""BROKEN on purpose (issue 44): ``os._exit(0)`` in its first call. gkd-certify: FAIL (exit 1), 'exited with
code 0 in family ...'."""

import functools
import importlib.util
import os
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
    os._exit(0)
