"""``gkd-bench``: the performance benchmark of the patched loss, the spot check, instrumentation and analysis.

    gkd-bench [--device cpu|cuda] [--quick] [--out docs/performance.md] [--only GROUP ...]

Every measurement runs in its own fresh process (this module in ``--one NAME`` worker mode). Each timing worker
warms up, then times several repetitions; the parent repeats the workers in ``--rounds`` interleaved rounds
(rotating the order, so drift on a shared machine hits every variant alike) and pools the repetitions. Every
figure is a ratio against a baseline measured in the same run: the ratio of medians, with the spread
``[q1(x)/q3(base), q3(x)/q1(base)]``. Peak memory is measured in separate fresh worker processes
(see :mod:`gkd_harness.bench.measure`). The table goes to stdout and to ``--out`` with the machine and the command.

Groups: ``topk``, ``full``, ``spot_topk``, ``spot_full`` (:mod:`gkd_harness.bench.cases`), ``instr`` (the instrumented ÷
bare loss call side by side in one process, the amortised spot check and the host synchronisations per call,
:mod:`gkd_harness.bench.instrument_cost`), ``analysis`` (loading and the sign-off report over a synthetic sweep of 200 runs x
2,000 steps ÷ a plain ``json.loads`` pass, side by side in one worker, and the loader's peak RSS over 10⁶ metric
lines, :mod:`gkd_harness.bench.analysis_time`), and, only when asked for (``--only e2e``), ``e2e`` (training steps of the tiny
embedded model: bare ``swift rlhf``, ``gkd-train monitor=off`` and the default monitoring, one run per side per
round, :mod:`gkd_harness.bench.e2e`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from gkd_harness.bench.spot_cases import SPOT_GROUPS, spot_goals

RESULT_TAG = "GKD_BENCH_RESULT "
SCALE = ("full_n4", "full_n16", "topk_k8", "topk_k512")  # gkd_harness.bench.cases.SCALE_GROUPS (kept torch-free here)
SPOT_WIDE = tuple(
    SPOT_GROUPS
)  # gkd_harness.bench.spot_cases: spot checks at V=248,320 (--only spot_wide spot_topk_wide)
SMALL = ("small_v", "small_n", "small_v_copy", "small_n64")  # gkd_harness.bench.cases.SMALL_GROUPS
MEGATRON = ("mega_tp1", "mega_tp2")  # gkd_harness.bench.megatron: the loss on Megatron's call path
GROUPS = (
    ("topk", "full", "spot_topk", "spot_full", "instr", "e2e", "analysis", "wide")
    + SCALE
    + SPOT_WIDE
    + SMALL
    + MEGATRON
)
GROUP_CHOICES = GROUPS + ("scale",)  # --only scale = the four scaling groups
DEFAULT_GROUPS = ("topk", "full") + SMALL + ("mega_tp1", "spot_topk", "spot_full", "instr", "analysis")
DEFAULT_GROUPS_QUICK = DEFAULT_GROUPS
MEMORY_GROUPS = ("topk", "full", "wide") + SCALE + SPOT_WIDE + SMALL
#: Groups timed in the first round only (one slow call per size on a CPU; the scaling table, not a goal).
FIRST_ROUND_ONLY = SCALE
NOTES_MARKER = "<!-- notes below are kept when the benchmark regenerates this file -->"

__all__ = ["main", "run_benchmark", "GOALS"]


@dataclasses.dataclass(frozen=True)
class Goal:
    """A goal on one measurement: ``metric`` of ``name`` (a ratio vs its baseline, or seconds) <= ``limit``."""

    name: str
    metric: str  # "time_ratio" | "mem_ratio" | "seconds" | "syncs_added" | "peak_mib" (MiB)
    limit: float
    text: str


GOALS = (
    Goal("topk/fp32", "time_ratio", 0.80, "top-k loss time fp32 ÷ upstream ≤ 0.80 (N=16,384, k=64)"),
    Goal("full/fp32", "mem_ratio", 0.50, "full-vocab peak memory fp32 ÷ upstream ≤ 0.50 (N=512, V=151,936)"),
    Goal("full/fp32", "time_ratio", 0.80, "full-vocab time fp32 ÷ upstream ≤ 0.80 (N=512, V=151,936)"),
    Goal("wide/fp32", "mem_ratio", 0.50, "full-vocab peak memory fp32 ÷ upstream at V=248,320 ≤ 0.50"),
    Goal("spot_topk/check", "time_ratio", 3.0, "spot check ÷ one loss fwd+bwd (top-k) ≤ 3"),
    Goal("spot_full/check", "time_ratio", 3.0, "spot check ÷ one loss fwd+bwd (full vocab) ≤ 3"),
    Goal(
        "instr_topk/instrumented",
        "time_ratio",
        1.03,
        "instrumented ÷ bare loss call, top-k (N=16,384, k=64), spot checks off ≤ 1.03",
    ),
    Goal(
        "instr_full/instrumented",
        "time_ratio",
        1.03,
        "instrumented ÷ bare loss call, full vocab (N=512, V=151,936), spot checks off ≤ 1.03",
    ),
    Goal(
        "instr_topk/instrumented",
        "syncs_added",
        0,
        "device→host syncs added per loss call, monitoring on = 0 (one read per logging step)",
    ),
    Goal("instr_topk/monitor_off", "syncs_added", 0, "device→host syncs added per loss call, monitoring off = 0"),
    Goal("small_v/fp32", "time_ratio", 1.0, "full-vocab time fp32 ÷ upstream at V=32,768, N=128 ≤ 1"),
    Goal("small_n/fp32", "time_ratio", 1.0, "full-vocab time fp32 ÷ upstream at N=16, V=151,936 ≤ 1"),
    Goal(
        "small_v_copy/fp32",
        "time_ratio",
        1.0,
        "full-vocab time fp32 ÷ upstream at V=32,768, N=128, near-copy teacher (noise 0.003) ≤ 1",
    ),
    Goal("small_n64/fp32", "time_ratio", 1.0, "full-vocab time fp32 ÷ upstream at N=64, V=151,936 ≤ 1"),
    Goal(
        "mega_tp1/fp32",
        "time_ratio",
        0.70,
        "Megatron call path (TP=1 vocab-parallel primitives) fp32 ÷ upstream ≤ 0.70 (N=128, V=151,936, FP32/BF16)",
    ),
    Goal(
        "mega_tp2/fp32",
        "time_ratio",
        0.70,
        "Megatron call path, TP=2 on 2 gloo ranks, fp32 ÷ upstream ≤ 0.70 (N=128, V=151,936, FP32/BF16)",
    ),
    Goal("e2e/monitor_off", "time_ratio", 1.05, "training step, gkd-train monitor=off ÷ bare swift rlhf ≤ 1.05 (CPU)"),
    Goal(
        "analysis/load",
        "time_ratio",
        4.0,
        "loading 200 runs × 2,000 steps ÷ a plain json.loads pass over the same lines ≤ 4 (CPU)",
    ),
    Goal(
        "analysis/report",
        "time_ratio",
        4.0,
        "gkd-analyze --report, 200 runs × 2,000 steps ÷ a plain json.loads pass over the same lines ≤ 4 (CPU)",
    ),
    Goal("analysis_rss/load", "peak_mib", 1024.0, "peak RSS loading one run of 10⁶ metric lines ≤ 1 GiB"),
)
GOALS = GOALS + spot_goals(Goal)

# ---------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------


def group_cases(group: str) -> List[str]:
    from gkd_harness.bench.cases import LOSS_CASES, MEGATRON_CASES

    if group in MEGATRON_CASES:
        return [f"{group}/{v}" for v in MEGATRON_CASES[group]]
    if group in LOSS_CASES:
        extra = []
        if os.environ.get("GKD_BENCH_PROTO") and group in ("topk", "full"):
            extra = [f"{group}/proto_fp32", f"{group}/proto_continuous"]
        return [f"{group}/{v}" for v in LOSS_CASES[group]] + extra
    if group in SPOT_GROUPS:
        return [f"{group}/{v}" for v in SPOT_GROUPS[group]]
    if group == "e2e":
        from gkd_harness.bench.e2e import SIDES

        return [f"e2e/{side}" for side in SIDES]
    if group == "instr":
        return ["instr/topk", "instr/full"]
    if group == "analysis":
        return ["analysis/all"]  # gkd_harness.bench.analysis_time: one worker, every figure side by side
    raise KeyError(group)


def _reps(name: str, quick: bool, device: str) -> tuple[int, int]:
    """(warmup, reps) per worker."""
    group = name.split("/")[0]
    if group in ("topk", "topk_k8"):
        return (1, 3) if quick else (3, 15)
    if group == "topk_k512":
        return (1, 3) if quick else (1, 5)
    if group == "wide":
        return (1, 2) if quick else ((1, 2) if device == "cpu" else (3, 10))
    if group in ("full_n4", "full_n16"):
        return (1, 2) if quick else ((0, 1) if device == "cpu" else (2, 5))
    if group in SMALL:
        return (1, 3) if quick else (2, 10)
    if group in MEGATRON:
        return (1, 2) if quick else ((1, 3) if device == "cpu" else (3, 10))
    if group in ("full", "spot_full"):
        return (1, 2) if quick else ((1, 2) if device == "cpu" else (3, 10))
    if group == "spot_topk":
        return (1, 3) if quick else (3, 15)
    if group in SPOT_WIDE:  # the seed's shape: a loss call of seconds on a CPU (full vocabulary and top-k alike)
        return (1, 2) if quick else ((1, 2) if device == "cpu" else (3, 10))
    if group == "analysis":
        return (0, 1) if quick else (1, 3)
    if name == "instr/topk":
        return (1, 3) if quick else (2, 40)
    if name == "instr/full":
        return (1, 2) if quick else ((1, 5) if device == "cpu" else (3, 20))
    return (0, 1)


# ---------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------


def _sizes(args):
    from gkd_harness.bench.cases import Sizes, default_spot_max_tokens

    base = Sizes.quick() if args.quick else Sizes(spot_max_tokens=default_spot_max_tokens())
    return dataclasses.replace(base, **json.loads(args.sizes)) if args.sizes else base


def _worker(args) -> Dict:
    import torch

    from gkd_harness.bench import measure as bm

    if args.device == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(1)
    name, group = args.one, args.one.split("/")[0]
    out: Dict = {"name": name, "mode": args.mode, "threads": torch.get_num_threads()}
    if group == "e2e":
        from gkd_harness.bench.e2e import measure_e2e

        out.update(measure_e2e(name.split("/")[1], quick=args.quick, work_dir=args.work_dir))
        return out
    if group == "instr":
        from gkd_harness.bench.instrument_cost import measure_instrument_cost

        out.update(measure_instrument_cost(name.split("/")[1], _sizes(args), args.device, args.warmup, args.reps))
        return out
    if group == "analysis":
        from gkd_harness.bench.analysis_time import measure_analysis

        out.update(
            measure_analysis(
                name.split("/")[1], quick=args.quick, work_dir=args.work_dir, warmup=args.warmup, reps=args.reps
            )
        )
        return out

    if group == "mega_tp2":
        from gkd_harness.bench.megatron import measure_tp2

        out["shape"] = {"n": _sizes(args).mega_n, "v": _sizes(args).full_v}
        out.update(measure_tp2(name.split("/")[1], _sizes(args), args.warmup, args.reps))
        return out

    from gkd_harness.bench.cases import build_case, case_shape, memory_guard

    if group in MEMORY_GROUPS and group not in SPOT_WIDE:
        out["shape"] = case_shape(name, _sizes(args))
        reason = memory_guard(name, _sizes(args), args.device)
        if reason:  # reported as not run, with the estimate (the scaling table's largest N on a small machine)
            out["skipped"] = reason
            return out
    if group in SPOT_WIDE:
        from gkd_harness.bench.spot_cases import build_spot_case as build_case
    case = build_case(name, _sizes(args), args.device)
    out["note"] = case.note
    if args.mode == "mem":
        case.step()  # warm-up: lazy library state is not counted
        if args.device == "cuda":
            out["peak_mib"] = bm.cuda_peak_mib(case.step)
        else:
            out["peak_mib"] = bm.peak_rss_delta_mib(case.step)
            if group == "topk" or args.alloc_profile:  # one more full call under the profiler: opt-in for big cases
                out["alloc_peak_mib"] = bm.allocator_peak_mib(case.step)
        return out
    out.update(bm.time_calls(case.step, args.device, args.warmup, args.reps))
    out["loss"] = case.value()
    if case.reference is not None:
        out["loss_fp64"] = case.reference()
    return out


# ---------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------


def _spawn(name: str, mode: str, args, warmup: int, reps: int, log) -> Dict:
    cmd = [
        sys.executable,
        "-m",
        "gkd_harness.bench.cli",
        "--one",
        name,
        "--mode",
        mode,
        "--device",
        args.device,
        "--warmup",
        str(warmup),
        "--reps",
        str(reps),
        "--threads",
        str(args.threads),
        "--work-dir",
        str(args.work_dir),
    ]
    if args.quick:
        cmd.append("--quick")
    if args.alloc_profile:
        cmd.append("--alloc-profile")
    if args.sizes:
        cmd += ["--sizes", args.sizes]
    from gkd_harness.bench.measure import malloc_env

    env = malloc_env() if mode == "mem" else dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG) :])
            log(f"  {name:<22} {mode:<4} done in {dt:5.1f} s")
            return res
    tail = (proc.stderr or proc.stdout)[-3000:]
    log(f"  {name:<22} {mode:<4} FAILED (rc={proc.returncode}) in {dt:5.1f} s\n{tail}")
    return {"name": name, "mode": mode, "error": f"worker rc={proc.returncode}: {tail.strip().splitlines()[-1:]}"}


def run_benchmark(args, log=print) -> Dict[str, Dict]:
    """Run every selected measurement; returns ``{name: pooled result}``."""
    only = [x for g in args.only for x in (SCALE if g == "scale" else (g,))]
    names = [n for g in only for n in group_cases(g)]
    if getattr(args, "cases", None):
        wanted = set(args.cases) | {group_cases(c.split("/")[0])[0] for c in args.cases}
        names = [n for n in names if n in wanted] + [c for c in args.cases if c not in names]
    pooled: Dict[str, Dict] = {n: {"name": n, "wall_s": [], "cpu_s": []} for n in names}
    timed = [n for n in names if n.split("/")[0] not in ("analysis", "instr")]  # e2e: one run per side per round
    single = [n for n in names if n not in timed]
    rounds = args.rounds
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        order = timed[r % len(timed) :] + timed[: r % len(timed)] if timed else []
        for name in order:
            if r > 0 and name.split("/")[0] in FIRST_ROUND_ONLY:
                continue
            warmup, reps = _reps(name, args.quick, args.device)
            res = _spawn(
                name,
                "time",
                args,
                args.warmup if args.warmup is not None else warmup,
                args.reps if args.reps is not None else reps,
                log,
            )
            _merge(pooled[name], res)
    for name in single:  # instr, e2e and analysis: one worker each, repetitions inside
        warmup, reps = _reps(name, args.quick, args.device)
        _merge(
            pooled[name],
            _spawn(
                name,
                "time",
                args,
                args.warmup if args.warmup is not None else warmup,
                args.reps if args.reps is not None else reps,
                log,
            ),
        )
    for name in timed:
        if name.split("/")[0] in MEMORY_GROUPS and not pooled[name].get("skipped"):
            _merge(pooled[name], _spawn(name, "mem", args, 0, 0, log))
    return pooled


def _merge(acc: Dict, res: Dict) -> None:
    for key, val in res.items():
        if key in ("wall_s", "cpu_s", "step_s", "round_mean_s", "round_mean_wall_s"):
            acc.setdefault(key, []).extend(val)
        elif key == "error":
            acc.setdefault("errors", []).append(val)
        else:
            acc[key] = val


# ---------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------


def _time_key(args) -> str:
    return "cpu_s" if args.device == "cpu" else "wall_s"


def _stat(res: Dict, key: str):
    from gkd_harness.bench.measure import quantiles

    xs = res.get(key) or []
    return quantiles(xs) if xs else None


def _baseline(name: str) -> Optional[str]:
    group = name.split("/")[0]
    cases = group_cases(group)
    return cases[0] if cases[0] != name else None


def compute_rows(pooled: Dict[str, Dict], args) -> List[Dict]:
    """One row per measurement with its figures and ratios (dicts of plain numbers/strings)."""
    rows = []
    for name, res in pooled.items():
        if name.startswith("instr/"):
            rows += instrument_rows(name, res)
            continue
        if name == "analysis/all":
            from gkd_harness.bench.analysis_time import analysis_rows

            rows += analysis_rows(res)
            continue
        key = "wall_s" if name.split("/")[0] == "analysis" else _time_key(args)
        base_name = _baseline(name)
        base = pooled.get(base_name) if base_name else None
        st, wst = _stat(res, key), _stat(res, "wall_s")
        if res.get("skipped"):
            rows.append(
                {
                    "name": name,
                    "errors": [],
                    "skipped": res["skipped"],
                    "shape": res.get("shape"),
                    "baseline": base_name,
                    "median_ms": None,
                    "note": "",
                }
            )
            continue
        row = {
            "name": name,
            "errors": res.get("errors", []),
            "note": res.get("note", ""),
            "n": st["n"] if st else 0,
            "median_ms": st["median"] * 1e3 if st else None,
            "wall_median_ms": wst["median"] * 1e3 if wst else None,
            "iqr_ms": (st["q1"] * 1e3, st["q3"] * 1e3) if st else None,
            "baseline": base_name,
        }
        bst = _stat(base, key) if base else None
        if st and bst:
            row["time_ratio"] = st["median"] / bst["median"]
            row["time_ratio_range"] = (st["q1"] / bst["q3"], st["q3"] / bst["q1"])
            if name.startswith("e2e/") and base is not None:  # ratio of mean step times, spread over the rounds
                from gkd_harness.bench.e2e import e2e_ratio

                row.update(e2e_ratio(res, base))
                row["median_step_ratio"] = st["median"] / bst["median"]
        bw = _stat(base, "wall_s") if base else None
        if wst and bw and not name.startswith("e2e/"):
            row["wall_ratio"] = wst["median"] / bw["median"]
        for mkey in ("peak_mib", "alloc_peak_mib"):
            if res.get(mkey) is not None:
                row[mkey] = res[mkey]
                if base and base.get(mkey):
                    row[mkey.replace("peak_mib", "mem_ratio")] = res[mkey] / base[mkey]
        if name == "full/fp32" and pooled.get("full/naive_upcast"):
            nv = pooled["full/naive_upcast"]
            nst = _stat(nv, key)
            if st and nst:
                row["time_ratio_vs_naive"] = st["median"] / nst["median"]
            if res.get("peak_mib") and nv.get("peak_mib"):
                row["mem_ratio_vs_naive"] = res["peak_mib"] / nv["peak_mib"]
        for k in ("loss", "loss_fp64", "seconds", "step_s_note", "extra", "shape"):
            if k in res:
                row[k] = res[k]
        ref = pooled.get(base_name or name, {}).get("loss_fp64")
        if ref is not None and res.get("loss") is not None:
            row["rel_err_fp64"] = abs(res["loss"] - ref) / abs(ref)
        rows.append(row)
    return rows


def instrument_rows(name: str, res: Dict) -> List[Dict]:
    """The rows of one ``instr/<group>`` worker: bare (baseline), instrumented, spot-check step, amortised spot
    check every 50 steps, and the monitor-off loss; ratios of medians, spread = q1–q3 of the paired ratios."""
    from gkd_harness.bench.instrument_cost import SPOT_EVERY, amortised_ratio
    from gkd_harness.bench.measure import quantiles

    group = "instr_" + name.split("/")[1]
    if res.get("errors"):
        return [{"name": f"{group}/bare", "errors": res["errors"], "baseline": None}]
    key, times, syncs = res["time_key"], res["variants"], res["syncs"]
    st = {k: quantiles(v[key]) for k, v in times.items()}
    wall = {k: quantiles(v["wall_s"]) for k, v in times.items()}
    base = f"{group}/bare"
    rows = []
    for variant in ("bare", "instrumented", "spot_step"):
        row = {
            "name": f"{group}/{variant}",
            "errors": [],
            "n": st[variant]["n"],
            "baseline": None if variant == "bare" else base,
            "median_ms": st[variant]["median"] * 1e3,
            "iqr_ms": (st[variant]["q1"] * 1e3, st[variant]["q3"] * 1e3),
            "loss": res["loss"][variant],
            "syncs": syncs.get(variant),
            "syncs_added": syncs[variant] - syncs["bare"] if variant in syncs else None,
            "note": ""
            if variant == "bare"
            else f"{st[variant]['n']} repetitions interleaved with bare in one "
            "process; spread = q1–q3 of the paired ratios",
        }
        if variant != "bare":
            pq = quantiles(res["pair_ratios"][variant])
            row.update(
                time_ratio=st[variant]["median"] / st["bare"]["median"],
                time_ratio_range=(pq["q1"], pq["q3"]),
                wall_ratio=wall[variant]["median"] / wall["bare"]["median"],
            )
        rows.append(row)
    amort = amortised_ratio(st["bare"]["median"], st["instrumented"]["median"], st["spot_step"]["median"])
    lo = amortised_ratio(
        1.0, quantiles(res["pair_ratios"]["instrumented"])["q1"], quantiles(res["pair_ratios"]["spot_step"])["q1"]
    )
    hi = amortised_ratio(
        1.0, quantiles(res["pair_ratios"]["instrumented"])["q3"], quantiles(res["pair_ratios"]["spot_step"])["q3"]
    )
    rows.append(
        {
            "name": f"{group}/spot_every_{SPOT_EVERY}",
            "errors": [],
            "baseline": base,
            "median_ms": None,
            "time_ratio": amort,
            "time_ratio_range": (lo, hi),
            "note": f"amortised: ({SPOT_EVERY - 1}·instrumented + spot_step) ÷ ({SPOT_EVERY}·bare), one loss "
            "call per step",
        }
    )
    if res.get("record"):
        rq = quantiles(res["record"][key])
        rows.append(
            {
                "name": f"{group}/record_only",
                "errors": [],
                "baseline": base,
                "n": rq["n"],
                "median_ms": rq["median"] * 1e3,
                "iqr_ms": (rq["q1"] * 1e3, rq["q3"] * 1e3),
                "time_ratio": 1 + rq["median"] / st["bare"]["median"],
                "time_ratio_range": (1 + rq["q1"] / st["bare"]["q3"], 1 + rq["q3"] / st["bare"]["q1"]),
                "note": "the instrument's own work per call alone (its record step, "
                f"{rq['n']} repetitions); ratio = 1 + record ÷ bare: the instrumented call's cost resolved",
            }
        )
    rows.append(
        {
            "name": f"{group}/monitor_off",
            "errors": [],
            "baseline": base,
            "median_ms": None,
            "syncs": syncs["monitor_off"],
            "syncs_added": syncs["monitor_off"] - syncs["bare"],
            "note": "the plugin's loss with monitor=off (dtype boundary around the bare variant): host syncs only",
        }
    )
    return rows


def judge(rows: List[Dict]) -> List[Dict]:
    by = {r["name"]: r for r in rows}
    out = []
    goals = list(GOALS)
    for g in GOALS:  # a candidate losses.py (--proto) is judged by the same loss goals
        proto = g.name.replace("/fp32", "/proto_fp32")
        if proto != g.name and proto in by:
            goals.append(Goal(proto, g.metric, g.limit, g.text.replace("fp32", "candidate fp32 (--proto)")))
    for g in goals:
        r = by.get(g.name)
        val = None
        if r is not None:
            val = {
                "time_ratio": r.get("time_ratio"),
                "mem_ratio": r.get("mem_ratio"),
                "seconds": r.get("seconds"),
                "syncs_added": r.get("syncs_added"),
                "peak_mib": r.get("peak_mib"),
            }[g.metric]
        if g.metric == "syncs_added":  # an exact count
            status = "not measured" if val is None else ("met" if val == g.limit else "NOT met")
        else:
            status = "not measured" if val is None else ("met" if val <= g.limit else "NOT met")
        if val is not None and g.metric == "time_ratio" and g.name.startswith("e2e/") and val < 0.9:
            # the harness only adds work: much faster than bare means the runs differ in more than the harness
            # (or the machine's load changed); the figure cannot support the goal
            status = "inconclusive (faster than bare)"
        out.append(
            {"goal": g.text, "name": g.name, "metric": g.metric, "value": val, "limit": g.limit, "status": status}
        )
    return out


def _f(x, fmt="{:.3g}"):
    return "–" if x is None else fmt.format(x)


def format_table(rows: List[Dict], args) -> str:
    tlabel = "CPU time" if args.device == "cpu" else "time"
    head = (
        f"| measurement | {tlabel} median ms [q1–q3] | ÷ baseline [spread] | wall ÷ baseline | "
        "peak MiB process / allocator | mem ÷ baseline | loss | rel. err vs FP64 | host syncs per call |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        name = r["name"] + ("" if r.get("baseline") else " (baseline)")
        if r["errors"]:
            lines.append(f"| {name} | failed: {'; '.join(map(str, r['errors']))[:200]} |  |  |  |  |  |  |  |")
            continue
        if r.get("skipped"):
            lines.append(f"| {name} | {r['skipped']} |  |  |  |  |  |  |  |")
            continue
        t = "–" if r["median_ms"] is None else f"{r['median_ms']:.1f} [{r['iqr_ms'][0]:.1f}–{r['iqr_ms'][1]:.1f}]"
        if "seconds" in r:
            t = f"{r['seconds'] * 1e3:.0f} (wall)"
        ratio = "–"
        if r.get("time_ratio") is not None:
            lo, hi = r["time_ratio_range"]
            ratio = f"**{r['time_ratio']:.3f}** [{lo:.2f}–{hi:.2f}]"
        mem = "–"
        if r.get("peak_mib") is not None:
            mem = f"{r['peak_mib']:.0f} / {_f(r.get('alloc_peak_mib'), '{:.0f}')}"
        mr = "–"
        if r.get("mem_ratio") is not None:
            mr = f"**{r['mem_ratio']:.3f}** / {_f(r.get('alloc_mem_ratio'), '{:.3f}')}"
        extra = []
        if r.get("time_ratio_vs_naive") is not None:
            extra.append(f"time ÷ naive {r['time_ratio_vs_naive']:.3f}")
        if r.get("mem_ratio_vs_naive") is not None:
            extra.append(f"mem ÷ naive {r['mem_ratio_vs_naive']:.3f}")
        if extra:
            mr += " (" + ", ".join(extra) + ")"
        syncs = "–"
        if r.get("syncs") is not None:
            syncs = f"{r['syncs']}" + ("" if not r.get("baseline") else f" ({r['syncs_added']:+d} vs bare)")
        lines.append(
            f"| {name} | {t} | {ratio} | {_f(r.get('wall_ratio'), '{:.3f}')} | {mem} | {mr} | "
            f"{_f(r.get('loss'), '{:.6g}')} | {_f(r.get('rel_err_fp64'), '{:.1e}')} | {syncs} |"
        )
    return "\n".join(lines)


def format_goals(goals: List[Dict]) -> str:
    lines = ["| goal | measured | status |", "|---|---|---|"]
    for g in goals:
        v = (
            "–"
            if g["value"] is None
            else (
                f"{g['value']:.2f} s"
                if g["metric"] == "seconds"
                else f"{g['value']:.0f} MiB"
                if g["metric"] == "peak_mib"
                else f"{g['value']:d}"
                if g["metric"] == "syncs_added"
                else f"{g['value']:.3f}"
            )
        )
        lines.append(f"| {g['goal']} | {v} | {g['status']} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Machine / document
# ---------------------------------------------------------------------------


def machine_info(device: str) -> Dict[str, str]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info["cpu_cores"] = str(os.cpu_count())
    import hashlib

    losses = Path(__file__).resolve().parents[1] / "harness" / "losses.py"
    if losses.exists():
        info["harness/losses.py md5"] = hashlib.md5(losses.read_bytes()).hexdigest()[:12]
    if os.environ.get("GKD_BENCH_PROTO"):
        proto = Path(os.environ["GKD_BENCH_PROTO"])
        info["proto"] = f"{proto} md5 {hashlib.md5(proto.read_bytes()).hexdigest()[:12]}"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["ram_gib"] = f"{int(line.split()[1]) / 2**20:.1f}"
    except OSError:
        pass
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = str(torch.version.cuda)
    from importlib import metadata

    for pkg in ("ms-swift", "transformers", "trl"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = "not installed"
    return info


def render_markdown(rows, goals, info, args, command: str, started: str, elapsed_s: float, load: Dict) -> str:
    from gkd_harness.bench.cases import BETA, TEMPERATURE

    sizes = dataclasses.asdict(_sizes(args))
    notes = ""
    if args.out and Path(args.out).exists():
        old = Path(args.out).read_text()
        if NOTES_MARKER in old:
            notes = old.split(NOTES_MARKER, 1)[1].strip()
    tkind = "process CPU time" if args.device == "cpu" else "wall time (CUDA synchronised)"
    parts = [
        "# Performance of the patched GKD loss and the harness",
        "",
        "Generated by `gkd-bench` (`bench/cli.py`); do not edit the generated part by hand.",
        "",
        f"- command: `{command}`",
        f"- started: {started} UTC, took {elapsed_s / 60:.1f} min; load average at start {load['start']}, "
        f"at end {load['end']}",
        "- machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
        f"- device: {args.device}; torch threads per worker: {args.threads if args.device == 'cpu' else 'n/a'}",
        f"- sizes: {sizes}; β = {BETA}, T = {TEMPERATURE}",
        f"- method: one fresh process per measurement; per worker warm-up then repetitions; {args.rounds} interleaved "
        f"round(s) of workers, repetitions pooled. Time = {tkind}; ratio = median ÷ the baseline's median in this "
        "run, spread = [q1/q3(baseline), q3/q1(baseline)]. Peak memory: fresh process, glibc mmap threshold 64 KiB "
        "so freed tensors leave the RSS, kernel peak RSS (VmHWM reset via /proc/self/clear_refs) minus RSS before "
        "the call; cross-checked by the torch profiler's allocator timeline (tensors alive before the call "
        "excluded); CUDA: max_memory_allocated above the pre-call level. The `instr_*` rows come from one process "
        "per input size that runs the bare, instrumented and spot-step loss calls interleaved (rotating order); "
        "their spread is the q1–q3 of the paired per-repetition ratios, and their host syncs are counted with "
        "torch dispatch/function modes (bench/host_syncs.py) on one call of each.",
        "",
        "## Goals",
        "",
        format_goals(goals),
        "",
        "## All measurements",
        "",
        format_table(rows, args),
        "",
    ]
    from gkd_harness.bench.scaling import format_scaling

    scaling = format_scaling(rows, tlabel="CPU time" if args.device == "cpu" else "time")
    if scaling:
        parts += ["## How the cost grows", "", scaling, ""]
    case_notes = sorted({f"- `{r['name']}`: {r['note']}" for r in rows if r.get("note")})
    if case_notes:
        parts += ["Case notes:", ""] + case_notes + [""]
    parts += [NOTES_MARKER, "", notes, ""]
    return "\n".join(parts)


def _loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


def build_parser() -> argparse.ArgumentParser:
    from gkd_harness.harness.store.provenance import version_line

    p = argparse.ArgumentParser(prog="gkd-bench", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--version", action="version", version=version_line("gkd-bench"))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (for the test)")
    p.add_argument("--out", default=None, help="write the Markdown table here (e.g. docs/performance.md)")
    p.add_argument(
        "--only",
        nargs="+",
        choices=GROUP_CHOICES,
        default=None,
        help="groups to run (default: all but e2e, wide and the scaling groups; scale = the four scaling "
        "groups full_n4 full_n16 topk_k8 topk_k512)",
    )
    p.add_argument(
        "--cases",
        nargs="+",
        default=None,
        help="only these measurements (GROUP/VARIANT; each group's baseline is added)",
    )
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds of timing workers (3; quick 1)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads per CPU worker (default 1: steadiest on a shared machine; 0 = torch's)",
    )
    p.add_argument("--warmup", type=int, default=None, help="override warm-up calls per worker")
    p.add_argument("--reps", type=int, default=None, help="override timed repetitions per worker")
    p.add_argument("--sizes", default=None, help="JSON overriding the problem sizes, e.g. '{\"full_n\": 1024}'")
    p.add_argument("--work-dir", default=None, help="scratch folder (synthetic sweep, e2e runs); default: temp")
    p.add_argument("--json", default=None, help="also write all rows and goals as JSON here")
    p.add_argument(
        "--alloc-profile",
        action="store_true",
        help="also measure the allocator peak (torch profiler) for full-vocabulary cases (one more call)",
    )
    p.add_argument(
        "--proto", default=None, help="a candidate losses.py: adds its fp32 variants as topk/full proto_* measurements"
    )
    # worker mode
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("time", "mem"), default="time", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.one:
        res = _worker(args)
        print(RESULT_TAG + json.dumps(res), flush=True)
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gkd-bench: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
            return 2
    if args.proto:
        os.environ["GKD_BENCH_PROTO"] = str(Path(args.proto).resolve())
    if args.only is None and args.cases:
        args.only = sorted({c.split("/")[0] for c in args.cases}, key=GROUPS.index)
    if args.only is None:
        args.only = list(DEFAULT_GROUPS_QUICK if args.quick else DEFAULT_GROUPS)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    import tempfile

    tmp = None
    if args.work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gkd-bench-")
        args.work_dir = tmp.name
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    command = "gkd-bench " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    load = {"start": _loadavg()}
    t0 = time.perf_counter()
    try:
        pooled = run_benchmark(args, log=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        if tmp is not None:
            tmp.cleanup()
    elapsed = time.perf_counter() - t0
    load["end"] = _loadavg()
    rows = compute_rows(pooled, args)
    goals = judge(rows)
    print(format_table(rows, args))
    from gkd_harness.bench.scaling import format_scaling

    scaling = format_scaling(rows, tlabel="CPU time" if args.device == "cpu" else "time")
    if scaling:
        print()
        print(scaling)
    print()
    print(format_goals(goals))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_markdown(rows, goals, machine_info(args.device), args, command, started, elapsed, load))
        print(f"\nwrote {out}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "goals": goals, "pooled": pooled}, indent=1, default=str))
    failed = [r["name"] for r in rows if r["errors"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
