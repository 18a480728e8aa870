"""Does the fix change what the student learns? Seed statistics of the held-out evaluation (``eval/*``).

For a sweep that trains the original and the patched loss with the same seeds (same data order), this module
gives:

* :func:`final_values`: per run, the last logged value of each held-out metric (``eval/jsd``, forward / reverse
  KL, top-1 agreement), with the run's variant (``loss.precision``/``loss.beta_form``), role and seed;
* :func:`variant_table`: per variant and metric, the mean over seeds and its 95% **Student-t** interval
  (``mean ± t(0.975, n−1) · sd / √n``; no interval from one seed);
* :func:`paired_differences`: per seed, patched − original and (patched − original) / original, for runs that
  agree on every other config column that shapes training (β, T, top-k, SFT weight, λ, steps, models, dtypes);
* :func:`pooled`: the mean of the per-seed differences with its t interval;
* :func:`outcome_sentence`: the effect and its interval in one sentence, whichever way it goes.

The criterion ``patched_not_worse`` (:func:`patched_not_worse`, registered in :mod:`gkd_harness.analysis.signoff.criteria`) asks
that the upper bound of the interval on (patched − original) / original final held-out JSD be ≤ a margin.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import numpy as np
import pandas as pd

from gkd_harness.harness.contract import EVAL_FORWARD_KL, EVAL_JSD, EVAL_REVERSE_KL, EVAL_TOP1_AGREEMENT, role_of

#: The held-out metrics the statistics cover (``eval/tokens`` is a count, not an outcome).
OUTCOME_METRICS = (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL, EVAL_TOP1_AGREEMENT)
#: What the outcome's pairing does not match on as a key: the loss variant (what differs), and the β form and seed
#: (matched one by one, :func:`paired_differences`); every other key of the plan and of a run's identity is a
#: pairing key (:func:`gkd_harness.analysis.signoff.compare.pair_keys`).
_MATCHED_APART = (
    "loss.precision",
    "loss.source",
    "loss.name",
    "loss.beta_form",
    "run.seed",
    "dtype.student",
    "dtype.teacher",
)
LEVEL = 0.95


def outcome_pair_keys(sweep) -> list:
    """The keys an original and a patched run of one seed and β form must share to pair (learning rate, dataset,
    batch size, max_length, the held-out evaluation keys, and every key the plan sweeps among them)."""
    from gkd_harness.analysis.signoff.compare import pair_keys

    return pair_keys(sweep.runs, _MATCHED_APART, getattr(sweep, "plan", None))


def _pair_key(row: Any, keys: list) -> str:
    """``row``'s values of ``keys`` as one string (NaN and None alike)."""
    get = row.get if hasattr(row, "get") else (lambda k: None)
    return "|".join(
        "nan" if (v := get(k)) is None or (isinstance(v, float) and math.isnan(v)) else str(v) for k in keys
    )


def held_out_declared(sweep) -> bool:
    """Whether the sweep's plan configures the held-out evaluation (``monitor.eval.every_n_steps`` > 0 for its
    points); without a plan that declares it (a hand-made folder, a plan of names only, a wandb source): whether
    a run's own config does. What makes ``patched_not_worse`` apply and required: the plan, never the group's name."""
    plan = getattr(sweep, "plan", None)
    if plan is not None and plan.declared:
        return bool(plan.eval_declared)
    col = "monitor.eval.every_n_steps"
    if col not in sweep.runs.columns:
        return False
    every = pd.to_numeric(sweep.runs[col], errors="coerce")
    return bool((every > 0).any())


def _seed_text(seed: Any) -> str:
    """A seed as the config wrote it: ``1``, not the ``1.0`` of a float column (a missing run makes it one)."""
    try:
        return str(int(seed)) if float(seed).is_integer() else str(seed)
    except (TypeError, ValueError):
        return str(seed)


def planned_seeds(sweep, runs: pd.DataFrame) -> list:
    """The seeds the plan declares; without declarations, the seeds of ``runs``."""
    plan = getattr(sweep, "plan", None)
    if plan is not None and plan.seeds:
        return list(plan.seeds)
    return sorted({int(x) for x in pd.to_numeric(runs["run.seed"], errors="coerce").dropna()})


