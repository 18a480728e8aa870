"""``gkd-bench`` group ``analysis``: loading and signing off a synthetic sweep, against a plain ``json.loads`` pass.

One worker (``analysis/all``) measures everything side by side, in interleaved rounds (the order rotates each
repetition, so drift on a shared machine hits every variant alike):

* ``analysis/json_loads`` (baseline): read every run folder's ``summary.json`` and ``metrics.jsonl`` with
  ``json.loads`` line by line (200 runs x 2,000 steps = 400,000 lines): the floor any report pays to see the data;
* ``analysis/load``: ``load_sweep`` of the same sweep (the run tables, :mod:`gkd_harness.analysis.sweep.metrics`), in process;
* ``analysis/report``: the whole ``gkd-analyze SWEEP --report DIR`` command as a fresh process (interpreter start,
  imports, loading, criteria, tables, plots, Markdown/HTML/verdict), its CPU read from the child's rusage.

Each is process CPU time; the ratios are medians over the baseline's median, the spread the q1-q3 of the ratios of
one repetition's pair. Peak memory, each in a fresh process (its ``VmHWM``), over one run of 10⁶ metric lines:

* ``analysis_rss/json_loads`` (baseline): the same imports as the loader, then a ``json.loads`` pass over the file;
* ``analysis_rss/load``: ``load_sweep`` of that run.

The synthetic data (``gkd_harness.bench.synthetic``: 5 β x 2 forms x 2 precisions x 2 T x 5 seeds, and the long run) is written
once per work folder and is not timed. ``--quick``: 40 runs x 50 steps and a run of 10,000 lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

from gkd_harness.harness.store.records import metrics_path, summary_path

__all__ = ["measure_analysis", "analysis_rows", "VARIANTS", "RSS_VARIANTS", "sizes"]

#: The side-by-side variants (the first is the baseline) and the peak-memory variants (likewise).
VARIANTS = ("json_loads", "load", "report")
RSS_VARIANTS = ("json_loads", "load")


def sizes(quick: bool) -> Dict[str, int]:
    """The synthetic sizes: the sweep's seeds and steps (200 runs x 2,000 steps), and the long run's lines."""
    return (
        {"seeds": 1, "steps": 50, "long_lines": 10_000}
        if quick
        else {"seeds": 5, "steps": 2000, "long_lines": 1_000_000}
    )


def _sweep(work_dir: str, quick: bool) -> Path:
    from gkd_harness.bench.synthetic import write_sweep

    n = sizes(quick)
    sweep = Path(work_dir) / ("sweep_quick" if quick else "sweep") / "runs"
    done = sweep.parent / "complete"
    if not done.exists():
        write_sweep(sweep, steps=n["steps"], seeds=range(n["seeds"]))
        done.write_text("ok")
    return sweep


def _long_run(work_dir: str, quick: bool) -> Path:
    from gkd_harness.bench.synthetic import write_run

    lines = sizes(quick)["long_lines"]
    run = Path(work_dir) / f"long_{lines}" / "run"
    done = run.parent / "complete"
    if not done.exists():
        write_run(run, beta=0.5, beta_form="paper", precision="native", seed=0, steps=lines, spot_every=50, level=0.01)
        done.write_text("ok")
    return run


def _read_all(sweep: Path) -> int:
    """The baseline: ``json.loads`` of every run's summary and of every metrics line; returns the lines read."""
    rows = 0
    for run in sorted(p for p in sweep.iterdir() if p.is_dir()):
        json.loads(summary_path(run).read_text())
        with open(metrics_path(run)) as f:
            for line in f:
                json.loads(line)
                rows += 1
    return rows


