"""Instrumentation of the GKD loss while it trains.

:class:`LossInstrument` wraps a per-position loss function (``gkd_harness.harness.losses.make_gkd_loss_terms``) and is itself
a drop-in for ms-swift's ``gkd_loss`` (returns ``(total, num_valid)``). Per call it records, from detached
values only (so the loss and its gradient are untouched):

* the JSD of the call (``total / num_valid``), whether it is negative or non-finite; NaN and Inf are recorded as
  themselves (a non-finite call makes the window's ``gkd/jsd_loss`` non-finite, never 0);
* the per-position JSD: how many positions are negative and the minimum;

and every ``spot_every`` optimizer steps (first loss call of that step) a **FP64 spot check**
(:mod:`gkd_harness.harness.rank.spot_check`): the same inputs, capped at ``spot_max_tokens`` active positions and copied
*before* the loss call (a loss that writes into its inputs cannot hide it), are recomputed with the run's variant
and with the FP64 variant; loss and ``d loss / d student logits`` are compared. Optionally the **parameter gradient** of the
full call is compared with the one of the FP64 loss (``param_grad``: from a graph of its own on copies of the
inputs, refused where Megatron's backward writes ``main_grad``), and the loss inputs are **captured** as
safetensors (``gkd_harness.harness.rank.capture``: the rows the loss saw, whole under TP, written off the hot path).

Cost per call: five statistics stacked on the device and queued, no host read, no collective; once per logging
step (before the metrics' reduction) every queued call is read in one device-to-host transfer
(:meth:`LossInstrument.flush`). Before: one transfer per call, i.e. per micro-batch, inside the pipeline schedule.

**Context parallelism.** Under Megatron CP each CP rank holds a slice of the sequence and calls the loss on it.
The instrument gathers the slices' statistics over the CP group (one collective per logging step for all the
queued calls, no extra host transfer), so one call of the CP group is one loss call, judged on the CP-reduced total ``sum(total) / sum(num_valid)`` (what
ms-swift's ``cp_reduce`` computes), on every CP rank alike.

**Metric reductions.** Values go into metric objects (:class:`SumMetric`, :class:`CumulativeSumMetric`,
:class:`MinMetric`, :class:`MaxMetric`, :class:`RatioMetric`, :class:`MeanMetric`) that follow ms-swift's
``Metric`` protocol. The plugin puts them into the trainer's ``custom_metrics``; ms-swift computes them at each
logging step on every rank, and the first ``compute`` of a logging step gathers every metric's window state over
all ranks in **one** collective with one host copy (:class:`MetricReducer`); each metric then reduces its columns
(sums for counts, min/max for extremes; NaN survives min/max), dividing counts by the ranks that replicate one
call (TP × CP), so every rank logs values of the whole job. The collectives run on :class:`MetricDevice`: the device of the loss inputs (bound on
the first loss call) or the rank's device bound by the trainer callback at train begin; nothing queries a device
when the module is imported or the metrics are built.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Iterable, Optional

import torch
import torch.distributed as dist
from swift.metrics.utils import Metric

from gkd_harness.harness.contract import (
    JSD_LOSS,
    LOSS_CALLS_TOTAL,
    MIN_TOKEN_JSD,
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    NEG_TOKEN_FRAC,
    NONFINITE_CALLS_TOTAL,
    SFT_LOSS,
    SPOT_GRAD_REL_L2,
    SPOT_GRAD_REL_L2_DTYPE_FLOOR,
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    SPOT_PARAM_GRAD_REL_L2,
    SPOT_SIGN_MISMATCH,
)
from gkd_harness.harness.rank.parallel_state import context_parallel_group, loss_replicas
from gkd_harness.harness.rank.spot_check import (  # noqa: F401 - re-exported
    SPOT_CHUNK_ELEMENTS,
    ParamGradInputs,
    loss_kwargs,
    param_grad_rel_l2,
    spot_check,
    spot_check_pieces,
    spot_inputs,
)

#: Contract metric names produced by the instrument (all but ``spot/param_grad_rel_l2`` always registered).


class NonFiniteError(RuntimeError):
    """A non-finite GKD loss or grad_norm with ``monitor.fail_on_nonfinite`` on (the message names the step)."""


class MetricDevice:
    """The device the metrics' collectives run on; unresolved until training touches it.

    ``bind_loss_inputs`` (first loss call) always wins: the metrics live where the loss inputs are.
    ``bind_rank_device`` (trainer callback at train begin, for ranks that never call the loss, e.g. first
    pipeline stages) only fills an unset device. ``resolve`` is called at logging time, inside the training loop.
    """

    def __init__(self):
        self.device: Optional[torch.device] = None
        self.source: Optional[str] = None

    def bind_loss_inputs(self, device) -> None:
        if self.source != "loss inputs":
            self.device, self.source = torch.device(device), "loss inputs"

    def bind_rank_device(self, device) -> None:
        if self.device is None:
            self.device, self.source = torch.device(device), "rank device"

    def resolve(self) -> torch.device:
        if self.device is not None:
            return self.device
        if dist.is_initialized() and dist.get_backend() == "gloo":
            return torch.device("cpu")
        from swift.utils import get_current_device  # at logging time: the rank's device is set by then

        return torch.device(get_current_device())


class MetricReducer:
    """One collective per logging step for every metric that shares it (all those :func:`build_metrics` makes).

    ms-swift computes each metric of ``custom_metrics`` in turn (``compute`` then ``reset``). The first
    ``compute`` of a round takes every member's window state (a few floats each, FP64), all-gathers them over the
    ranks in one collective (``all_gather_into_tensor``; ``all_gather`` on gloo) and copies the ``[world, K]``
    result to the host once; each member then reduces its own columns (sum, min or max over ranks). A round ends
    when every member has been computed; an ``update`` in between makes the next ``compute`` take a fresh snapshot
    (the ``reset`` that follows each ``compute`` in a round does not). Before: one ``all_reduce`` + a host copy per metric (15 per logging step).
    """

    def __init__(self, where: Optional[MetricDevice] = None):
        self.where = where if where is not None else MetricDevice()
        self.members: list = []
        self.collectives = 0  # collectives issued (tests and benchmarks read it)
        self.version = 0  # bumped by every update of a member
        self._cache: Optional[list] = None
        self._cache_version = -1
        self._consumed: set = set()
        #: called before each reduction: the instrument's :meth:`LossInstrument.flush` of the queued calls
        self.before_reduce: list = []

    def register(self, metric: "_HarnessMetric") -> None:
        self.members.append(metric)

    def values(self, metric: "_HarnessMetric") -> list:
        """``metric``'s window state reduced over all ranks (its :meth:`_HarnessMetric.local` order)."""
        i = next(k for k, m in enumerate(self.members) if m is metric)
        if self._cache is None or i in self._consumed or self._cache_version != self.version:
            self._cache, self._cache_version, self._consumed = self._reduce(), self.version, set()
        self._consumed.add(i)
        out = self._cache[i]
        if len(self._consumed) == len(self.members):
            self._cache = None
        return out

    def _reduce(self) -> list:
        for hook in self.before_reduce:
            hook()
        local = [m.local() for m in self.members]
        flat = [float(x) for values in local for x in values]
        rows = [flat]
        if dist.is_available() and dist.is_initialized():
            t = torch.tensor(flat, dtype=torch.float64, device=self.where.resolve())
            world = dist.get_world_size()
            if dist.get_backend() == "gloo":  # no all_gather_into_tensor on gloo
                parts = [torch.empty_like(t) for _ in range(world)]
                dist.all_gather(parts, t)
                gathered = torch.stack(parts)
            else:
                gathered = t.new_empty((world, t.numel()))
                dist.all_gather_into_tensor(gathered, t)
            self.collectives += 1
            rows = gathered.tolist()  # the one host copy
        out, col = [], 0
        for m, values in zip(self.members, local):
            cols = [[r[col + j] for r in rows] for j in range(len(values))]
            out.append([_REDUCE[op](c) for op, c in zip(m.ops(), cols)])
            col += len(values)
        return out


