"""Before/after of ``gkd-analyze --report`` from two source trees, side by side in one run.

    python -m gkd_harness.bench.analysis_ab BEFORE_TREE AFTER_TREE [--reps 3] [--work-dir DIR]

Each tree is a checkout of this repository (``git worktree add /tmp/before <commit>``); its ``gkd-analyze`` runs
as a fresh process from that folder (``gkd_harness`` maps a checkout's folders, so the tree's own code is
imported), on the synthetic sweep of ``gkd-bench --only analysis`` (200 runs x 2,000 steps). Per repetition: a
plain ``json.loads`` pass in this process, then both trees in alternating order; 1 warm-up. Prints the medians,
the ratios to ``json.loads`` and after / before per repetition. CPU time of each child from ``wait4``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gkd_harness.bench.analysis_time import _read_all, _sweep

__all__ = ["main"]


def _report_cpu(tree: Path, sweep: Path, report: Path) -> float:
    """CPU seconds of one ``gkd-analyze SWEEP --report REPORT`` run from ``tree``."""
    shutil.rmtree(report, ignore_errors=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gkd_harness.analysis.cli", str(sweep), "--report", str(report)],
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise RuntimeError(f"gkd-analyze from {tree} failed: {err[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gkd_harness.bench.analysis_ab", description=__doc__.split("\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "gkd-bench-analysis")
    args = p.parse_args(argv)
    for tree in (args.before, args.after):
        if not (tree / "analysis" / "cli.py").is_file():
            print(f"analysis_ab: {tree} is not a checkout of gkd-harness (no analysis/cli.py)", file=sys.stderr)
            return 2
    sweep = _sweep(str(args.work_dir), quick=False)
    trees = {"before": args.before.absolute(), "after": args.after.absolute()}
    cpu = {k: [] for k in trees}
    base = []
    for i in range(args.reps + 1):  # the first round is the warm-up
        c0 = time.process_time()
        _read_all(sweep)
        b = time.process_time() - c0
        for k in list(trees) if i % 2 == 0 else list(trees)[::-1]:
            v = _report_cpu(trees[k], sweep, args.work_dir / f"report_{k}")
            if i:
                cpu[k].append(v)
        if i:
            base.append(b)
    jl = statistics.median(base)
    print(f"json.loads: {jl:.2f} s (median of {[round(x, 2) for x in base]})")
    for k, v in cpu.items():
        print(
            f"{k}: {statistics.median(v):.2f} s, {statistics.median(v) / jl:.2f}x json.loads "
            f"({[round(x, 2) for x in v]})"
        )
    print("after / before per repetition:", [round(a / b, 3) for a, b in zip(cpu["after"], cpu["before"])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
