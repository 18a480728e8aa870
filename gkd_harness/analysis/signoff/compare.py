"""Comparison tables over a loaded :class:`gkd_harness.analysis.load.Sweep`.

* :func:`run_summary`: per run, final and mean loss / grad_norm, keyed by (β, β form, precision).
* :func:`negatives_table`: negative-loss calls and negative-token fractions per run.
* :func:`spot_table` / :func:`spot_distribution`: FP64 spot-check errors, row by row and per variant.
* :func:`step_agreement`: step-for-step divergence between runs that should agree (paired on every config key
  except the one that varies): the two β forms at β ∈ {0, 0.5, 1}, and native vs fp32 precision where both
  sides reach the loss in FP32.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from gkd_harness.analysis.sweep.records import CONFIG_COLUMNS, Sweep
from gkd_harness.harness.contract import (
    JSD_LOSS,
    LOSS_CALLS_TOTAL,
    MIN_TOKEN_JSD,
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    NEG_TOKEN_FRAC,
    NONFINITE_CALLS_TOTAL,
    SPOT_GRAD_REL_L2,
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    SPOT_PARAM_GRAD_REL_L2,
    SPOT_SIGN_MISMATCH,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
)

__all__ = [
    "CURVE_METRICS",
    "PAIR_KEYS",
    "run_summary",
    "negatives_table",
    "spot_table",
    "spot_distribution",
    "step_agreement",
    "paired_runs",
    "pair_keys",
    "planned_max_steps",
    "forms_agreement",
    "precision_agreement",
    "largest_divergence",
]

CURVE_METRICS = (TRAIN_LOSS, TRAIN_GRAD_NORM, JSD_LOSS)
#: Keys two runs must share to be compared step for step (one of them is allowed to vary).
PAIR_KEYS = tuple(k for k in CONFIG_COLUMNS if k not in ("model.student", "model.teacher")) + (
    "model.student",
    "model.teacher",
    "dtype.student",
    "dtype.teacher",
)
_LABEL_KEYS = ["gkd.beta", "loss.beta_form", "loss.precision", "variant", "gkd.temperature", "gkd.topk", "run.seed"]


def _meta(sweep: Sweep) -> pd.DataFrame:
    cols = ["run"] + [c for c in _LABEL_KEYS if c in sweep.runs.columns] + ["outcome", "mixed_dtypes"]
    return sweep.runs[cols]


def _col(h: pd.DataFrame, name: str) -> pd.Series:
    return h[name] if name in h.columns else pd.Series(np.nan, index=h.index)


def run_summary(sweep: Sweep, metrics: Sequence[str] = CURVE_METRICS) -> pd.DataFrame:
    """Per run: ``{metric}:final`` (last logged value), ``{metric}:mean`` and ``steps`` logged.

    Sorted by β, β form, precision, so original (native) and patched (fp32) rows sit next to each other.
    """
    h = sweep.history
    cols = [m for m in metrics if m in h.columns]
    g = h.sort_values(["run", "step"]).groupby("run", sort=False, observed=True)
    parts = {"steps": g["step"].count()}
    for m in cols:
        parts[f"{m}:final"] = g[m].last()
        parts[f"{m}:mean"] = g[m].mean()
    per_run = pd.DataFrame(parts)
    out = _meta(sweep).merge(per_run, left_on="run", right_index=True, how="left")
    return out.sort_values(
        [c for c in ("gkd.beta", "loss.beta_form", "loss.precision", "run.seed", "run") if c in out.columns]
    ).reset_index(drop=True)


def negatives_table(sweep: Sweep) -> pd.DataFrame:
    """Per run: ``neg_loss_calls`` (the larger of the last cumulative total and the sum of the per-window
    counts, so a skipped log line cannot hide a negative), ``loss_calls``, ``neg_call_frac``,
    ``neg_token_frac_max``/``_mean``, ``min_token_jsd``, ``nonfinite_calls``."""
    h = sweep.history
    g = h.groupby("run", sort=False, observed=True)
    res = pd.DataFrame(index=sweep.runs["run"])
    total = g[NEG_LOSS_CALLS_TOTAL].max() if NEG_LOSS_CALLS_TOTAL in h else None
    window = g[NEG_LOSS_CALLS].sum(min_count=1) if NEG_LOSS_CALLS in h else None
    parts = [x for x in (total, window) if x is not None]
    res["neg_loss_calls"] = pd.concat(parts, axis=1).max(axis=1) if parts else np.nan
    res["loss_calls"] = g[LOSS_CALLS_TOTAL].max() if LOSS_CALLS_TOTAL in h else np.nan
    res["neg_call_frac"] = res["neg_loss_calls"] / res["loss_calls"].replace(0, np.nan)
    if NEG_TOKEN_FRAC in h:
        res["neg_token_frac_max"] = g[NEG_TOKEN_FRAC].max()
        res["neg_token_frac_mean"] = g[NEG_TOKEN_FRAC].mean()
    else:
        res["neg_token_frac_max"] = res["neg_token_frac_mean"] = np.nan
    res["min_token_jsd"] = g[MIN_TOKEN_JSD].min() if MIN_TOKEN_JSD in h else np.nan
    res["nonfinite_calls"] = g[NONFINITE_CALLS_TOTAL].max() if NONFINITE_CALLS_TOTAL in h else np.nan
    out = _meta(sweep).merge(res, left_on="run", right_index=True, how="left")
    return out.sort_values(
        [c for c in ("loss.precision", "gkd.beta", "loss.beta_form", "run") if c in out.columns]
    ).reset_index(drop=True)


def spot_table(sweep: Sweep, rtol: float, atol: float) -> pd.DataFrame:
    """One row per logged spot check, with the tolerance ``rtol·|FP64| + atol`` and whether the loss meets it
    (``rtol``/``atol``: the criteria file's ``spot_tolerance.loss_rtol``/``loss_atol``, their one home).

    ``abs_err`` is the logged ``spot/loss_abs_err`` where present, else ``|spot/loss − spot/loss_fp64|``.
    A spot check is a step that logged any ``spot/`` metric, NaN or ±Inf included (``sweep.nonfinite``); a
    non-finite check is never within tolerance.
    """
    h = sweep.history
    spot_cols = [c for c in h.columns if c.startswith("spot/")]
    if not spot_cols:
        return pd.DataFrame(
            columns=[
                "run",
                "step",
                "loss",
                "loss_fp64",
                "abs_err",
                "rel_err",
                "grad_rel_l2",
                "param_grad_rel_l2",
                "sign_mismatch",
                "tol",
                "within_tol",
            ]
        )
    logged = h[spot_cols].notna().any(axis=1)
    nf = sweep.nonfinite
    nf = nf[nf["metric"].str.startswith("spot/")]
    if len(nf):
        keys = pd.MultiIndex.from_frame(nf[["run", "step"]])
        logged |= pd.MultiIndex.from_frame(h[["run", "step"]]).isin(keys)
    s = h[logged]
    out = pd.DataFrame(
        {
            "run": s["run"],
            "step": s["step"],
            "loss": _col(s, SPOT_LOSS),
            "loss_fp64": _col(s, SPOT_LOSS_FP64),
        }
    )
    computed = (out["loss"] - out["loss_fp64"]).abs()
    out["abs_err"] = _col(s, SPOT_LOSS_ABS_ERR).fillna(computed)
    out["rel_err"] = _col(s, SPOT_LOSS_REL_ERR).fillna(out["abs_err"] / out["loss_fp64"].abs())
    out["grad_rel_l2"] = _col(s, SPOT_GRAD_REL_L2)
    out["param_grad_rel_l2"] = _col(s, SPOT_PARAM_GRAD_REL_L2)
    sign = _col(s, SPOT_SIGN_MISMATCH)
    out["sign_mismatch"] = sign.fillna(((out["loss"] < 0) != (out["loss_fp64"] < 0)).astype(float))
    out["tol"] = rtol * out["loss_fp64"].abs() + atol
    out["within_tol"] = out["abs_err"] <= out["tol"]
    return _meta(sweep).merge(out, on="run", how="inner").reset_index(drop=True)


def spot_distribution(spots: pd.DataFrame) -> pd.DataFrame:
    """Per (precision, mixed dtypes): count and quantiles (median, p95, max) of each spot error."""
    if spots.empty:
        return pd.DataFrame()
    rows = []
    for (prec, mixed), g in spots.groupby(["loss.precision", "mixed_dtypes"], dropna=False):
        row = {"loss.precision": prec, "mixed_dtypes": bool(mixed), "checks": len(g), "runs": g["run"].nunique()}
        for m in ("rel_err", "grad_rel_l2", "param_grad_rel_l2"):
            v = g[m].dropna()
            row[f"{m}:median"] = v.median() if len(v) else np.nan
            row[f"{m}:p95"] = v.quantile(0.95) if len(v) else np.nan
            row[f"{m}:max"] = v.max() if len(v) else np.nan
        row["sign_mismatches"] = int(g["sign_mismatch"].fillna(0).sum())
        row["beyond_tol"] = int((~g["within_tol"]).sum())
        rows.append(row)
    return pd.DataFrame(rows)


#: The keys that name the loss variant itself: never a pairing key (one of them is what a comparison varies).
_LOSS_VARIANT_KEYS = ("role", "loss.precision", "loss.beta_form", "candidate", "loss_sha256")


def pair_keys(runs: pd.DataFrame, vary, plan=None) -> list:
    """The keys two runs must share to be compared while ``vary`` (a key, or a tuple of keys) differs: the
    config columns (:data:`PAIR_KEYS`), every key of a run's identity but the loss variant
    (:data:`gkd_harness.analysis.sweep.evidence.VARIANT_KEYS`: learning rate, dataset, batch size, max_length, the
    held-out evaluation keys, versions) and every key the plan sweeps (``plan.swept_keys()``), other than
    ``vary``; only those ``runs`` has as columns."""
    from gkd_harness.analysis.sweep.evidence import VARIANT_KEYS

    varied = {vary} if isinstance(vary, str) else set(vary)
    swept = sorted(plan.swept_keys()) if plan is not None else []
    keys = [*PAIR_KEYS, *(k for k in VARIANT_KEYS if k not in _LOSS_VARIANT_KEYS), *swept]
    return [k for k in dict.fromkeys(keys) if k in runs.columns and k not in varied]


def planned_max_steps(runs: pd.DataFrame, plan=None) -> pd.Series:
    """Each run's planned ``run.max_steps``: what the plan declares for its point, else its own config's (a run
    relaunched or cut with fewer steps is still the plan's point, paired with its twin, and incomplete)."""
    own = runs["run.max_steps"] if "run.max_steps" in runs.columns else pd.Series(np.nan, index=runs.index)
    if plan is None or not getattr(plan, "declared", None) or "point" not in runs.columns:
        return own
    declared = [plan.value(str(p), "run.max_steps") for p in runs["point"]]
    return pd.Series([d if d is not None else o for d, o in zip(declared, own)], index=runs.index, dtype=object)


def paired_runs(runs: pd.DataFrame, vary: str, a: str, b: str, plan=None) -> list:
    """(run_a, run_b) pairs equal on every :func:`pair_keys` key, with ``vary`` = a / b; ``run.max_steps``
    compared as planned (:func:`planned_max_steps`)."""
    keys = pair_keys(runs, vary, plan)
    r = runs.copy()
    if "run.max_steps" in r.columns:
        r["run.max_steps"] = planned_max_steps(r, plan)
    r[keys] = r[keys].astype(str)  # NaN/None compare equal as strings
    left = r[r[vary] == a][["run"] + keys]
    right = r[r[vary] == b][["run"] + keys]
    m = left.merge(right, on=keys, suffixes=("_a", "_b"))
    return list(zip(m["run_a"], m["run_b"]))


def step_agreement(
    sweep: Sweep,
    vary: str,
    a: str,
    b: str,
    runs: Optional[pd.DataFrame] = None,
    metrics: Sequence[str] = CURVE_METRICS,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> pd.DataFrame:
    """Step-for-step divergence of paired runs (``vary`` = a vs b, everything else equal).

    One row per (pair, metric): ``common_steps``, ``max_abs_diff``, ``max_rel_diff`` (|x−y| / max(|x|, |y|)),
    ``at_step`` (step of the largest relative divergence), ``only_in_one`` (steps logged by one run only),
    ``violations`` (common steps with ``|x−y| > rtol·max(|x|,|y|) + atol``).
    """
    runs = sweep.runs if runs is None else runs
    pairs = paired_runs(runs, vary, a, b, getattr(sweep, "plan", None))
    if not pairs:
        return pd.DataFrame()
    h = sweep.history
    metrics = [m for m in metrics if m in h.columns]

    def side(k: int) -> pd.DataFrame:
        names = [p[k] for p in pairs]
        if len(set(names)) == len(names):  # each run in one pair: one hash pass over the run column, no merge
            pair = pd.Index(names).get_indexer(h["run"])
            keep = pair >= 0
            return h.loc[keep, ["step"] + metrics].assign(pair=pair[keep])
        sub = h.loc[h["run"].isin(set(names)), ["run", "step"] + metrics]
        return sub.merge(pd.DataFrame({"pair": range(len(pairs)), "run": names}), on="run")

    ha, hb = side(0), side(1)
    # one row per pair: the pair's runs and run_a's configuration (the columns a row of this table names)
    meta = runs.drop_duplicates("run").set_index("run").reindex(columns=_AGREEMENT_META)
    base = pd.DataFrame({"run_a": [p[0] for p in pairs], "run_b": [p[1] for p in pairs]})
    base = pd.concat([base, meta.reindex(base["run_a"]).reset_index(drop=True)], axis=1)
    index = pd.RangeIndex(len(pairs))
    tables = []
    for m in metrics:
        x = ha[["pair", "step", m]].dropna()
        y = hb[["pair", "step", m]].dropna()
        j = x.merge(y, on=["pair", "step"], how="outer", suffixes=("_a", "_b"), indicator=True)
        both = j[j["_merge"] == "both"].copy()
        only = j[j["_merge"] != "both"].groupby("pair").size()
        xa, yb = both[m + "_a"].astype(float), both[m + "_b"].astype(float)
        both["diff"] = (xa - yb).abs()
        scale = np.maximum(xa.abs(), yb.abs())
        both["rel"] = (both["diff"] / scale.replace(0, np.nan)).fillna(0.0)
        both["viol"] = both["diff"] > rtol * scale + atol
        g = both.groupby("pair")
        stats = pd.DataFrame(
            {
                "common_steps": g.size(),
                "max_abs_diff": g["diff"].max(),
                "max_rel_diff": g["rel"].max(),
                "violations": g["viol"].sum(),
            }
        )
        at = both.loc[g["rel"].idxmax(), ["pair", "step"]].set_index("pair")["step"] if len(both) else pd.Series()
        t = base.copy()
        t["metric"] = m
        t["common_steps"] = stats["common_steps"].reindex(index).fillna(0).astype(int).to_numpy()
        t["only_in_one"] = only.reindex(index).fillna(0).astype(int).to_numpy()
        t[vary] = f"{a} vs {b}"  # the key that differs between the two runs
        if len(stats):
            measured = stats.reindex(index)
            t["max_abs_diff"] = measured["max_abs_diff"].astype(float).to_numpy()
            t["max_rel_diff"] = measured["max_rel_diff"].astype(float).to_numpy()
            t["at_step"] = _int_where_all(at.reindex(index))
            t["violations"] = _int_where_all(measured["violations"])
        tables.append(t)
    return pd.concat(tables, ignore_index=True)


#: The configuration of run_a in each row of :func:`step_agreement` (None where the sweep has no such column).
_AGREEMENT_META = ["gkd.beta", "loss.beta_form", "loss.precision", "run.seed"]


def _int_where_all(s: pd.Series) -> np.ndarray:
    """int64 when every pair has a value, else float64 with NaN where a pair had no common step."""
    return s.astype("int64").to_numpy() if s.notna().all() else s.astype(float).to_numpy()


def forms_agreement(sweep: Sweep, betas: Iterable[float] = (0.0, 0.5, 1.0)) -> pd.DataFrame:
    """Paper vs continuous, step for step, at the β where the two forms coincide."""
    betas = list(betas)
    runs = sweep.runs[sweep.runs["gkd.beta"].isin(betas)]
    return step_agreement(sweep, "loss.beta_form", "paper", "continuous", runs=runs)


def precision_agreement(sweep: Sweep) -> pd.DataFrame:
    """Native vs fp32 precision, step for step, in runs where both sides reach the loss in FP32."""
    r = sweep.runs
    fp32 = (r["dtype.student"] == "float32") & (r["dtype.teacher"] == "float32")
    return step_agreement(sweep, "loss.precision", "native", "fp32", runs=r[fp32])


def largest_divergence(agreement: pd.DataFrame) -> Optional[dict]:
    """The row with the largest ``max_rel_diff`` (None when nothing was compared)."""
    if agreement.empty or "max_rel_diff" not in agreement or agreement["max_rel_diff"].isna().all():
        return None
    row = agreement.loc[agreement["max_rel_diff"].idxmax()]
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
