"""torchrun worker (2 gloo CPU ranks): one logging step of the instrument's metrics through ms-swift's own
``SwiftMixin.compute_custom_metrics``, counting the collectives the harness issues. Started by
``tests/harness/rank/test_instrument_collectives.py`` as::

    python -m torch.distributed.run --nproc-per-node 2 tests/harness/rank/metrics_collective_worker.py OUT

Rank r records the values ``VALUES[r]`` (below) and writes ``OUT/rank{R}.json``: ``{"logs": the computed logs
of two logging steps, "collectives": [count per step]}``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch.distributed as dist

#: per rank: (jsd values, neg flags, (neg tokens, positions), min token jsd values, spot abs errors)
VALUES = {
    0: ([0.5, 0.25], [0, 1], (3, 10), [-0.5, 0.1], [1e-6]),
    1: ([1.0], [1], (1, 6), [0.2], [3e-6, float("nan")]),
}


def record(metrics, rank: int) -> None:
    jsd, neg, (neg_tok, pos), mins, spot = VALUES[rank]
    for v in jsd:
        metrics["gkd/jsd_loss"].update(v)
        metrics["gkd/loss_calls_total"].update(1)
    for v in neg:
        metrics["gkd/neg_loss_calls"].update(v)
        metrics["gkd/neg_loss_calls_total"].update(v)
    metrics["gkd/neg_token_frac"].update(neg_tok, pos)
    for v in mins:
        metrics["gkd/min_token_jsd"].update(v)
    for v in spot:
        metrics["spot/loss_abs_err"].update(v)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from swift.trainers.mixin import SwiftMixin

    from gkd_harness.harness.rank.instrument import build_metrics

    counts = {"n": 0}
    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce"):
        real = getattr(dist, name)

        def counting(*a, _real=real, **k):
            counts["n"] += 1
            return _real(*a, **k)

        setattr(dist, name, counting)
    metrics = build_metrics()
    logs, collectives = [], []
    for _ in range(2):  # two logging steps: the cumulative totals continue
        record(metrics, rank)
        counts["n"] = 0
        step = SwiftMixin.compute_custom_metrics(metrics)
        collectives.append(counts["n"])
        logs.append(
            {
                k: (None if v is None else (repr(v) if isinstance(v, float) and math.isnan(v) else v))
                for k, v in step.items()
            }
        )
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"logs": logs, "collectives": collectives}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
