"""The instrumentation's cost per loss call, measured side by side in one process (``gkd-bench --only instr``).

Variants, all with the harness ``fp32`` paper loss on the inputs of :mod:`gkd_harness.bench.cases` (``topk``: N=16,384 with
top-k 64; ``full``: N=512 with V=151,936), each one loss call forward + backward as the trainers run it:

* ``bare``: ``gkd_harness.harness.losses.make_gkd_loss("fp32")`` (what the plugin installs with ``monitor=off``);
* ``instrumented``: ``gkd_harness.harness.rank.instrument.LossInstrument`` around the same variant, spot checks off;
* ``spot_step``: the instrumented call on a spot-check step (FP64 spot check on ``spot_max_tokens`` positions);
* ``record``: the instrument's own per-call work alone (``LossInstrument._record`` on the call's output, 200
  repetitions): what the instrumented call adds to the bare one, resolved far below the noise of a whole call.

The three run interleaved, in a rotating order, ``reps`` times in one process, so drift on a shared machine hits
each alike; the ratio is ``median(instrumented) / median(bare)``, the spread the q1–q3 of the per-repetition
ratios. The amortised cost of a spot check every 50 steps (one loss call per step) is
``(49·instrumented + spot_step) / (50·bare)``. The host synchronisations of one call of each variant (and of the
plugin's ``monitor=off`` loss) are counted with :mod:`gkd_harness.bench.host_syncs`.
"""

from __future__ import annotations

import statistics
from typing import Dict

import torch

from gkd_harness.bench import measure as bm
from gkd_harness.bench.cases import BETA, TEMPERATURE, Sizes, full_inputs, topk_inputs

SPOT_EVERY = 50
RECORD_REPS = 200
VARIANTS = ("bare", "instrumented", "spot_step")


def _instrument(spot_every: int, spot_max_tokens: int):
    from gkd_harness.harness.losses import make_gkd_loss_terms
    from gkd_harness.harness.rank.instrument import LossInstrument, build_metrics

    return LossInstrument(
        make_gkd_loss_terms("fp32", "paper"),
        make_gkd_loss_terms("fp64", "paper"),
        build_metrics(),
        spot_every=spot_every,
        spot_max_tokens=spot_max_tokens,
    )


def _step(loss_fn, student, to, labels, before=None):
    """One forward + backward of ``loss_fn`` normalised like the trainers (``total / num_valid``)."""

    def run():
        if before is not None:
            before()
        x = student.detach().requires_grad_(True)
        total, nv = loss_fn(x, to, labels, BETA, TEMPERATURE)
        loss = total / nv
        loss.backward()
        return loss.detach()

    return run


def measure_instrument_cost(group: str, sizes: Sizes, device: str, warmup: int, reps: int) -> Dict:
    """Paired timings of the three variants on ``group``'s inputs (``"topk"`` or ``"full"``); see the module doc.

    Returns ``{"variants": {name: {"cpu_s": [...], "wall_s": [...]}}, "pair_ratios": {...}, "syncs": {...},
    "loss": {...}}``.
    """
    from gkd_harness.bench.host_syncs import count_host_syncs
    from gkd_harness.harness.losses import make_gkd_loss
    from gkd_harness.harness.rank.plugin import DtypeBoundary

    student, to, labels = (topk_inputs if group == "topk" else full_inputs)(sizes, device)
    bare = make_gkd_loss("fp32", "paper")
    inst = _instrument(0, sizes.spot_max_tokens)
    spot = _instrument(1, sizes.spot_max_tokens)

    def next_spot_step():
        spot.step += 1  # every call is the first loss call of a spot-check step

    steps = {
        "bare": _step(bare, student, to, labels),
        "instrumented": _step(inst, student, to, labels),
        "spot_step": _step(spot, student, to, labels, before=next_spot_step),
    }
    losses = {k: float(fn()) for k, fn in steps.items()}  # one call each: lazy state, and the values
    for _ in range(max(warmup - 1, 0)):
        for fn in steps.values():
            fn()
    times = {k: {"cpu_s": [], "wall_s": []} for k in VARIANTS}
    for r in range(reps):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for k in order:
            t = bm.time_calls(steps[k], device, 0, 1)
            times[k]["cpu_s"] += t["cpu_s"]
            times[k]["wall_s"] += t["wall_s"]
    key = "cpu_s" if device == "cpu" else "wall_s"
    pair = {k: [a / b for a, b in zip(times[k][key], times["bare"][key])] for k in ("instrumented", "spot_step")}
    off = DtypeBoundary(bare, None, None)  # what the plugin installs with monitor=off (dtypes already as given)
    x = student.detach().requires_grad_(True)
    syncs = {
        "bare": count_host_syncs(bare, x, to, labels, BETA, TEMPERATURE),
        "instrumented": count_host_syncs(inst, x, to, labels, BETA, TEMPERATURE),
        "monitor_off": count_host_syncs(off, x, to, labels, BETA, TEMPERATURE),
    }
    # the instrument's own work per call (what it adds to the loss): its record step alone, many repetitions
    from gkd_harness.harness.losses import make_gkd_loss_terms

    with torch.no_grad():
        out = make_gkd_loss_terms("fp32", "paper")(student.detach(), to, labels, BETA, TEMPERATURE)
    record = bm.time_calls(lambda: inst._record(out), device, 3, RECORD_REPS)
    return {
        "variants": times,
        "pair_ratios": pair,
        "loss": losses,
        "time_key": key,
        "record": record,
        "syncs": {k: len(v) for k, v in syncs.items()},
        "sync_ops": syncs,
    }


def amortised_ratio(t_bare: float, t_instr: float, t_spot: float, every: int = SPOT_EVERY) -> float:
    """Cost of ``every`` instrumented steps with one spot check among them ÷ ``every`` bare steps."""
    return ((every - 1) * t_instr + t_spot) / (every * t_bare)


def median(xs):
    return statistics.median(xs) if xs else None
