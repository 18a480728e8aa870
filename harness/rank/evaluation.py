"""The held-out evaluation: the student against the teacher on a split training never sees (``monitor.eval``).

ms-swift runs its own evaluation loop on ``--val_dataset`` every ``--eval_steps`` steps (the launcher passes both,
``harness.launcher.swift_argv``): the GKD trainer's ``prediction_step`` calls ``gkd_loss`` under ``torch.no_grad``.
The harness adds what that loop lacks:

- :class:`EvalTap` sits between the dtype boundary and the loss, so it sees the logits **as they reach the loss**.
  On a loss call without a graph (the evaluation loop) it adds the FP64 sums of :func:`eval_sums` and answers with
  the run's bare loss (the instrument's training counters are left alone); in training it passes the call on.
- :func:`finish` turns the sums into the ``eval/*`` metrics (all-reduced over the data-parallel ranks first) and
  resets them; the HF hook (:func:`install_hf_hooks`) adds them to the loop's metrics, so they are logged with
  ``eval_loss`` at the same step and reach ``metrics.jsonl`` and wandb through the harness callback.
- The harness callback asks for one more evaluation at the last step (``harness.rank.callbacks``).

All metrics are token-weighted means over the active positions of the split: the generalized JSD at the run's
β, beta form and temperature; forward KL(T‖S) and reverse KL(S‖T) of the temperature-scaled distributions; and
the fraction of positions where the student's argmax equals the teacher's.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch

from harness.contract import (EVAL_FORWARD_KL, EVAL_JSD, EVAL_REVERSE_KL, EVAL_TOKENS, EVAL_TOP1_AGREEMENT)

F64 = torch.float64
#: The order of the sums in :func:`eval_sums`'s vector.
SUM_FIELDS = (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL, EVAL_TOP1_AGREEMENT, EVAL_TOKENS)


def _kl_rows(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) per row ``[N, V] -> [N]`` in FP64 (a term with P = 0 is 0)."""
    p = p_log.exp()
    return torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)).sum(-1)


def divergences(s_logits: torch.Tensor, t_logits: torch.Tensor, beta: float, beta_form: str,
                temperature: float) -> Dict[str, torch.Tensor]:
    """Per-position FP64 values for logits ``[N, V]``: ``jsd``, ``forward_kl``, ``reverse_kl`` (each ``[N]``) and
    ``top1`` (``[N]`` 1.0 where the argmaxes agree)."""
    s = s_logits.detach().to(F64) / temperature
    t = t_logits.detach().to(F64) / temperature
    ls, lt = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    fkl, rkl = _kl_rows(lt, ls), _kl_rows(ls, lt)
    if beta == 0:
        jsd = fkl
    elif beta == 1:
        jsd = rkl
    else:
        lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))  # log((1-β)·S + β·T)
        kl_t, kl_s = _kl_rows(lt, lm), _kl_rows(ls, lm)
        if beta_form == "paper":
            jsd = beta * kl_t + (1 - beta) * kl_s
        elif beta_form == "continuous":
            jsd = (1 - beta) * kl_t + beta * kl_s
        else:
            raise ValueError(f"loss.beta_form: unknown {beta_form!r}")
    top1 = (s_logits.detach().argmax(-1) == t_logits.detach().argmax(-1)).to(F64)
    return {"jsd": jsd, "forward_kl": fkl, "reverse_kl": rkl, "top1": top1}