def t_interval(values: Iterable[float], level: float = LEVEL) -> tuple:
    """``(mean, low, high, n)`` of ``values`` with the Student-t interval; low/high NaN for fewer than 2."""
    from scipy import stats

    x = np.asarray(
        [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))], dtype=np.float64
    )
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def variant_of(run: pd.Series) -> str:
    """``precision/beta_form`` (e.g. ``native/paper``)."""
    return f"{run.get('loss.precision')}/{run.get('loss.beta_form')}"


def final_values(sweep, metrics: Iterable[str] = OUTCOME_METRICS) -> pd.DataFrame:
    """One row per run with each metric's value at the run's final planned step (its ``run.max_steps``; the last
    logged value where the run declares no steps), ``[run, variant, role, seed, step, *metrics]``, NaN where that
    step did not log it; runs with none of them are left out. ``step`` is the step of ``eval/jsd``'s value. Both
    sides of a pair are so read at the same step: a run whose final evaluation is missing has NaN, never an
    earlier evaluation's value."""
    metrics = list(metrics)
    hist = sweep.history
    finals = _final_steps(sweep.runs)
    last = {m: _at_final(hist, m, finals) for m in dict.fromkeys(metrics) if m in hist.columns}
    keys = outcome_pair_keys(sweep)
    rows = []
    for _, r in sweep.runs.iterrows():
        row = {
            "run": r["run"],
            "variant": variant_of(r),
            "role": role_of(r.get("loss.precision")),
            "precision": r.get("loss.precision"),
            "beta_form": r.get("loss.beta_form"),
            "seed": r.get("run.seed"),
            "step": math.nan,
        }
        found = False
        for m in metrics:
            step_value = last[m].get(r["run"]) if m in last else None
            if step_value is not None:
                found = True
                row[m] = step_value[1]
                if m == EVAL_JSD:
                    row["step"] = step_value[0]
            else:
                row[m] = math.nan
        row["pair_key"] = _pair_key(r, keys)
        if found:
            rows.append(row)
    cols = ["run", "variant", "role", "precision", "beta_form", "seed", "step", *metrics, "pair_key"]
    return pd.DataFrame(rows, columns=cols)


def _final_steps(runs: pd.DataFrame) -> dict:
    """``{run: its final planned step}`` (``run.max_steps``), for the runs that declare it."""
    steps = pd.to_numeric(runs["run.max_steps"], errors="coerce") if "run.max_steps" in runs.columns else None
    if steps is None:
        return {}
    return {str(r): int(s) for r, s in zip(runs["run"], steps) if pd.notna(s)}


def _at_final(hist: pd.DataFrame, metric: str, finals: dict) -> dict:
    """``{run: (step, value)}``: ``metric`` at each run's final planned step (``finals``), or its last logged value
    for a run that declares none."""
    last = _last_logged(hist, metric)
    sub = hist.loc[hist[metric].notna(), ["run", "step", metric]]
    at = {
        (str(run), int(step)): float(v)
        for run, step, v in zip(sub["run"], sub["step"], sub[metric])
        if finals.get(str(run)) == int(step)
    }
    out = {}
    for run, sv in last.items():
        f = finals.get(str(run))
        if f is None:
            out[run] = sv
        elif (str(run), f) in at:
            out[run] = (f, at[(str(run), f)])
    return out


def _last_logged(hist: pd.DataFrame, metric: str) -> dict:
    """``{run: (step, value)}``: each run's value of ``metric`` at its last step that logged it (one sort of the
    logged rows, not one selection per run)."""
    sub = hist.loc[hist[metric].notna(), ["run", "step", metric]]
    if not len(sub):
        return {}
    sub = sub.sort_values(["run", "step"], kind="stable").drop_duplicates("run", keep="last")
    return {run: (int(step), float(v)) for run, step, v in zip(sub["run"], sub["step"], sub[metric])}


def variant_table(finals: pd.DataFrame, metrics: Iterable[str] = OUTCOME_METRICS, level: float = LEVEL) -> pd.DataFrame:
    """Per variant and metric: ``[variant, role, metric, n, mean, low, high]`` (t interval over seeds)."""
    out = []
    for variant, g in finals.groupby("variant", sort=True):
        for m in metrics:
            mean, lo, hi, n = t_interval(g[m].tolist(), level)
            out.append(
                {
                    "variant": variant,
                    "role": g["role"].iloc[0],
                    "metric": m,
                    "n": n,
                    "mean": mean,
                    "low": lo,
                    "high": hi,
                }
            )
    return pd.DataFrame(out, columns=["variant", "role", "metric", "n", "mean", "low", "high"])