def _nan_aware(fn):
    def reduce(values):
        return math.nan if any(math.isnan(v) for v in values) else fn(values)

    return reduce


#: How a column is reduced over ranks: sums propagate NaN by themselves; min and max keep a NaN as NaN.
_REDUCE = {"sum": math.fsum, "min": _nan_aware(min), "max": _nan_aware(max)}


class _HarnessMetric(Metric):
    """ms-swift ``Metric`` reduced over ranks by a :class:`MetricReducer` (shared, or its own when not given).

    Subclasses give their window state (:meth:`local`) and how each entry reduces over ranks (:meth:`ops`)."""

    def __init__(self, where: Optional[MetricDevice] = None, reducer: Optional[MetricReducer] = None):
        super().__init__()
        self.reducer = reducer if reducer is not None else MetricReducer(where)
        self.where = self.reducer.where
        self.reducer.register(self)

    def local(self) -> list:
        raise NotImplementedError

    def ops(self) -> tuple:
        raise NotImplementedError

    def _reduced(self) -> list:
        return self.reducer.values(self)


class SumMetric(_HarnessMetric):
    """Sum over the logging window and over ranks (``None`` when nothing was recorded anywhere)."""

    def __init__(self, where: Optional[MetricDevice] = None, reducer: Optional[MetricReducer] = None):
        super().__init__(where, reducer)
        self.add_state("value", default=0.0)
        self.add_state("count", default=0)

    def update(self, value) -> None:
        self.value += float(value)
        self.count += 1
        self.reducer.version += 1

    def local(self) -> list:
        return [self.value, self.count]

    def ops(self) -> tuple:
        return ("sum", "sum")

    def _window(self):
        value, count = self._reduced()
        replicas = loss_replicas()
        return value / replicas, count / replicas

    def compute(self):
        value, count = self._window()
        return value if count else None


