"""One test per bench module the end-to-end ``gkd-bench --quick`` test (test_bench.py) does not reach by name:
``synthetic``, ``host_syncs``, ``instrument_cost``'s arithmetic, ``analysis_time``'s baseline and ``e2e``'s CPU
accounting. Values are checked against hand computations, not only shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from gkd_harness.harness.contract import LOSS_CALLS_TOTAL, METRICS_FILE, SUMMARY_FILE


def test_synthetic_sweep_is_a_sweep_the_loader_reads(tmp_path):
    from gkd_harness.analysis.load import load_sweep
    from gkd_harness.bench.synthetic import write_sweep

    write_sweep(tmp_path / "runs", betas=(0.5, 1.0), steps=6, seeds=range(2))
    folders = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    sweep = load_sweep(tmp_path / "runs")
    assert len(sweep.runs) == len(folders) > 0
    rows = [json.loads(line) for line in (folders[0] / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    totals = [r[LOSS_CALLS_TOTAL] for r in rows if LOSS_CALLS_TOTAL in r]
    assert totals == sorted(totals)
    assert json.loads((folders[0] / SUMMARY_FILE).read_text())["status"] == "completed"


def test_host_syncs_counts_a_host_read_and_nothing_for_pure_tensor_work():
    from gkd_harness.bench.host_syncs import count_host_syncs

    x = torch.randn(8)
    assert count_host_syncs(lambda: (x * 2).sum()) == []
    ops = count_host_syncs(lambda: (x * 2).sum().item())
    assert len(ops) == 1, ops


def test_amortised_ratio_is_the_hand_computation():
    from gkd_harness.bench.instrument_cost import amortised_ratio

    # 49 instrumented steps at 1.2 s and one spot step at 3 s, against 50 bare steps at 1 s
    assert abs(amortised_ratio(1.0, 1.2, 3.0, every=50) - (49 * 1.2 + 3.0) / 50.0) < 1e-12


def test_analysis_read_baseline_reads_every_line(tmp_path):
    from gkd_harness.bench.analysis_time import _read_all
    from gkd_harness.bench.synthetic import write_sweep

    write_sweep(tmp_path / "runs", betas=(0.5,), steps=5, seeds=range(1))
    n_runs = sum(1 for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert _read_all(tmp_path / "runs") == 5 * n_runs


def test_e2e_cpu_accounting_sees_a_child_burning_cpu():
    from gkd_harness.bench.e2e import _tree_cpu_s

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt=time.process_time()\n"
            "while time.process_time() - t < 0.6: pass\nimport sys; sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 30
        while _tree_cpu_s(os.getpid()) - _tree_cpu_s(child.pid) >= 0 and time.time() < deadline:
            if _tree_cpu_s(child.pid) >= 0.5:
                break
            time.sleep(0.1)
        assert _tree_cpu_s(child.pid) >= 0.5
        assert _tree_cpu_s(os.getpid()) >= _tree_cpu_s(child.pid)  # the tree includes the child
    finally:
        child.communicate(b"")