def _child(code: List[str], env=None) -> Dict:
    """Run a fresh interpreter; -> ``{"cpu_s", "wall_s", "rc", "out", "err"}``, its CPU from its own rusage."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode(errors="replace")
    err = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall, "rc": proc.returncode, "out": out, "err": err}


#: The child's own peak RSS: ``VmHWM`` of its address space. Not the rusage's ``ru_maxrss``, which keeps the peak of
#: the image the child was forked from (Linux carries it across ``execve``): the worker's, after it loaded a sweep.
_PEAK = (
    "\ndef _peak_kib():\n    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n            return int(line.split()[1])\n"
)
_RSS_CODE = {
    # the same imports as the loader's process, then one json.loads pass keeping nothing
    "json_loads": (
        "import json, sys\nimport gkd_harness.analysis.load\nn = 0\nwith open(sys.argv[1]) as f:\n"
        "    for line in f:\n        json.loads(line)\n        n += 1\n" + _PEAK + "print(n, _peak_kib())\n"
    ),
    "load": (
        "import sys\nfrom gkd_harness.analysis.load import load_sweep\nsw = load_sweep(sys.argv[2])\n"
        + _PEAK
        + "print(int(sw.runs['n_logged'].iloc[0]), _peak_kib())\n"
    ),
}


def _rss(variant: str, run: Path) -> Dict:
    """Peak RSS (MiB) of a fresh process running ``variant`` over the long run, and the lines it saw."""
    res = _child(["-c", _RSS_CODE[variant], str(metrics_path(run)), str(run)])
    if res["rc"] != 0:
        raise RuntimeError(f"analysis_rss/{variant} exited {res['rc']}: {res['err'][-2000:]}")
    lines, peak_kib = res["out"].split()[-2:]
    return {"peak_mib": int(peak_kib) / 1024.0, "lines": int(lines)}


def measure_analysis(variant: str, quick: bool, work_dir: str, warmup: int, reps: int) -> Dict:
    """The ``analysis/all`` worker: ``{"variant_cpu_s": {variant: [reps]}, "variant_wall_s": {...},
    "rss": {variant: {...}}, "lines": ..., "runs": ..., "steps": ...}`` (see the module docstring)."""
    if variant != "all":
        raise KeyError(variant)
    sweep = _sweep(work_dir, quick)
    report = Path(work_dir) / "report"
    from gkd_harness.analysis.load import load_sweep

    state: Dict = {}

    def json_pass():
        state["lines"] = _read_all(sweep)

    def load():
        sw = load_sweep(sweep)
        state["runs"], state["history_rows"] = int(len(sw.runs)), int(len(sw.history))

    def gkd_analyze():
        res = _child(["-m", "gkd_harness.analysis.cli", str(sweep), "--report", str(report)])
        if res["rc"] not in (0, 1):  # 0 pass / 1 fail are both a finished report
            raise RuntimeError(f"gkd-analyze exited {res['rc']}: {res['err'][-2000:]}")
        state["verdict_rc"] = res["rc"]
        return res

    fns: Dict[str, Callable] = {"json_loads": json_pass, "load": load, "report": gkd_analyze}
    cpu: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    wall: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for i in range(warmup + reps):
        order = VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]
        for v in order:
            w0, c0 = time.perf_counter(), time.process_time()
            child = fns[v]()
            dw, dc = time.perf_counter() - w0, time.process_time() - c0
            if child is not None:  # a fresh process: its own CPU, not this one's
                dw, dc = child["wall_s"], child["cpu_s"]
            if i >= warmup:
                cpu[v].append(dc)
                wall[v].append(dw)
    long_run = _long_run(work_dir, quick)
    rss = {v: _rss(v, long_run) for v in RSS_VARIANTS}
    n = sizes(quick)
    return {
        "variant_cpu_s": cpu,
        "variant_wall_s": wall,
        "rss": rss,
        "lines": state["lines"],
        "runs": state["runs"],
        "history_rows": state["history_rows"],
        "steps": n["steps"],
        "long_lines": n["long_lines"],
        "verdict_rc": state.get("verdict_rc"),
    }


def analysis_rows(res: Dict) -> List[Dict]:
    """The table rows of one ``analysis/all`` worker: each variant's CPU time and its ratio to ``json_loads``
    (spread: q1-q3 of the per-repetition ratios), and the two peak-memory rows."""
    from gkd_harness.bench.measure import quantiles

    if res.get("errors"):
        return [{"name": "analysis/json_loads", "errors": res["errors"], "baseline": None}]
    base = "analysis/json_loads"
    st = {v: quantiles(res["variant_cpu_s"][v]) for v in VARIANTS}
    wst = {v: quantiles(res["variant_wall_s"][v]) for v in VARIANTS}
    what = f"{res['runs']} synthetic runs x {res['steps']} steps ({res['lines']:,} metric lines)"
    notes = {
        "json_loads": f"json.loads of every line, {what}",
        "load": f"load_sweep in process, {what}; {res['history_rows']:,} history rows",
        "report": f"gkd-analyze --report as a fresh process (its CPU from the child's rusage), {what}",
    }
    rows = []
    for v in VARIANTS:
        row = {
            "name": f"analysis/{v}",
            "errors": [],
            "baseline": None if v == "json_loads" else base,
            "n": st[v]["n"],
            "median_ms": st[v]["median"] * 1e3,
            "iqr_ms": (st[v]["q1"] * 1e3, st[v]["q3"] * 1e3),
            "wall_median_ms": wst[v]["median"] * 1e3,
            "note": notes[v],
        }
        if v != "json_loads":
            pairs = quantiles([a / b for a, b in zip(res["variant_cpu_s"][v], res["variant_cpu_s"]["json_loads"])])
            row.update(
                time_ratio=st[v]["median"] / st["json_loads"]["median"],
                time_ratio_range=(pairs["q1"], pairs["q3"]),
                wall_ratio=wst[v]["median"] / wst["json_loads"]["median"],
            )
        rows.append(row)
    rss = res["rss"]
    for v in RSS_VARIANTS:
        row = {
            "name": f"analysis_rss/{v}",
            "errors": [],
            "median_ms": None,
            "peak_mib": rss[v]["peak_mib"],
            "baseline": None if v == "json_loads" else "analysis_rss/json_loads",
            "note": (
                f"peak RSS of a fresh process over one run of {rss[v]['lines']:,} metric lines: "
                + ("the loader's imports, then json.loads of every line" if v == "json_loads" else "load_sweep")
            ),
        }
        if v != "json_loads":
            row["mem_ratio"] = rss[v]["peak_mib"] / rss["json_loads"]["peak_mib"]
        rows.append(row)
    return rows