class CumulativeSumMetric(SumMetric):
    """Running total since the start of training, summed over ranks (reset() only clears the window)."""

    def __init__(self, where: Optional[MetricDevice] = None, reducer: Optional[MetricReducer] = None):
        super().__init__(where, reducer)
        self.total = 0.0

    def compute(self):
        value, _ = self._window()
        self.total += value
        return self.total


class MeanMetric(_HarnessMetric):
    """Mean over the window and over ranks (``None`` when empty; NaN/Inf propagate as themselves)."""

    def __init__(self, where: Optional[MetricDevice] = None, reducer: Optional[MetricReducer] = None):
        super().__init__(where, reducer)
        self.add_state("state", default=0.0)
        self.add_state("count", default=0)

    def update(self, value) -> None:
        self.state += float(value)
        self.count += 1
        self.reducer.version += 1

    def local(self) -> list:
        return [self.state, self.count]

    def ops(self) -> tuple:
        return ("sum", "sum")

    def compute(self):
        state, count = self._reduced()
        return state / count if count else None


class MinMetric(_HarnessMetric):
    """Minimum over the window and over ranks (``None`` when empty, NaN when any recorded value was NaN)."""

    _op_name, _init = "MIN", math.inf
    value: float  # states (add_state)
    nan: float

    def __init__(self, where: Optional[MetricDevice] = None, reducer: Optional[MetricReducer] = None):
        super().__init__(where, reducer)
        self.add_state("value", default=self._init)
        self.add_state("nan", default=0.0)

    def update(self, value) -> None:
        value = float(value)
        if math.isnan(value):
            self.nan = 1.0
        else:
            self.value = min(self.value, value) if self._op_name == "MIN" else max(self.value, value)
        self.reducer.version += 1

    def local(self) -> list:
        return [self.value, self.nan]

    def ops(self) -> tuple:
        return (self._op_name.lower(), "max")

    def compute(self):
        value, nan = self._reduced()
        if nan != 0:
            return math.nan
        return None if math.isinf(value) and value == self._init else value


