"""The dtype boundary at the loss: casts the student / teacher logits to ``model.student_dtype`` / ``model.teacher_dtype``
(the mixed FP32-student / BF16-teacher case of Megatron, made on purpose on the HF backend), records the dtypes
that arrived and the dtypes the loss saw, and counts the training calls (every monitor mode: the boundary is the
``gkd_loss`` the plugin installs, with or without the instrument inside it)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional

import torch


class DtypeBoundary:
    """Casts the loss inputs to configured dtypes and records what arrived and what the loss saw.

    ``student_dtype`` / ``teacher_dtype``: ``torch.dtype`` or None (leave as is). The cast of the student is
    part of the graph (gradients flow back through it); teacher values are constants.

    ``train_calls``: calls whose student logits carry a graph (training; an evaluation under ``no_grad`` is not
    counted), a Python int incremented per call (no host sync). The callbacks record it in ``summary.json``
    (``loss_calls``), where ``gkd-train`` fails a run with fewer calls than steps trained.
    """

    def __init__(self, loss: Callable, student_dtype: Optional[torch.dtype], teacher_dtype: Optional[torch.dtype]):
        self.loss, self.student_dtype, self.teacher_dtype = loss, student_dtype, teacher_dtype
        self.arrived: Dict[str, str] = {}
        self.seen: Dict[str, str] = {}
        self.train_calls = 0

    @staticmethod
    def _teacher_tensor(t) -> Optional[torch.Tensor]:
        return t.full_logits if t.full_logits is not None else t.topk_logprobs

    def __call__(self, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        if student_logits.requires_grad:
            self.train_calls += 1
        t_in = self._teacher_tensor(teacher_output)
        if not self.arrived:
            self.arrived = {
                "student": _name(student_logits.dtype),
                "teacher": _name(t_in.dtype) if t_in is not None else "none",
            }
        if self.student_dtype is not None and student_logits.dtype != self.student_dtype:
            student_logits = student_logits.to(self.student_dtype)
        if self.teacher_dtype is not None and t_in is not None and t_in.dtype != self.teacher_dtype:
            field = "full_logits" if teacher_output.full_logits is not None else "topk_logprobs"
            teacher_output = dataclasses.replace(teacher_output, **{field: t_in.to(self.teacher_dtype)})
        if not self.seen:
            t_out = self._teacher_tensor(teacher_output)
            self.seen = {
                "student": _name(student_logits.dtype),
                "teacher": _name(t_out.dtype) if t_out is not None else "none",
            }
        return self.loss(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
