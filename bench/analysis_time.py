"""``gkd-bench`` group ``analysis``: the sign-off report over a synthetic sweep of 200 runs x 2,000 steps.

* ``analysis/read`` (baseline): read every run folder's ``metrics.jsonl`` and ``summary.json`` with
  ``json.loads`` line by line: the floor any report pays to see the data.
* ``analysis/report``: the whole ``gkd-analyze SWEEP --report DIR`` command as a fresh process (interpreter
  start, imports, loading, criteria, tables, plots, Markdown/HTML/verdict): the time a user waits. The in-process
  part (``load_sweep`` + ``build_report``) is reported beside it.

The synthetic sweep (``bench.synthetic.write_sweep``: 5 β x 2 forms x 2 precisions x 2 T x 5 seeds) is written
once per benchmark run into the work folder and is not timed. ``--quick`` uses 1 seed and 50 steps.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict
from harness.contract import METRICS_FILE, SUMMARY_FILE


def _sweep(work_dir: str, quick: bool) -> Path:
    from bench.synthetic import write_sweep

    sweep = Path(work_dir) / ("sweep_quick" if quick else "sweep") / "runs"
    done = sweep.parent / "complete"
    if not done.exists():
        write_sweep(sweep, steps=50 if quick else 2000, seeds=range(1 if quick else 5))
        done.write_text("ok")
    return sweep


def _read_all(sweep: Path) -> int:
    rows = 0
    for run in sorted(p for p in sweep.iterdir() if p.is_dir()):
        json.loads((run / SUMMARY_FILE).read_text())
        with open(run / METRICS_FILE) as f:
            for line in f:
                json.loads(line)
                rows += 1
    return rows


def measure_analysis(variant: str, quick: bool, work_dir: str, warmup: int, reps: int) -> Dict:
    """Time one analysis variant; returns ``{"wall_s": [...], "seconds": median, ...}``."""
    import statistics

    sweep = _sweep(work_dir, quick)
    n_runs = sum(1 for p in sweep.iterdir() if p.is_dir())
    out: Dict = {"note": f"{n_runs} synthetic runs x {50 if quick else 2000} steps"}
    wall = []
    if variant == "read":
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            rows = _read_all(sweep)
            if i >= warmup:
                wall.append(time.perf_counter() - t0)
        out["extra"] = {"rows": rows}
    elif variant == "report":
        report = Path(work_dir) / "report"
        for i in range(warmup + reps):
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "analysis.cli", str(sweep), "--report", str(report)],
                                  capture_output=True, text=True)
            dt = time.perf_counter() - t0
            if proc.returncode not in (0, 1):  # 0 pass / 1 fail are both a finished report
                raise RuntimeError(f"gkd-analyze exited {proc.returncode}: {proc.stderr[-2000:]}")
            if i >= warmup:
                wall.append(dt)
        from analysis.signoff.criteria import load_criteria
        from analysis.load import load_sweep
        from analysis.signoff.report import build_report
        t0 = time.perf_counter()
        build_report(load_sweep(sweep), Path(work_dir) / "report_inproc", load_criteria())
        out["extra"] = {"in_process_s": time.perf_counter() - t0}
        out["note"] += f"; gkd-analyze as a fresh process (in-process load+report {out['extra']['in_process_s']:.2f} s)"
    else:
        raise KeyError(variant)
    out["wall_s"] = wall
    out["cpu_s"] = []
    out["seconds"] = statistics.median(wall)
    return out