def active_rows(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                teacher_labels: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The active positions as the loss selects them: student ``[B, S, V]`` rows where ``labels != -100`` and
    teacher ``[B, S', V']`` rows where its own labels are; vocabularies aligned as upstream does (the shorter side
    takes the other side's logits for the extra ids). Returns ``([N, V*], [N, V*])``."""
    s = student_logits[labels != -100]
    t = teacher_logits[(labels if teacher_labels is None else teacher_labels) != -100]
    if s.shape[0] != t.shape[0]:
        raise ValueError(f"eval: {s.shape[0]} active student positions but {t.shape[0]} teacher positions")
    vs, vt = s.shape[-1], t.shape[-1]
    if vs < vt:
        s = torch.cat([s, t[:, vs:].to(s.dtype)], -1)
    elif vt < vs:
        t = torch.cat([t, s[:, vt:].to(t.dtype)], -1)
    return s, t


def eval_sums(student_logits, teacher_output, labels, beta: float, temperature: float, beta_form: str) -> torch.Tensor:
    """FP64 ``[5]`` sums over one loss call's active positions, in :data:`SUM_FIELDS` order (the last is the
    count). ``teacher_output`` is ms-swift's ``TeacherOutput`` with ``full_logits`` (and shifted ``labels``)."""
    s, t = active_rows(student_logits, teacher_output.full_logits, labels, getattr(teacher_output, "labels", None))
    if s.shape[0] == 0:
        return torch.zeros(len(SUM_FIELDS), dtype=F64, device=student_logits.device)
    d = divergences(s, t, beta, beta_form, temperature)
    return torch.stack([d["jsd"].sum(), d["forward_kl"].sum(), d["reverse_kl"].sum(), d["top1"].sum(),
                        d["jsd"].new_tensor(float(s.shape[0]))])


def metrics_from_sums(sums) -> Dict[str, float]:
    """The ``eval/*`` metrics (means; ``eval/tokens`` the count) from :func:`eval_sums` totals."""
    values = [float(v) for v in sums]
    n = values[-1]
    out = {name: (v / n if n else math.nan) for name, v in zip(SUM_FIELDS[:-1], values[:-1])}
    out[EVAL_TOKENS] = n
    return out


class EvalTap:
    """The loss the dtype boundary calls: in training ``inner`` (the instrument or the bare loss); on a loss call
    without a graph (ms-swift's evaluation loop) it accumulates :func:`eval_sums` and returns ``bare``'s loss.

    ``bare``: the run's loss variant, uninstrumented; ``beta_form``: the run's ``loss.beta_form``.
    """

    def __init__(self, inner: Callable, bare: Callable, beta_form: str):
        self.inner, self.bare, self.beta_form = inner, bare, beta_form
        self.sums: Optional[torch.Tensor] = None
        self.skipped_topk = False

    @staticmethod
    def evaluating(student_logits: torch.Tensor) -> bool:
        return not torch.is_grad_enabled() and not student_logits.requires_grad

    def __call__(self, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        if not self.evaluating(student_logits):
            return self.inner(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        if getattr(teacher_output, "full_logits", None) is None:
            if not self.skipped_topk:
                self.skipped_topk = True
                from harness.rank.state import logger

                logger.warning("eval/*: the teacher gives top-k log-probs only; the held-out metrics need full logits")
        else:
            add = eval_sums(student_logits, teacher_output, labels, float(beta), float(temperature), self.beta_form)
            self.sums = add if self.sums is None else self.sums + add.to(self.sums.device)
        return self.bare(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)

    def finish(self, group=None) -> Dict[str, float]:
        """The ``eval/*`` metrics of the evaluation since the last call, summed over the ranks of ``group`` (a
        collective: every rank calls it), then reset. ``{}`` when no rank saw an evaluated position."""
        import torch.distributed as dist

        sums = self.sums
        self.sums = None
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            device = sums.device if sums is not None else _collective_device()
            sums = sums if sums is not None else torch.zeros(len(SUM_FIELDS), dtype=F64, device=device)
            dist.all_reduce(sums, group=group)
        if sums is None or float(sums[-1]) == 0:
            return {}
        return metrics_from_sums(sums.tolist())


def _collective_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def find_tap(loss: Callable) -> Optional[EvalTap]:
    """The :class:`EvalTap` behind the installed loss (the dtype boundary's ``loss``), if any."""
    inner = getattr(loss, "loss", loss)
    return inner if isinstance(inner, EvalTap) else None


def install_hf_hooks(tap: EvalTap) -> bool:
    """Wrap the HF GKD trainer's ``evaluation_loop`` so its metrics carry the ``eval/*`` values of the pass."""
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    if getattr(GKDTrainer.evaluation_loop, "_gkd_harness", False):
        return False
    original = GKDTrainer.evaluation_loop

    def evaluation_loop(self, *args, **kwargs):
        tap.sums = None
        output = original(self, *args, **kwargs)
        output.metrics.update(tap.finish())
        return output

    evaluation_loop._gkd_harness = True
    GKDTrainer.evaluation_loop = evaluation_loop
    return True


__all__ = ["SUM_FIELDS", "divergences", "active_rows", "eval_sums", "metrics_from_sums", "EvalTap", "find_tap",
           "install_hf_hooks"]