def paired_differences(
    finals: pd.DataFrame,
    original_precision: Optional[str] = None,
    patched_precisions: Optional[Iterable[str]] = None,
    metrics: Iterable[str] = OUTCOME_METRICS,
) -> pd.DataFrame:
    """Per (patched variant, seed): the original run of the same seed, β form and training config, and for each
    metric ``<m>:diff`` = patched − original and ``<m>:rel`` = (patched − original) / original.

    ``original_precision`` / ``patched_precisions``: default the precisions whose role
    (:func:`gkd_harness.harness.contract.role_of`) is original / patched. Columns ``[variant, seed, original_run,
    patched_run, ...]``; empty when no run pairs.
    """
    from gkd_harness.analysis.sweep.evidence import precisions_of
    from gkd_harness.harness.contract import ORIGINAL, PATCHED

    original_precision = original_precision or precisions_of(ORIGINAL)[0]
    patched_precisions = precisions_of(PATCHED) if patched_precisions is None else patched_precisions
    metrics = list(metrics)
    orig = finals[finals["precision"] == original_precision]
    pats = finals[finals["precision"].isin(list(patched_precisions))]
    out = []
    for _, p in pats.iterrows():
        match = orig[(orig["seed"] == p["seed"]) & (orig["beta_form"] == p["beta_form"])]
        match = match[match["pair_key"] == p["pair_key"]]
        if len(match) != 1:
            continue
        o = match.iloc[0]
        row = {"variant": p["variant"], "seed": p["seed"], "original_run": o["run"], "patched_run": p["run"]}
        for m in metrics:
            d = p[m] - o[m]
            row[f"{m}:original"], row[f"{m}:patched"] = o[m], p[m]
            row[f"{m}:diff"] = d
            row[f"{m}:rel"] = d / o[m] if o[m] else math.nan
        out.append(row)
    return pd.DataFrame(out)


def pooled(pairs: pd.DataFrame, metrics: Iterable[str] = OUTCOME_METRICS, level: float = LEVEL) -> pd.DataFrame:
    """Per patched variant and metric: mean of the per-seed ``diff`` and ``rel`` with their t intervals
    (``[variant, metric, n, diff_mean, diff_low, diff_high, rel_mean, rel_low, rel_high]``)."""
    out: list = []
    if pairs.empty:
        return pd.DataFrame(
            out,
            columns=["variant", "metric", "n", "diff_mean", "diff_low", "diff_high", "rel_mean", "rel_low", "rel_high"],
        )
    for variant, g in pairs.groupby("variant", sort=True):
        for m in metrics:
            dm, dl, dh, n = t_interval(g[f"{m}:diff"].tolist(), level)
            rm, rl, rh, _ = t_interval(g[f"{m}:rel"].tolist(), level)
            out.append(
                {
                    "variant": variant,
                    "metric": m,
                    "n": n,
                    "diff_mean": dm,
                    "diff_low": dl,
                    "diff_high": dh,
                    "rel_mean": rm,
                    "rel_low": rl,
                    "rel_high": rh,
                }
            )
    return pd.DataFrame(out)


def outcome_sentence(row: Optional[pd.Series], original: str = "the original") -> str:
    """The effect on final held-out JSD in one sentence, e.g. ``fp32/paper ends at 0.93× the original's held-out
    JSD (95% t interval 0.90–0.96, 3 seeds)``; says when no difference is resolved."""
    if row is None:
        return "No seed-paired original/patched runs with a held-out evaluation: no outcome measured."
    n = int(row["n"])
    ratio = 1 + row["rel_mean"]
    if n < 2 or math.isnan(row["rel_low"]):
        return (
            f"{row['variant']} ends at {ratio:.3g}× {original}'s held-out JSD ({n} seed: no interval, no "
            f"difference resolved)."
        )
    lo, hi = 1 + row["rel_low"], 1 + row["rel_high"]
    tail = "; no difference resolved" if lo <= 1 <= hi else ""
    d = ratio_decimals(hi - lo)
    return (
        f"{row['variant']} ends at {ratio:.{d}f}× {original}'s held-out JSD (95% t interval {lo:.{d}f}–{hi:.{d}f}, "
        f"{n} seeds{tail})."
    )


