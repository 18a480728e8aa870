"""BROKEN on purpose (issue 44): ``torch.set_float32_matmul_precision("high")`` at import (every
rank imports the candidate: TF32 matmuls for the whole trainer). gkd-certify: FAIL, 'import (global torch state)':
'changes global torch state at import: float32 matmul precision highest -> high'."""

import functools
import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "_panel_good_promote_first",
    Path(__file__).resolve().parents[4] / "examples" / "candidates" / "good_promote_first.py",
)
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)
jsd_loss = _good.jsd_loss
torch.set_float32_matmul_precision("high")


@functools.wraps(_good.gkd_loss)
def gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
    return _good.gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
