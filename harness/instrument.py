"""Instrumentation of the GKD loss while it trains.

:class:`LossInstrument` wraps a per-position loss function (``harness.losses.make_gkd_loss_terms``) and is itself
a drop-in for ms-swift's ``gkd_loss`` (returns ``(total, num_valid)``). Per call it records, from detached
values only (so the loss and its gradient are untouched):

* the JSD of the call (``total / num_valid``), whether it is negative or non-finite;
* the per-position JSD: how many positions are negative and the minimum;

and every ``spot_every`` optimizer steps (first loss call of that step) a **FP64 spot check**: the same inputs,
capped at ``spot_max_tokens`` active positions, are recomputed with the run's variant and with the FP64
variant; loss and ``d loss / d student logits`` are compared. Optionally the **parameter gradient** of the
full call is compared with the one of the FP64 loss (``param_grad``), and the loss inputs are **captured** as
safetensors (``harness.capture.save_capture``).

Values go into metric objects (:class:`SumMetric`, :class:`CumulativeSumMetric`, :class:`MinMetric`,
:class:`MaxMetric`, :class:`RatioMetric`, ms-swift's ``MeanMetric``) that follow ms-swift's ``Metric``
protocol. The plugin puts them into the trainer's ``custom_metrics``; ms-swift computes them at each logging
step on every rank, and ``compute`` all-reduces over the data-parallel ranks (sums for counts, min/max for
extremes), so rank 0 logs values of the whole job.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional

import torch
import torch.distributed as dist
from swift.metrics.utils import MeanMetric, Metric
from swift.rlhf_trainers.gkd_loss import TeacherOutput, extract_active

#: DESIGN metric names produced by the instrument (all but ``spot/param_grad_rel_l2`` always registered).
WINDOW_METRICS = ("gkd/jsd_loss", "gkd/sft_loss", "gkd/neg_loss_calls", "gkd/neg_token_frac", "gkd/min_token_jsd")
CUMULATIVE_METRICS = ("gkd/neg_loss_calls_total", "gkd/loss_calls_total", "gkd/nonfinite_calls_total")
SPOT_METRICS = ("spot/loss", "spot/loss_fp64", "spot/loss_abs_err", "spot/loss_rel_err", "spot/grad_rel_l2",
                "spot/sign_mismatch")
PARAM_GRAD_METRIC = "spot/param_grad_rel_l2"


def _device():
    from swift.utils import get_current_device

    return get_current_device()


def _all_reduce(values: Iterable[float], op) -> list[float]:
    """All-reduce a few floats (FP64 on the wire) when a process group exists; identity otherwise."""
    values = list(values)
    if dist.is_available() and dist.is_initialized():
        t = torch.tensor(values, dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=op)
        values = t.tolist()
    return values


def _loss_replicas() -> int:
    """How many ranks compute the *same* loss call: the tensor-parallel size under Megatron, else 1.

    Under Megatron every TP rank of the last pipeline stage runs the loss on the same positions (the
    vocab-parallel primitives reduce over TP), and other stages run none, so a world-wide SUM counts each call
    TP times. Dividing by it keeps the world-wide collective (every rank takes part, whatever its stage).
    """
    mpu = sys.modules.get("megatron.core.parallel_state")
    try:
        if mpu is not None and mpu.model_parallel_is_initialized():
            return int(mpu.get_tensor_model_parallel_world_size())
    except Exception:  # noqa: BLE001 - no Megatron state: one replica
        pass
    return 1


class SumMetric(Metric):
    """Sum over the logging window and over ranks (``None`` when nothing was recorded anywhere)."""

    def __init__(self):
        super().__init__()
        self.add_state("value", default=0.0)
        self.add_state("count", default=0)

    def update(self, value) -> None:
        self.value += float(value)
        self.count += 1

    def _window(self):
        value, count = _all_reduce([self.value, self.count], dist.ReduceOp.SUM)
        replicas = _loss_replicas()
        return value / replicas, count / replicas

    def compute(self):
        value, count = self._window()
        return value if count else None


class CumulativeSumMetric(SumMetric):
    """Running total since the start of training, summed over ranks (reset() only clears the window)."""

    def __init__(self):
        super().__init__()
        self.total = 0.0

    def compute(self):
        value, _ = self._window()
        self.total += value
        return self.total


class MinMetric(Metric):
    """Minimum over the window and over ranks (``None`` when empty)."""

    _op_name, _init = "MIN", math.inf

    def __init__(self):
        super().__init__()
        self.add_state("value", default=self._init)

    def update(self, value) -> None:
        value = float(value)
        self.value = min(self.value, value) if self._op_name == "MIN" else max(self.value, value)

    def compute(self):
        (value, ) = _all_reduce([self.value], getattr(dist.ReduceOp, self._op_name))
        return None if math.isinf(value) and value == self._init else value


class MaxMetric(MinMetric):
    """Maximum over the window and over ranks (``None`` when empty)."""

    _op_name, _init = "MAX", -math.inf


class RatioMetric(Metric):
    """``sum(numerator) / sum(denominator)`` over the window and over ranks (``None`` when the denominator is 0)."""

    def __init__(self):
        super().__init__()
        self.add_state("num", default=0.0)
        self.add_state("den", default=0.0)

    def update(self, num, den) -> None:  # noqa: D401 - Metric protocol
        self.num += float(num)
        self.den += float(den)

    def compute(self):
        num, den = _all_reduce([self.num, self.den], dist.ReduceOp.SUM)
        return num / den if den else None


def build_metrics(param_grad: bool = False) -> Dict[str, Metric]:
    """One metric object per DESIGN name (all ranks must register the same set)."""
    metrics: Dict[str, Metric] = {
        "gkd/jsd_loss": MeanMetric(nan_value=None, device=_device()),
        "gkd/sft_loss": MeanMetric(nan_value=None, device=_device()),
        "gkd/neg_loss_calls": SumMetric(),
        "gkd/neg_token_frac": RatioMetric(),
        "gkd/min_token_jsd": MinMetric(),
        "gkd/neg_loss_calls_total": CumulativeSumMetric(),
        "gkd/loss_calls_total": CumulativeSumMetric(),
        "gkd/nonfinite_calls_total": CumulativeSumMetric(),
        "spot/loss": MeanMetric(nan_value=None, device=_device()),
        "spot/loss_fp64": MeanMetric(nan_value=None, device=_device()),
        "spot/loss_abs_err": MaxMetric(),
        "spot/loss_rel_err": MaxMetric(),
        "spot/grad_rel_l2": MaxMetric(),
        "spot/sign_mismatch": MaxMetric(),
    }
    if param_grad:
        metrics[PARAM_GRAD_METRIC] = MaxMetric()
    return metrics


# ----------------------------------------------------------------------------------------------------------
# spot checks
# ----------------------------------------------------------------------------------------------------------
def _cap_active(student_logits: torch.Tensor, teacher_output: TeacherOutput, labels: torch.Tensor, max_tokens: int):
    """The active positions of a call, capped at ``max_tokens``, as a ``[1, N, V]`` problem with all labels active.

    Returns ``(student [1, N, V] detached, TeacherOutput [1, N, ...], labels [1, N])``.
    """
    s_act, t_act, _ = extract_active(student_logits.detach(), teacher_output, labels)
    n = min(int(s_act.shape[0]), int(max_tokens))

    def cut(x):
        return None if x is None else x[:n].detach().unsqueeze(0)

    teacher = TeacherOutput(full_logits=cut(t_act.full_logits), topk_logprobs=cut(t_act.topk_logprobs),
                            topk_indices=cut(t_act.topk_indices))
    lab = torch.zeros((1, n), dtype=torch.long, device=labels.device)
    teacher.labels = lab
    return cut(s_act), teacher, lab


def _mean_loss_and_grad(terms_fn: Callable, s: torch.Tensor, teacher: TeacherOutput, labels, beta, temperature,
                        *args, **kwargs):
    """``(loss = total / num_valid as float, d loss / d s in FP64)`` on a detached leaf copy of ``s``.

    ``args`` / ``kwargs``: the call's extra arguments (gather / log-softmax / KL functions, TP-aware under
    Megatron), passed through so a spot check computes exactly what the run computes.
    """
    x = s.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = terms_fn(x, teacher, labels, beta, temperature, *args, **kwargs)
        n = int(out.num_valid)
        loss = out.total / n if n else out.total * 0
        (grad, ) = torch.autograd.grad(loss, x, allow_unused=True)
    grad = torch.zeros_like(x, dtype=torch.float64) if grad is None else grad.to(torch.float64)
    return float(loss.detach().to(torch.float64)), grad


def spot_check(run_terms: Callable, ref_terms: Callable, student_logits, teacher_output, labels, beta, temperature,
               max_tokens: int, *args, **kwargs) -> Optional[Dict[str, float]]:
    """FP64 spot check of one loss call (``None`` if the call has no active position).

    Returns the DESIGN ``spot/*`` values: ``loss`` (run's variant, per-position mean on the capped inputs),
    ``loss_fp64``, ``loss_abs_err``, ``loss_rel_err`` (abs / |fp64|), ``grad_rel_l2``
    (``‖g − g64‖ / ‖g64‖`` of d loss / d student logits), ``sign_mismatch`` (1.0 when signs differ).
    """
    s, teacher, lab = _cap_active(student_logits, teacher_output, labels, max_tokens)
    if s.shape[1] == 0:
        return None
    loss, grad = _mean_loss_and_grad(run_terms, s, teacher, lab, beta, temperature, *args, **kwargs)
    ref, grad64 = _mean_loss_and_grad(ref_terms, s, teacher, lab, beta, temperature, *args, **kwargs)
    abs_err = abs(loss - ref)
    gnorm = float(grad64.norm())
    return {
        "spot/loss": loss,
        "spot/loss_fp64": ref,
        "spot/loss_abs_err": abs_err,
        "spot/loss_rel_err": abs_err / abs(ref) if ref != 0 else (0.0 if abs_err == 0 else math.inf),
        "spot/grad_rel_l2": float((grad - grad64).norm()) / gnorm if gnorm > 0 else float((grad - grad64).norm()),
        "spot/sign_mismatch": float((loss < 0) != (ref < 0)),
    }


def param_grad_rel_l2(loss_run: torch.Tensor, loss_ref: torch.Tensor, params: list[torch.Tensor]) -> Optional[float]:
    """``‖∇θ loss_run − ∇θ loss_ref‖ / ‖∇θ loss_ref‖`` over all ``params`` (graph retained, ``.grad`` untouched)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        return None
    g_run = torch.autograd.grad(loss_run, params, retain_graph=True, allow_unused=True)
    g_ref = torch.autograd.grad(loss_ref, params, retain_graph=True, allow_unused=True)
    num = den = 0.0
    for a, b in zip(g_run, g_ref):
        if b is None:
            continue
        a = torch.zeros_like(b) if a is None else a
        num += float((a.double() - b.double()).pow(2).sum())
        den += float(b.double().pow(2).sum())
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)


# ----------------------------------------------------------------------------------------------------------
# the instrumented loss
# ----------------------------------------------------------------------------------------------------------
class LossInstrument:
    """A drop-in for ms-swift's ``gkd_loss`` that measures every call of ``terms_fn``.

    Args:
        terms_fn: ``(student_logits [B,S,V], teacher_output, labels [B,S], beta, temperature, *extra) ->
            GKDTerms(total, num_valid, per_position [N])`` of the run's variant.
        ref_terms_fn: the same with FP64 arithmetic (spot-check reference).
        metrics: name -> metric object (:func:`build_metrics`); updated in place.
        spot_every: spot-check every N optimizer steps (0 = never); ``step`` is set by the trainer callback.
        spot_max_tokens: cap on the positions a spot check recomputes.
        param_grad: also compare the parameter gradient with the FP64 loss's on spot steps (needs ``params``).
        capture_dir: if set, save the loss inputs of spot steps there as ``step{S}_rank{R}.safetensors``.
        meta: strings stored in captures (precision, beta_form, ...).
    """

    def __init__(self, terms_fn: Callable, ref_terms_fn: Callable, metrics: Dict[str, Metric], *, spot_every: int = 0,
                 spot_max_tokens: int = 256, param_grad: bool = False, capture_dir: Optional[str] = None,
                 meta: Optional[dict] = None, rank: int = 0):
        self.terms_fn, self.ref_terms_fn, self.metrics = terms_fn, ref_terms_fn, metrics
        self.spot_every, self.spot_max_tokens = int(spot_every or 0), int(spot_max_tokens)
        self.param_grad, self.capture_dir = bool(param_grad), capture_dir
        self.meta, self.rank = dict(meta or {}), rank
        self.step = 1  # optimizer step being computed (1-based); the callback keeps it current
        self._spotted_step: Optional[int] = None
        self.params: Callable[[], list] = lambda: []
        self.calls = 0

    def _is_spot_step(self) -> bool:
        return self.spot_every > 0 and self.step % self.spot_every == 0 and self._spotted_step != self.step

    def __call__(self, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        out = self.terms_fn(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        self.calls += 1
        self._record(out)
        if self._is_spot_step():
            self._spotted_step = self.step
            self._spot(out, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        return out.total, out.num_valid

    @torch.no_grad()
    def _record(self, out) -> None:
        """Update the per-call metrics with a single device→host transfer (this runs on every loss call)."""
        m = self.metrics
        per = out.per_position.detach()
        total = out.total.detach()
        num_valid = out.num_valid.to(total.device)
        # the loss as the trainer sees it: total / num_valid in the loss's own dtype
        loss_t = torch.where(num_valid > 0, total / num_valid.to(total.dtype), total.new_zeros(()))  # no grad here
        stats = torch.stack([
            total.to(torch.float64),
            loss_t.to(torch.float64),
            num_valid.to(torch.float64),
            (per < 0).sum().to(torch.float64),
            per.min().to(torch.float64) if per.numel() else per.new_zeros((), dtype=torch.float64),
        ])
        total, loss, n, neg_tokens, min_token = stats.tolist()
        n = int(n)
        finite = math.isfinite(total)
        m["gkd/loss_calls_total"].update(1)
        m["gkd/nonfinite_calls_total"].update(0 if finite else 1)
        neg = 1 if (finite and loss < 0) else 0
        m["gkd/neg_loss_calls"].update(neg)
        m["gkd/neg_loss_calls_total"].update(neg)
        if finite and n:
            m["gkd/jsd_loss"].update(loss)
        if per.numel():
            m["gkd/neg_token_frac"].update(int(neg_tokens), per.numel())
            m["gkd/min_token_jsd"].update(min_token)

    def record_sft(self, value) -> None:
        """Record the SFT (cross-entropy) term of one call (``gkd.sft_alpha > 0``)."""
        if value is not None:
            self.metrics["gkd/sft_loss"].update(float(value))

    def _spot(self, out, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs) -> None:
        vals = spot_check(self.terms_fn, self.ref_terms_fn, student_logits, teacher_output, labels, beta,
                          temperature, self.spot_max_tokens, *args, **kwargs)
        if vals is not None:
            for k, v in vals.items():
                self.metrics[k].update(v)
        if self.param_grad and PARAM_GRAD_METRIC in self.metrics and student_logits.requires_grad:
            n = int(out.num_valid)
            if n:
                ref = self.ref_terms_fn(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
                rel = param_grad_rel_l2(out.total / n, ref.total / n, list(self.params()))
                if rel is not None:
                    self.metrics[PARAM_GRAD_METRIC].update(rel)
        if self.capture_dir:
            from harness.capture import save_capture

            meta = {**self.meta, "step": self.step, "rank": self.rank}
            path = Path(self.capture_dir) / f"step{self.step}_rank{self.rank}.safetensors"
            save_capture(path, student_logits, teacher_output, labels, beta, temperature, meta)