def ratio_decimals(width: float) -> int:
    """Decimals that show an interval of ``width`` on a ratio near 1: the last digit is at most half the width, so
    the bounds differ from the mean in print and a bound just above 1 does not round to it: 2 for a width of 0.06
    (``0.93×, 0.90–0.96``), 3 for 0.0114 (``0.999×, 0.993–1.004``, not ``1.00×, 0.99–1.00``), 5 for 8e-5
    (``1.00004×, 1.00000–1.00008``); at least 2, at most 9."""
    if not width > 0 or math.isnan(width):
        return 2
    return int(min(9, max(2, math.ceil(-math.log10(width / 2)))))


def patched_not_worse(sweep, original_precision: str, patched_precisions: Iterable[str], margin: float) -> dict:
    """The criterion's measurement: ``{"status", "measured", "details", "applies", "required"}``.

    Applies, and is required, because the plan configures the held-out evaluation (:func:`held_out_declared`)
    and the sweep has original and patched runs; never because of the group's name. Pairing: same seed, same
    training config and β form, values at the same step (each run's final planned step, :func:`final_values`).
    Completeness: every planned seed (:func:`planned_seeds`) has, for every patched variant, both runs with
    ``eval/jsd`` at that step; a gap is ``not_measured`` (a failure, since required), naming it. Else ``pass`` iff
    for every patched variant the upper bound of the 95% t interval on (patched − original) / original is ≤
    ``margin``."""
    out = _measure(sweep, original_precision, patched_precisions, margin)
    return {**out, "required": out["status"] != "not_applicable" and held_out_declared(sweep)}


def _pair_gaps(sweep, orig: pd.DataFrame, pats: pd.DataFrame, seeds: list, finals: pd.DataFrame) -> list:
    """What the planned pairs lack, one line each: a seed without a run of a patched variant, without its original
    twin, or a run without ``eval/jsd`` at its final planned step."""
    value = {str(r): (s, v) for r, s, v in zip(finals["run"], finals["step"], finals[EVAL_JSD])}
    last = _last_logged(sweep.history, EVAL_JSD) if EVAL_JSD in sweep.history.columns else {}
    steps = _final_steps(sweep.runs)

    def lacks(run: str, label: str, seed: Any) -> Optional[str]:
        v = value.get(run, (math.nan, math.nan))[1]
        if v == v:  # a value at the final step (NaN != NaN)
            return None
        at = last.get(run)
        return f"seed {seed}: {label} ({run}) has no {EVAL_JSD} at its final planned step {steps.get(run, '?')}" + (
            f" (its last is at step {at[0]})" if at else " (none logged)"
        )

    keys = outcome_pair_keys(sweep)
    gaps = []
    labels = pd.Series([variant_of(r) for _, r in pats.iterrows()], index=pats.index, dtype=object)
    for label in sorted(set(labels)):
        runs = pats[labels == label]
        for seed in seeds:
            mine = runs[pd.to_numeric(runs["run.seed"], errors="coerce") == seed]
            if mine.empty:
                gaps.append(f"seed {seed}: no {label} run")
                continue
            for _, p in mine.iterrows():
                twins = orig[
                    (pd.to_numeric(orig["run.seed"], errors="coerce") == seed)
                    & (orig["loss.beta_form"] == p["loss.beta_form"])
                ]
                twins = twins[[_pair_key(o, keys) == _pair_key(p, keys) for _, o in twins.iterrows()]]
                if len(twins) != 1:
                    gaps.append(f"seed {seed}: {len(twins)} original runs pair with {label} ({p['run']}), not 1")
                    continue
                gaps += [
                    g
                    for g in (
                        lacks(str(p["run"]), label, seed),
                        lacks(str(twins.iloc[0]["run"]), variant_of(twins.iloc[0]), seed),
                    )
                    if g
                ]
    return gaps