class MaxMetric(MinMetric):
    """Maximum over the window and over ranks (``None`` when empty, NaN when any recorded value was NaN)."""

    _op_name, _init = "MAX", -math.inf


class RatioMetric(_HarnessMetric):
    """``sum(numerator) / sum(denominator)`` over the window and over ranks (``None`` when the denominator is 0)."""

    def __init__(self, where: Optional[MetricDevice] = None, reducer: Optional[MetricReducer] = None):
        super().__init__(where, reducer)
        self.add_state("num", default=0.0)
        self.add_state("den", default=0.0)

    def update(self, num, den) -> None:  # noqa: D401 - Metric protocol
        self.num += float(num)
        self.den += float(den)
        self.reducer.version += 1

    def local(self) -> list:
        return [self.num, self.den]

    def ops(self) -> tuple:
        return ("sum", "sum")

    def compute(self):
        num, den = self._reduced()
        return num / den if den else None


def build_metrics(param_grad: bool = False, where: Optional[MetricDevice] = None) -> Dict[str, Metric]:
    """One metric object per contract name (all ranks must register the same set), sharing one :class:`MetricDevice`.

    Queries no device: the collectives' device is bound when training begins or on the first loss call.
    """
    where = where if where is not None else MetricDevice()
    reducer = MetricReducer(where)  # one collective per logging step for all of them
    kinds = {
        JSD_LOSS: MeanMetric,
        SFT_LOSS: MeanMetric,
        NEG_LOSS_CALLS: SumMetric,
        NEG_TOKEN_FRAC: RatioMetric,
        MIN_TOKEN_JSD: MinMetric,
        NEG_LOSS_CALLS_TOTAL: CumulativeSumMetric,
        LOSS_CALLS_TOTAL: CumulativeSumMetric,
        NONFINITE_CALLS_TOTAL: CumulativeSumMetric,
        SPOT_LOSS: MeanMetric,
        SPOT_LOSS_FP64: MeanMetric,
        SPOT_LOSS_ABS_ERR: MaxMetric,
        SPOT_LOSS_REL_ERR: MaxMetric,
        SPOT_GRAD_REL_L2: MaxMetric,
        SPOT_SIGN_MISMATCH: MaxMetric,
        SPOT_GRAD_REL_L2_DTYPE_FLOOR: MaxMetric,
    }
    if param_grad:
        kinds[SPOT_PARAM_GRAD_REL_L2] = MaxMetric
    return {name: kind(where, reducer) for name, kind in kinds.items()}


