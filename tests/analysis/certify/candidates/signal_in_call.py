"""BROKEN on purpose (issue 44): its process sends itself SIGKILL in a call. gkd-certify: FAIL (exit 1),
'was killed by signal SIGKILL in family ...'."""

import functools
import importlib.util
import os
import signal
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
    os.kill(os.getpid(), signal.SIGKILL)