def _measure(sweep, original_precision: str, patched_precisions: Iterable[str], margin: float) -> dict:
    patched = [p for p in patched_precisions if role_of(p) == "patched"]
    runs = sweep.runs
    ran = runs[runs["outcome"] != "missing"] if "outcome" in runs.columns else runs
    orig = ran[ran["loss.precision"] == original_precision]
    pats = ran[ran["loss.precision"].isin(patched)]
    if orig.empty or pats.empty:
        return {
            "status": "not_applicable",
            "measured": "no original and patched runs to pair",
            "details": [],
            "applies": "not applicable: the sweep has no original and patched runs to pair by seed",
        }
    if not held_out_declared(sweep):
        return {
            "status": "not_applicable",
            "measured": "the plan configures no held-out evaluation (monitor.eval.every_n_steps = 0)",
            "details": [],
            "applies": "not applicable: the plan configures no held-out evaluation (monitor.eval.every_n_steps = 0)",
        }
    seeds = planned_seeds(sweep, pd.concat([orig, pats]))
    applies = (
        f"applies and required: the plan configures the held-out evaluation; original and patched runs paired by "
        f"seed ({', '.join(map(str, seeds))}) at their final planned step"
    )
    finals = final_values(sweep, [EVAL_JSD])
    if finals.empty:
        finals = pd.DataFrame(columns=["run", "step", EVAL_JSD])
    gaps = _pair_gaps(sweep, orig, pats, seeds, finals)
    if gaps:
        return {
            "status": "not_measured",
            "measured": f"held-out evidence incomplete ({len(gaps)} gap(s)): {gaps[0]}",
            "details": gaps,
            "applies": applies,
        }
    pairs = paired_differences(finals, original_precision, patched, [EVAL_JSD])
    table = pooled(pairs, [EVAL_JSD])
    details = [
        f"seed {_seed_text(r['seed'])}: {r['variant']} {r[EVAL_JSD + ':patched']:.6g} vs original "
        f"{r[EVAL_JSD + ':original']:.6g} ({r[EVAL_JSD + ':rel']:+.3%})"
        for _, r in pairs.iterrows()
    ]
    sentences = [outcome_sentence(r) for _, r in table.iterrows()]
    if table.empty or (table["n"] < 2).any():
        return {
            "status": "not_measured",
            "measured": " ".join(sentences) + " An interval needs 2 or more seeds.",
            "details": details,
            "applies": applies,
        }
    worst = float(table["rel_high"].max())
    status = "pass" if worst <= margin else "fail"
    return {
        "status": status,
        "measured": f"upper 95% bound of (patched − original)/original {worst:+.3%} "
        f"(non-inferiority margin {margin:+.2%}). " + " ".join(sentences),
        "details": details,
        "applies": applies,
    }


def seed_band(sweep, metric: str) -> pd.DataFrame:
    """Per variant and step, ``metric`` over the seeds: ``[variant, step, n, mean, low, high]`` with ``low``/``high``
    the smallest and largest seed's value (the seed band of the plot)."""
    hist = sweep.history
    if metric not in hist.columns:
        return pd.DataFrame(columns=["variant", "step", "n", "mean", "low", "high"])
    variants = {r["run"]: variant_of(r) for _, r in sweep.runs.iterrows()}
    h = hist[["run", "step", metric]].dropna()
    h = h.assign(variant=h["run"].map(variants))
    g = h.groupby(["variant", "step"], sort=True)[metric]
    return g.agg(n="count", mean="mean", low="min", high="max").reset_index()


#: Line styles and markers cycled over the variants of a seed-band plot, so lines that coincide stay visible.
_BAND_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"), ((0, (1, 2)), "P"))


