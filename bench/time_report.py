"""Time the sign-off report over a synthetic sweep of 200 runs x 2,000 steps.

    python -m bench.time_report [--root DIR] [--runs-seeds 5] [--steps 2000] [--repeat 1]

Writes the sweep once (not timed; reused when ``--root`` already holds it), then times, in this process,
loading + criteria + tables + plots + Markdown/HTML/verdict (``load_sweep`` + ``build_report``), and separately
the whole ``gkd-analyze`` command as a fresh process (interpreter start and imports included). Wall and CPU
seconds are both printed, with the load average: on a shared machine the CPU time is the stable figure.
The goal is <= 10 s on the 2-core CI machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=None, help="sweep folder (default: a temporary folder)")
    p.add_argument("--seeds", type=int, default=5, help="5 seeds -> 200 runs (5 β x 2 forms x 2 precisions x 2 T)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--spot-every", type=int, default=50, help="steps between synthetic FP64 spot checks")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args(argv)

    from bench.synthetic import write_sweep

    tmp = None
    root = a.root
    if root is None:
        tmp = tempfile.TemporaryDirectory()
        root = Path(tmp.name) / "sweep"
    sweep_dir, report_dir = root / "runs", root / "report"
    if not (sweep_dir.exists() and any(sweep_dir.iterdir())):
        t0 = time.perf_counter()
        runs = write_sweep(sweep_dir, steps=a.steps, seeds=range(a.seeds), spot_every=a.spot_every)
        print(f"wrote {len(runs)} synthetic runs x {a.steps} steps in {time.perf_counter() - t0:.1f} s (not timed)")

    from analysis.criteria import load_criteria
    from analysis.load import load_sweep
    from analysis.signoff import build_report

    cfg = load_criteria()
    in_process = []
    for _ in range(a.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        sweep = load_sweep(sweep_dir)
        t1 = time.perf_counter()
        result = build_report(sweep, report_dir, cfg)
        t2, c2 = time.perf_counter(), time.process_time()
        in_process.append((t1 - t0, t2 - t1, t2 - t0, c2 - c0))
    cli, cli_cpu = [], []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        r0 = os.times()
        proc = subprocess.run([sys.executable, "-m", "analysis.cli", str(sweep_dir), "--report", str(report_dir)],
                              capture_output=True, text=True)
        r1 = os.times()
        cli.append(time.perf_counter() - t0)
        cli_cpu.append((r1.children_user - r0.children_user) + (r1.children_system - r0.children_system))
        if proc.returncode not in (0, 1):
            print(proc.stderr, file=sys.stderr)
            return 2
    n_rows = len(sweep.history)
    out = {
        "runs": int(len(sweep.runs)), "history_rows": int(n_rows), "verdict": result["verdict"],
        "in_process_s": {"load": min(x[0] for x in in_process), "report": min(x[1] for x in in_process),
                         "total": min(x[2] for x in in_process), "total_cpu": min(x[3] for x in in_process)},
        "cli_process_s": min(cli), "cli_process_cpu_s": min(cli_cpu),
        "load_average_1min": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    print(json.dumps(out, indent=1))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