# ----------------------------------------------------------------------------------------------------------
# the instrumented loss
# ----------------------------------------------------------------------------------------------------------
def _nan_min(values: Iterable[float]) -> float:
    values = list(values)
    return math.nan if any(math.isnan(v) for v in values) else min(values)


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
        capture_dir: if set, save the loss inputs of spot steps there as ``step{S}_rank{R}.safetensors``
            (:class:`gkd_harness.harness.rank.capture.LossCapture`: whole under TP, written off the hot path; :meth:`close`).
        capture_max_tokens: rows kept per capture (the first active ones, as the spot check takes them).
        meta: strings stored in captures (precision, beta_form, ...).
        fail_on_nonfinite: raise :class:`NonFiniteError` (naming the step) for a non-finite loss call, after
            recording it, when the logging step reads the queued calls (:meth:`flush`).
    """

    def __init__(
        self,
        terms_fn: Callable,
        ref_terms_fn: Callable,
        metrics: Dict[str, Metric],
        *,
        spot_every: int = 0,
        spot_max_tokens: int = 256,
        param_grad: bool = False,
        capture_dir: Optional[str] = None,
        meta: Optional[dict] = None,
        rank: int = 0,
        fail_on_nonfinite: bool = False,
        capture_max_tokens: int = 256,
    ):
        self.terms_fn, self.ref_terms_fn, self.metrics = terms_fn, ref_terms_fn, metrics
        self.spot_every, self.spot_max_tokens = int(spot_every or 0), int(spot_max_tokens)
        self.param_grad, self.rank = bool(param_grad), rank
        self.capture = self._make_capture(capture_dir, capture_max_tokens, meta, rank)
        self.fail_on_nonfinite = bool(fail_on_nonfinite)
        self.where: MetricDevice = getattr(metrics.get(LOSS_CALLS_TOTAL), "where", None) or MetricDevice()
        self.step = 1  # optimizer step being computed (1-based); the callback keeps it current
        self._spotted_step: Optional[int] = None
        self.params: Callable[[], list] = lambda: []
        self.calls = 0
        self._pending: list = []  # (step, statistics [5] on the device, loss dtype) of calls not yet flushed
        reducer = getattr(metrics.get(LOSS_CALLS_TOTAL), "reducer", None)
        if reducer is not None:
            reducer.before_reduce.append(self.flush)

    def _is_spot_step(self) -> bool:
        return self.spot_every > 0 and self.step % self.spot_every == 0 and self._spotted_step != self.step

    def __call__(self, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        spot = self._is_spot_step()
        if spot:  # the caller's inputs, copied before the loss can write into them
            self._spotted_step = self.step
            with torch.no_grad():
                pieces = spot_inputs(student_logits, teacher_output, labels, self.spot_max_tokens, *args, **kwargs)
                pg_inputs = (
                    ParamGradInputs(teacher_output, labels, args, kwargs)
                    if self.param_grad and SPOT_PARAM_GRAD_REL_L2 in self.metrics
                    else None
                )
        out = self.terms_fn(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        self.calls += 1
        self.where.bind_loss_inputs(student_logits.device)
        self._record(out)
        if spot:
            self._spot(pieces, pg_inputs, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        return out.total, out.num_valid

    @torch.no_grad()
    def _record(self, out) -> None:
        """Queue the call's five statistics on the device (no host read, no collective: this runs on every loss
        call, inside the pipeline schedule on the last stage); :meth:`flush` reads every queued call at once."""
        per = out.per_position.detach()
        total = out.total.detach()
        stats = torch.stack(
            [
                total.to(torch.float64),
                out.num_valid.to(device=total.device, dtype=torch.float64),
                (per < 0).sum().to(torch.float64),
                per.new_full((), float(per.numel()), dtype=torch.float64),  # a fill, not a host->device copy
                per.min().to(torch.float64) if per.numel() else per.new_full((), math.inf, dtype=torch.float64),
            ]
        )
        self._pending.append((self.step, stats, total.dtype))

    @torch.no_grad()
    def flush(self) -> None:
        """Update the per-call metrics with every call queued since the last flush: under CP > 1 one all-gather
        of the queued ``[calls, 5]`` statistics over the CP group (each call judged on its CP-reduced total), then
        one device→host transfer. The metrics' reducer calls it before each logging step's reduction
        (:class:`MetricReducer`), so it runs once per logging step, on every rank alike.

        Before: one CP all-gather and one ``.tolist()`` per loss call (per micro-batch).

        Raises:
            NonFiniteError: with ``fail_on_nonfinite``, after recording, naming the step of the first
                non-finite call (the run stops at that step's log: every step is logged, ``run.logging_steps``).
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        stats = torch.stack([p[1] for p in pending])  # [calls, 5]
        group, cp = context_parallel_group()
        if cp > 1:
            shards = [torch.empty_like(stats) for _ in range(cp)]
            dist.all_gather(shards, stats, group=group)
            stats = torch.stack(shards, dim=1)  # [calls, cp, 5]
        else:
            stats = stats[:, None]
        # the loss as the trainer sees it: sum(total) / sum(num_valid) in the loss's own dtype (cp_reduce's
        # arithmetic), on the device, so the host reads every call in one transfer
        t_sum, n_sum = stats[..., 0].sum(1), stats[..., 1].sum(1)
        losses = []
        for i, (_, _, dtype) in enumerate(pending):
            t, nv = t_sum[i].to(dtype), n_sum[i].to(dtype)
            losses.append(torch.where(n_sum[i] > 0, t / nv, t * 0).to(torch.float64))
        values = torch.cat([stats.flatten(), torch.stack(losses)]).tolist()  # the one transfer
        width = cp * 5
        first_bad = None
        for i, (step, _, _) in enumerate(pending):
            rows = [values[i * width + j * 5 : i * width + j * 5 + 5] for j in range(cp)]
            total_v, n = self._record_values(rows, values[len(pending) * width + i])
            if first_bad is None and not math.isfinite(total_v):
                first_bad = (step, total_v, n)
        if self.fail_on_nonfinite and first_bad is not None:
            step, total_v, n = first_bad
            raise NonFiniteError(
                f"non-finite GKD loss at step {step}: total {total_v} over {n} positions (rank {self.rank}); "
                f"monitor.fail_on_nonfinite=true stops the run"
            )

    def _record_values(self, rows, loss: float) -> tuple[float, int]:
        """The metrics of one call from its statistics (``rows``: one ``[total, num_valid, negative positions,
        positions, min per-position JSD]`` per CP rank) and its CP-reduced ``loss``; ``(total, num_valid)``."""
        m = self.metrics
        total_v = sum(r[0] for r in rows)
        n = int(sum(r[1] for r in rows))
        neg_tokens, positions = sum(r[2] for r in rows), int(sum(r[3] for r in rows))
        min_token = _nan_min(r[4] for r in rows)
        finite = math.isfinite(total_v)
        m[LOSS_CALLS_TOTAL].update(1)
        m[NONFINITE_CALLS_TOTAL].update(0 if finite else 1)
        neg = 1 if (finite and loss < 0) else 0
        m[NEG_LOSS_CALLS].update(neg)
        m[NEG_LOSS_CALLS_TOTAL].update(neg)
        if n or not finite:
            m[JSD_LOSS].update(loss)  # NaN / Inf recorded as themselves
        if positions:
            m[NEG_TOKEN_FRAC].update(int(neg_tokens), positions)
            m[MIN_TOKEN_JSD].update(min_token)
        return total_v, n

    def record_sft(self, value) -> None:
        """Record the SFT (cross-entropy) term of one call (``gkd.sft_alpha > 0``)."""
        if value is not None:
            self.metrics[SFT_LOSS].update(float(value))

    def _spot(
        self, pieces, pg_inputs, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs
    ) -> None:
        """The spot check on ``pieces`` (copied before the call), the parameter-gradient check on ``pg_inputs``
        (idem; None when off), and the capture."""
        vals = spot_check_pieces(self.terms_fn, self.ref_terms_fn, pieces, beta, temperature)
        del pieces
        if vals is not None:
            for k, v in vals.items():
                self.metrics[k].update(v)
        if pg_inputs is not None:
            rel = param_grad_rel_l2(
                self.terms_fn, self.ref_terms_fn, student_logits, pg_inputs, beta, temperature, list(self.params())
            )
            if rel is not None:
                self.metrics[SPOT_PARAM_GRAD_REL_L2].update(rel)
        if self.capture is not None:
            self.capture(
                self.step, student_logits, teacher_output, labels, beta, temperature, **loss_kwargs(args, kwargs)
            )

    @staticmethod
    def _make_capture(capture_dir: Optional[str], max_tokens: int, meta: Optional[dict], rank: int):
        """The :class:`gkd_harness.harness.rank.capture.LossCapture` of ``capture_dir`` (None when captures are off)."""
        if not capture_dir:
            return None
        from gkd_harness.harness.rank.capture import LossCapture

        return LossCapture(capture_dir, max_tokens, meta, rank)

    def close(self) -> list:
        """Write the queued captures and stop their writer (train end); returns the errors of failed writes."""
        return self.capture.close() if self.capture is not None else []