def plot_seed_bands(sweep, metric: str, path, title: str):
    """PNG of ``metric`` over steps, one line per variant (mean over seeds) with the min–max seed band, each variant
    in its own line style and marker (an fp32 line equal to native's stays visible on top of it); under it, where
    the sweep has an original (native) variant, a panel with each other variant's mean minus the original's at
    their common steps. None when no run logged ``metric``."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    band = seed_band(sweep, metric)
    if band.empty:
        return None
    means = {v: g.set_index("step")["mean"] for v, g in band.groupby("variant", sort=True)}
    base = next((v for v in means if role_of(v.split("/")[0]) == "original"), None)
    others = [v for v in means if v != base] if base is not None else []
    if others:
        fig, (ax, dax) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        dax = None
    for i, (variant, g) in enumerate(band.groupby("variant", sort=True)):
        ls, marker = _BAND_STYLES[i % len(_BAND_STYLES)]
        n = int(g["n"].max())
        (line,) = ax.plot(
            g["step"],
            g["mean"],
            linestyle=ls,
            marker=marker,
            ms=5,
            mfc="none",
            lw=1.6,
            alpha=0.9,
            label=f"{variant} (mean of {n} seed(s))",
        )
        ax.fill_between(g["step"], g["low"], g["high"], color=line.get_color(), alpha=0.15)
        if dax is not None and variant != base:
            d = (means[variant] - means[base]).dropna()
            dax.plot(
                d.index,
                d.values,
                linestyle=ls,
                marker=marker,
                ms=4,
                mfc="none",
                color=line.get_color(),
                label=f"{variant} − {base}",
            )
    from matplotlib.ticker import MaxNLocator

    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))  # steps are integers: no tick at 22.5
    if dax is not None:
        dax.axhline(0.0, color="#888888", lw=0.8)
        dax.set_ylabel(f"variant − {base}")
        dax.grid(alpha=0.3)
        dax.legend(fontsize=9)
        dax.set_xlabel("optimizer step")
    else:
        ax.set_xlabel("optimizer step")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def headline(sweep, original_precision: str, patched_precisions: Iterable[str]) -> Optional[str]:
    """The first-screen sentence on final held-out JSD (one per patched variant), or None when the sweep has no
    seed-paired runs with ``eval/jsd``."""
    finals = final_values(sweep, [EVAL_JSD])
    if finals.empty:
        return None
    pairs = paired_differences(finals, original_precision, list(patched_precisions), [EVAL_JSD])
    if pairs.empty:
        return None
    table = pooled(pairs, [EVAL_JSD])
    return " ".join(outcome_sentence(r) for _, r in table.iterrows())


def report_section(sweep, doc, report_dir, original_precision: str, patched_precisions: Iterable[str]) -> None:
    """The report's held-out section: per-variant finals with t intervals, the seed-paired differences (per seed and
    pooled), and held-out JSD / the FP64 training objective / grad_norm over steps with the seed band."""
    from pathlib import Path

    from gkd_harness.harness.contract import SPOT_LOSS_FP64, TRAIN_GRAD_NORM

    doc.heading("Held-out outcome across seeds")
    finals = final_values(sweep)
    if finals.empty:
        doc.para("No run logged the held-out evaluation (`monitor.eval.every_n_steps` = 0): no outcome measured.")
        return
    patched = list(patched_precisions)
    doc.para(
        headline(sweep, original_precision, patched) or "No seed-paired original/patched runs: no difference measured."
    )
    doc.para(
        "Final held-out metrics (the last evaluation of each run, FP64, `gkd_harness.harness.rank.evaluation`): mean over "
        "seeds and the 95% Student-t interval (mean ± t(0.975, n−1)·sd/√n)."
    )
    doc.table(variant_table(finals), caption="per variant: mean and 95% t interval over seeds")
    pairs = paired_differences(finals, original_precision, patched)
    if not pairs.empty:
        cols = ["variant", "seed"] + [c for c in pairs.columns if c.startswith(EVAL_JSD + ":")]
        doc.table(
            pairs[cols], caption="per seed: patched − original final eval/jsd (same seed = same init and data order)"
        )
        doc.table(pooled(pairs), caption="pooled over seeds: mean difference and relative difference, 95% t interval")
    report_dir = Path(report_dir)
    for metric, name, what in (
        (EVAL_JSD, "eval_jsd_bands.png", "held-out JSD"),
        (SPOT_LOSS_FP64, "loss_fp64_bands.png", "FP64 training objective (spot checks)"),
        (TRAIN_GRAD_NORM, "grad_norm_bands.png", "grad_norm"),
    ):
        png = plot_seed_bands(sweep, metric, report_dir / name, f"{what} over steps")
        if png is not None:
            doc.image(
                png,
                f"{metric} over steps per variant: mean over seeds, band = smallest to largest seed; the "
                "lower panel: each variant's mean minus the original's",
            )


__all__ = [
    "OUTCOME_METRICS",
    "outcome_pair_keys",
    "t_interval",
    "variant_of",
    "final_values",
    "variant_table",
    "paired_differences",
    "pooled",
    "outcome_sentence",
    "patched_not_worse",
    "held_out_declared",
    "planned_seeds",
    "ratio_decimals",
    "seed_band",
    "plot_seed_bands",
    "headline",
    "report_section",
]
