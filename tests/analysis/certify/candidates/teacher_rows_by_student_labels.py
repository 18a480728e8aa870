"""BROKEN on purpose (issue 44): selects the teacher's rows with the student's labels. Right
wherever both have the same labels (every family but one), wrong in self-distillation, where the teacher scored
another prompt and its labels mark other positions (same count). gkd-certify: FAIL, 'teacher labels at other
positions'."""

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
    teacher_output = _good.TeacherOutput(
        full_logits=teacher_output.full_logits,
        topk_logprobs=teacher_output.topk_logprobs,
        topk_indices=teacher_output.topk_indices,
        labels=labels,
    )
    return _good.gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
