"""CORRECT (issue 44): the promote-first fix with its default KL written with ``F.kl_div`` (log
targets); injected primitives are still called. gkd-certify: PASS."""

import functools
import importlib.util
from pathlib import Path

import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location(
    "_panel_good_promote_first",
    Path(__file__).resolve().parents[4] / "examples" / "candidates" / "good_promote_first.py",
)
_good = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_good)
jsd_loss = _good.jsd_loss


def _kl(input_log, target_log):
    """Per-position KL(target || input) ``[N]`` with ``F.kl_div`` (both log-probabilities)."""
    return F.kl_div(input_log, target_log, reduction="none", log_target=True).sum(-1)


@functools.wraps(_good.gkd_loss)
def gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
    kwargs.setdefault("kl_div_fn", _kl)
    return _good.gkd_loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
