"""The instrument's metric reductions: one collective per logging step (issue 41 item 9), values of the whole job.

Before: each of the 15 metrics issued its own FP64 ``all_reduce`` with a host copy and ``.tolist()``."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from gkd_harness.harness.rank.instrument import MaxMetric, MeanMetric, MetricReducer, SumMetric, build_metrics

WORKER = Path(__file__).with_name("metrics_collective_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


def _expected(step: int) -> dict:
    """The job-wide values, from the worker's per-rank inputs, by plain arithmetic."""
    sys.path.insert(0, str(WORKER.parent))
    from metrics_collective_worker import VALUES

    jsd = [v for r in VALUES.values() for v in r[0]]
    neg = sum(v for r in VALUES.values() for v in r[1])
    return {
        "gkd/jsd_loss": sum(jsd) / len(jsd),
        "gkd/loss_calls_total": float(len(jsd) * step),
        "gkd/neg_loss_calls": float(neg),
        "gkd/neg_loss_calls_total": float(neg * step),
        "gkd/neg_token_frac": sum(r[2][0] for r in VALUES.values()) / sum(r[2][1] for r in VALUES.values()),
        "gkd/min_token_jsd": min(v for r in VALUES.values() for v in r[3]),
        "spot/loss_abs_err": "nan",  # rank 1 recorded a NaN: the job's max is NaN
    }


def test_one_logging_step_is_one_collective_on_two_ranks(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    proc = subprocess.run(
        cmd + [str(WORKER), str(tmp_path)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["collectives"] == [1, 1]
        for step, logs in enumerate(out["logs"], start=1):
            for key, want in _expected(step).items():
                got = logs[key]
                if want == "nan":
                    assert got == "nan", key
                else:
                    assert math.isclose(got, want, rel_tol=1e-12), (key, got, want)


def test_a_shared_reducer_without_a_process_group_reads_each_window_once():
    reducer = MetricReducer()
    s, m, x = SumMetric(reducer=reducer), MeanMetric(reducer=reducer), MaxMetric(reducer=reducer)
    s.update(2), m.update(1.0), m.update(3.0), x.update(-1.0)
    assert (s.compute(), m.compute(), x.compute()) == (2.0, 2.0, -1.0)
    s.reset(), m.reset(), x.reset()
    s.update(5)  # an update after a partial round takes a fresh snapshot
    assert s.compute() == 5.0
    s.update(1)
    assert s.compute() == 6.0 and m.compute() is None and x.compute() is None


def test_build_metrics_share_one_reducer():
    metrics = build_metrics()
    reducers = {id(m.reducer) for m in metrics.values()}
    assert len(reducers) == 1 and len(next(iter(metrics.values())).reducer.members) == len(metrics)
