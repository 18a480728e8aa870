"""Sign-off criteria: evaluate them on a sweep (the criteria file and its schema: :mod:`gkd_harness.analysis.signoff.criteria_file`).

Each criterion gives a :class:`Result` with its threshold and its measured value in words, a status
(``pass`` | ``fail`` | ``not_measured`` | ``not_applicable`` | ``skipped`` | ``disabled``), evidence rows and
``applies``: why the criterion applies to this sweep's design, or why not.

* ``not_applicable``: the sweep's design does not contain the criterion's subject (no continuous point for
  ``beta_forms_unchanged``, no low-precision original for ``original_shows_defect``, no FP32/FP32 native+fp32
  pair for ``precisions_unchanged_in_fp32``). Shown as such, never a failure.
* ``not_measured``: the design has the subject but the evidence is missing. A required criterion that is not
  measured fails: a sign-off cannot rest on missing evidence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict

import numpy as np
import pandas as pd

from gkd_harness.analysis.signoff.betacurve import beta_defect_inputs, fp64_beta_curve
from gkd_harness.analysis.signoff.compare import (
    largest_divergence,
    negatives_table,
    paired_runs,
    planned_max_steps,
    spot_table,
    step_agreement,
)
from gkd_harness.analysis.signoff.criteria_file import CRITERIA_NAMES, SignoffCriteria, load_criteria
from gkd_harness.analysis.sweep.evidence import annotate, judged_runs, low_precision_fix_claimed, precisions_of
from gkd_harness.analysis.sweep.records import Sweep
from gkd_harness.harness.contract import (
    BETA_FORMS,
    CANDIDATE,
    CONTINUOUS,
    CRITERION_STATUSES,
    FAILING_STATUSES,
    LOSS_CALLS_TOTAL,
    MIN_TOKEN_JSD,
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    NEG_TOKEN_FRAC,
    NONFINITE_CALLS_TOTAL,
    ORIGINAL,
    PAPER,
    PATCHED,
    SPOT_GRAD_REL_L2_DTYPE_FLOOR,
    CriterionStatus,
)

__all__ = [
    "Result",
    "Evidence",
    "build_evidence",
    "load_criteria",
    "evaluate",
    "evaluate_evidence",
    "CRITERIA",
    "SignoffCriteria",
    "counts",
]


@dataclass
class Result:
    name: str
    title: str
    status: CriterionStatus
    threshold: str
    measured: str
    details: list = field(default_factory=list)  # short strings: offending runs, evidence
    applies: str = ""  # why the criterion applies to this sweep's design (or why it does not)

    def reason(self) -> str:
        """One line: what was measured and, where something failed, the first offending item."""
        first = next((d for d in self.details if not d.startswith("FP64 formula check")), None)
        return self.measured + (f" (first: {first})" if first and self.status == "fail" else "")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------


def as_status(value: str) -> CriterionStatus:
    """``value`` as a criterion status (one of the contract's ``CRITERION_STATUSES``).

    Raises:
        ValueError: any other string.
    """
    if value not in CRITERION_STATUSES:
        raise ValueError(f"criterion status {value!r}: not one of {CRITERION_STATUSES}")
    return value  # narrowed by the membership test


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.3g}"


def _not_measured(name, title, threshold, why, required, applies: str = "") -> Result:
    return Result(name, title, "not_measured" if required else "skipped", threshold, why, applies=applies)


def _not_applicable(name, title, threshold, why) -> Result:
    return Result(name, title, "not_applicable", threshold, why, applies="not applicable: " + why)


def _values(runs: pd.DataFrame, col: str) -> str:
    v = sorted(str(x) for x in runs[col].dropna().unique()) if col in runs else []
    return ", ".join(v) or "none"


@dataclass
class Evidence:
    """What every criterion judges, computed once per sweep (:func:`build_evidence`).

    ``sweep``: the runs with their identity (:func:`gkd_harness.analysis.sweep.evidence.annotate`); ``judged``: the runs whose
    loss is judged, ``originals``: the upstream runs they are judged against, ``judged_why``: which and why
    (:func:`gkd_harness.analysis.sweep.evidence.judged_runs`); ``negatives``: :func:`~gkd_harness.analysis.signoff.compare.negatives_table`;
    ``spots``: :func:`~gkd_harness.analysis.signoff.compare.spot_table` at the spot tolerance, with each check's gradient
    allowance (:func:`spot_allowance`)."""

    sweep: Sweep
    judged: pd.DataFrame
    originals: pd.DataFrame
    judged_why: str
    negatives: pd.DataFrame
    spots: pd.DataFrame

    @property
    def conflicts(self) -> tuple:
        """Records of one fact with different values (:class:`~gkd_harness.analysis.sweep.records.RecordConflict`):
        a step or evaluation logged twice, a run's config given differently by summary.json and config.yaml."""
        return tuple(getattr(self.sweep, "conflicts", ()) or ())

    @property
    def runs(self) -> pd.DataFrame:
        return self.sweep.runs

    @property
    def candidate(self) -> bool:
        """A candidate sweep: the candidate is judged alone against upstream."""
        return bool((self.judged["loss.precision"] == CANDIDATE).any())

    @property
    def patched_precisions(self) -> tuple:
        """The precisions compared with the original on held-out data (role ``patched``)."""
        return (CANDIDATE,) if self.candidate else precisions_of(PATCHED)


def build_evidence(sweep: Sweep, cfg: SignoffCriteria) -> Evidence:
    """The evidence of ``sweep`` (each table computed once; the criteria and the report share it)."""
    sweep = annotate(sweep)
    judged, originals, why = judged_runs(sweep.runs)
    st = cfg.spot_tolerance
    spots = spot_allowance(sweep, spot_table(sweep, st.loss_rtol, st.loss_atol), st.grad_rel_l2_max)
    return Evidence(sweep, judged, originals, why, negatives_table(sweep), spots)


def _judged_applies(ev: Evidence) -> str:
    if len(ev.judged):
        return "applies: " + ev.judged_why
    return (
        f"the sweep has no patched run (loss.precision values: {_values(ev.runs, 'loss.precision')}); "
        "a sign-off of the patched loss needs them"
    )


def _judged_noun(ev: Evidence) -> str:
    return "candidate runs" if ev.candidate else "patched runs"


def spot_allowance(sweep: Sweep, spots: pd.DataFrame, grad_rel_l2_max: float) -> pd.DataFrame:
    """``spots`` with ``grad_floor`` (the student dtype's share, ``spot/grad_rel_l2_dtype_floor`` as the spot
    check logged it: 2x the rounding of the FP64 gradient to the student dtype, :func:`gkd_harness.harness.loss.tolerances.
    grad_tol`; 0 where not logged) and ``grad_tol`` = ``grad_rel_l2_max + grad_floor``."""
    h = sweep.history
    out = spots.copy()
    if SPOT_GRAD_REL_L2_DTYPE_FLOOR in h.columns and len(out):
        floor = h[["run", "step", SPOT_GRAD_REL_L2_DTYPE_FLOOR]].rename(
            columns={SPOT_GRAD_REL_L2_DTYPE_FLOOR: "grad_floor"}
        )
        out = out.merge(floor, on=["run", "step"], how="left")
    else:
        out["grad_floor"] = np.nan
    out["grad_floor_logged"] = out["grad_floor"].notna()
    out["grad_floor"] = pd.to_numeric(out["grad_floor"], errors="coerce").fillna(0.0).clip(lower=0.0)
    out["grad_tol"] = grad_rel_l2_max + out["grad_floor"]
    return out


def no_negative_patched(ev: Evidence, c: Any) -> Result:
    """Needs judged (patched or candidate) runs; every loss call of theirs is non-negative."""
    title = "Patched loss has no negative loss calls"
    thr = f"negative calls <= {c.max_negative_calls} (all judged runs, all ranks)"
    runs = ev.judged
    if runs.empty:
        return _not_measured(
            "no_negative_patched", title, thr, "no patched runs in the sweep", c.required, _judged_applies(ev)
        )
    neg = ev.negatives
    neg = neg[neg["run"].isin(runs["run"])]
    unknown = neg[neg["neg_loss_calls"].isna()]
    total = int(neg["neg_loss_calls"].fillna(0).sum())
    calls = int(neg["loss_calls"].fillna(0).sum())
    details = [
        f"{r.run}: {int(r.neg_loss_calls)} negative of {_fmt(r.loss_calls)} calls (min token JSD "
        f"{_fmt(r.min_token_jsd)})"
        for r in neg.itertuples()
        if (r.neg_loss_calls or 0) > 0
    ]
    details += [f"{r}: no negative-call counts logged" for r in unknown["run"]]
    ok = total <= c.max_negative_calls and unknown.empty
    measured = f"{total} negative of {calls} loss calls in {len(neg)} {_judged_noun(ev)}"
    if not unknown.empty:
        measured += f"; {len(unknown)} runs without counts"
    return Result("no_negative_patched", title, "pass" if ok else "fail", thr, measured, details, _judged_applies(ev))


def _steps(steps) -> str:
    steps = sorted(int(s) for s in set(steps))
    return ", ".join(map(str, steps[:10])) + (f" ... ({len(steps)} steps)" if len(steps) > 10 else "")


def no_nonfinite(ev: Evidence, c: Any) -> Result:
    """Needs judged runs; no non-finite loss call, metric or spot check in them."""
    title = "Patched runs have no non-finite values"
    thr = (
        f"non-finite loss calls <= {c.max_nonfinite_calls}; {', '.join(c.metrics)} finite at every logged step; "
        "no NaN/Inf spot check (all judged runs)"
    )
    runs, sweep = ev.judged, ev.sweep
    if runs.empty:
        return _not_measured(
            "no_nonfinite", title, thr, "no patched runs in the sweep", c.required, _judged_applies(ev)
        )
    names = set(runs["run"])
    neg = ev.negatives
    neg = neg[neg["run"].isin(names)]
    unknown = neg[neg["nonfinite_calls"].isna()]
    calls = int(neg["nonfinite_calls"].fillna(0).sum())
    details = [
        f"{r.run}: {int(r.nonfinite_calls)} non-finite loss calls"
        for r in neg.itertuples()
        if (r.nonfinite_calls or 0) > 0
    ]
    details += [f"{r}: no non-finite-call counts logged (gkd/nonfinite_calls_total)" for r in unknown["run"]]
    nf = sweep.nonfinite[sweep.nonfinite["run"].isin(names)]
    bad_metric = nf[nf["metric"].isin(c.metrics)]
    for (run, metric), g in bad_metric.groupby(["run", "metric"], sort=True, observed=True):
        values = sorted({repr(float(v)) for v in g["value"]})
        details.append(f"{run}: {metric} is {'/'.join(values)} at step {_steps(g['step'])}")
    bad_spot = nf[nf["metric"].str.startswith("spot/")]
    for run, g in bad_spot.groupby("run", sort=True, observed=True):
        details.append(
            f"{run}: non-finite spot check at step {_steps(g['step'])} ({', '.join(sorted(set(g['metric'])))})"
        )
    n_steps = len(bad_metric[["run", "step"]].drop_duplicates())
    n_spots = len(bad_spot[["run", "step"]].drop_duplicates())
    ok = calls <= c.max_nonfinite_calls and unknown.empty and n_steps == 0 and n_spots == 0
    measured = (
        f"{calls} non-finite loss calls, {n_steps} steps with a non-finite {' or '.join(c.metrics)}, "
        f"{n_spots} non-finite spot checks in {len(runs)} {_judged_noun(ev)}"
    )
    if not unknown.empty:
        measured += f"; {len(unknown)} runs without counts"
    return Result("no_nonfinite", title, "pass" if ok else "fail", thr, measured, details, _judged_applies(ev))


def spot_tolerance(ev: Evidence, c: Any) -> Result:
    """Needs judged runs with spot checks; each check within the FP64 tolerance."""
    title = "Patched loss and gradients match FP64 spot checks"
    pg = c.param_grad_rel_l2_max
    thr = (
        f"|loss - FP64| <= {c.loss_rtol:g}*|FP64| + {c.loss_atol:g}; logit-grad rel L2 <= "
        f"{c.grad_rel_l2_max:g} + 2x the student dtype's rounding of the FP64 gradient (logged per check)"
        + (f"; param-grad rel L2 <= {pg:g}" if pg is not None else "")
        + f"; sign mismatches <= {c.max_sign_mismatches}; >= {c.min_checks_per_run} checks per run"
    )
    runs = ev.judged
    applies = _judged_applies(ev)
    if runs.empty:
        return _not_measured("spot_tolerance", title, thr, "no patched runs in the sweep", c.required, applies)
    spots = ev.spots[ev.spots["run"].isin(runs["run"])]
    details = []
    counts = spots.groupby("run", observed=True).size().reindex(runs["run"], fill_value=0)
    few = counts[counts < c.min_checks_per_run]
    details += [f"{r}: {n} spot checks (< {c.min_checks_per_run})" for r, n in few.items()]
    if spots.empty:
        return Result(
            "spot_tolerance",
            title,
            "not_measured" if c.required else "skipped",
            thr,
            "no spot checks logged by patched runs",
            details,
            applies,
        )
    finite = np.isfinite(spots[["loss", "loss_fp64", "abs_err"]].astype(float)).all(axis=1)
    nonfinite = spots[~finite]
    details += [
        f"{r.run} step {r.step}: non-finite spot check (loss {r.loss!r}, FP64 {r.loss_fp64!r}): failed"
        for r in nonfinite.head(20).itertuples()
    ]
    bad_loss = spots[~spots["within_tol"] & finite]
    details += [
        f"{r.run} step {r.step}: |loss-FP64|={r.abs_err:.3g} > tol {r.tol:.3g} (loss {r.loss:.6g}, "
        f"FP64 {r.loss_fp64:.6g})"
        for r in bad_loss.head(20).itertuples()
    ]
    bad_grad = spots[spots["grad_rel_l2"] > spots["grad_tol"]]
    details += [
        f"{r.run} step {r.step}: logit-grad rel L2 {r.grad_rel_l2:.3g} > {r.grad_tol:.3g} "
        f"({c.grad_rel_l2_max:g} + dtype rounding {r.grad_floor:.3g})"
        for r in bad_grad.head(20).itertuples()
    ]
    no_floor = spots[~spots["grad_floor_logged"]]
    if len(no_floor):
        details.append(
            f"{len(no_floor)} spot checks without {SPOT_GRAD_REL_L2_DTYPE_FLOOR} (older runs): "
            "their gradient allowance is the flat limit"
        )
    no_grad = spots["grad_rel_l2"].isna().sum()
    if no_grad:
        details.append(f"{no_grad} spot checks without a logit-gradient error")
    bad_pg = spots[spots["param_grad_rel_l2"] > pg] if pg is not None else spots.iloc[0:0]
    details += [
        f"{r.run} step {r.step}: param-grad rel L2 {r.param_grad_rel_l2:.3g}" for r in bad_pg.head(20).itertuples()
    ]
    signs = int(spots["sign_mismatch"].fillna(0).sum())
    if signs > c.max_sign_mismatches:
        details.append(f"{signs} sign mismatches between loss and FP64")
    ok = (
        nonfinite.empty
        and bad_loss.empty
        and bad_grad.empty
        and bad_pg.empty
        and few.empty
        and no_grad == 0
        and signs <= c.max_sign_mismatches
    )
    ratio = (spots["abs_err"] / spots["tol"]).max()
    measured = (
        f"{len(spots)} checks in {spots['run'].nunique()} runs: worst |loss-FP64|/tol {_fmt(ratio)} "
        f"(max rel err {_fmt(spots['rel_err'].max())}), max logit-grad rel L2 "
        f"{_fmt(spots['grad_rel_l2'].max())} (allowance {_fmt(spots['grad_tol'].min())}–"
        f"{_fmt(spots['grad_tol'].max())}: {c.grad_rel_l2_max:g} + dtype rounding up to "
        f"{_fmt(spots['grad_floor'].max())}), max param-grad rel L2 {_fmt(spots['param_grad_rel_l2'].max())}"
        f", sign mismatches {signs}; {len(nonfinite)} non-finite, {len(bad_loss)} loss and {len(bad_grad) + len(bad_pg)} gradient checks "
        "beyond tolerance"
    )
    return Result("spot_tolerance", title, "pass" if ok else "fail", thr, measured, details, applies)


def original_shows_defect(ev: Evidence, c: Any) -> Result:
    """Needs original runs with a BF16/FP16 side at the loss wherever the sweep claims the precision fix (a
    patched run with such a side): without them nothing shows the harness sees the defect (``not_measured``).
    Not applicable when no run of the sweep has a BF16/FP16 side at the loss."""
    title = "Original loss shows the precision defect where expected"
    thr = (
        f"{c.require} original (native) runs with a BF16/FP16 side at the loss boundary "
        "(mixed or not, BF16/BF16 included) show a negative loss call, a spot sign mismatch, or a spot error "
        "beyond the patched tolerance; needed wherever a patched run has such a side"
    )
    r, originals = ev.runs, ev.originals
    claim = low_precision_fix_claimed(ev.judged)
    unknown = originals[originals["dtype.student"].isna() | originals["dtype.teacher"].isna()]
    expected = originals[originals["low_precision"].fillna(False).astype(bool)]
    if expected.empty and unknown.empty:
        if claim is not None:
            names = ", ".join(map(str, claim["run"].head(5))) + (" ..." if len(claim) > 5 else "")
            why = (
                f"no original run with a BF16/FP16 side at the loss, although {len(claim)} patched runs with such "
                f"a side claim the precision fix ({names}): nothing shows that the harness sees the defect"
            )
            res = _not_measured(
                "original_shows_defect",
                title,
                thr,
                why,
                c.required,
                "applies: patched runs with a BF16/FP16 side at the loss claim the precision fix",
            )
            res.details = [
                f"{run}: {a}/{b} original, no defect expected"
                for run, a, b in zip(originals["run"], originals["dtype.student"], originals["dtype.teacher"])
            ]
            return res
        if originals.empty and r["low_precision"].fillna(False).astype(bool).any():
            return _not_measured(
                "original_shows_defect",
                title,
                thr,
                "no original (native) run, although a BF16/FP16 side reaches the loss in this "
                "sweep: nothing shows that the harness sees the defect",
                c.required,
                "applies: the sweep has a BF16/FP16 side at the loss",
            )
        if originals.empty:
            return _not_applicable(
                "original_shows_defect",
                title,
                thr,
                "the sweep has no original (native) run and no BF16/FP16 side at the loss",
            )
        res = _not_applicable(
            "original_shows_defect",
            title,
            thr,
            f"every original run has FP32 or wider on both sides at the loss "
            f"({len(originals)} runs) and no patched run claims a BF16/FP16 fix: the defect "
            "needs a BF16/FP16 side",
        )
        res.details = [f"{run}: FP32/FP32 original, no defect expected" for run in originals["run"]]
        return res
    applies = (
        (
            f"applies: {len(expected)} original runs with a BF16/FP16 side at the loss ("
            + ", ".join(sorted({f"{a}/{b}" for a, b in zip(expected["dtype.student"], expected["dtype.teacher"])}))
            + ")"
        )
        if len(expected)
        else "applies: original runs whose dtypes at the loss were not recorded"
    )
    if expected.empty:
        return _not_measured(
            "original_shows_defect",
            title,
            thr,
            f"{len(unknown)} original runs recorded no dtypes at the loss boundary (summary.json dtypes_seen)",
            c.required,
            applies,
        )
    neg = ev.negatives.set_index("run")
    spots = ev.spots[ev.spots["run"].isin(expected["run"])]
    seen, details = [], []
    for run in expected["run"]:
        s = spots[spots["run"] == run]
        n_neg = neg.loc[run, "neg_loss_calls"] if run in neg.index else np.nan
        found = {
            "negative calls": int(n_neg) if pd.notna(n_neg) else 0,
            "sign mismatches": int(s["sign_mismatch"].fillna(0).sum()),
            "spot loss beyond tol": int((~s["within_tol"]).sum()),
            "logit-grad rel L2 max": s["grad_rel_l2"].max() if len(s) else np.nan,
        }
        hit = (
            found["negative calls"] > 0
            or found["sign mismatches"] > 0
            or found["spot loss beyond tol"] > 0
            or bool((s["grad_rel_l2"] > s["grad_tol"]).any())
        )
        seen.append(hit)
        details.append(
            f"{run}: {'defect seen' if hit else 'NOT seen'} ("
            + ", ".join(f"{k} {_fmt(v)}" for k, v in found.items())
            + ")"
        )
    n_seen = int(sum(seen))
    ok = all(seen) if c.require == "all" else any(seen)
    details += [f"{run}: dtypes at the loss not recorded" for run in unknown["run"]]
    return Result(
        "original_shows_defect",
        title,
        "pass" if ok else "fail",
        thr,
        f"defect seen in {n_seen} of {len(seen)} expected original runs",
        details,
        applies,
    )


def _agreement_thr(c: Any) -> str:
    return f"|a - b| <= {c.rtol:g}*max(|a|,|b|) + {c.atol:g} at every common step of " + ", ".join(c.metrics)


def _agreement_result(
    name, title, agreement: pd.DataFrame, c: Any, no_pairs: str, applies: str = "", runs=None, plan=None
) -> Result:
    thr = _agreement_thr(c)
    if agreement.empty or "max_abs_diff" not in agreement:
        return _not_measured(name, title, thr, no_pairs, c.required, applies)
    a = agreement[agreement["metric"].isin(c.metrics)].copy()
    details = []
    no_common = a[a["common_steps"] == 0]
    details += [f"{r.run_a} vs {r.run_b}: no common steps for {r.metric}" for r in no_common.itertuples()]
    a = a[a["common_steps"] > 0]
    if a.empty:
        return _not_measured(name, title, thr, "paired runs share no logged steps", c.required, applies)
    ok_rows = a["violations"] == 0
    bad = a[~ok_rows]
    details += [
        f"{r.run_a} vs {r.run_b}: {r.metric} beyond tolerance at {r.violations} of {r.common_steps} steps, "
        f"largest {r.max_abs_diff:.3g} (rel {r.max_rel_diff:.3g}) at step {r.at_step}"
        for r in bad.itertuples()
    ]
    worst = a.loc[a["max_rel_diff"].idxmax()]
    pairs = a[["run_a", "run_b"]].drop_duplicates()
    measured = (
        f"{len(pairs)} pairs; largest divergence {worst['max_rel_diff']:.3g} relative "
        f"({worst['max_abs_diff']:.3g} absolute) in {worst['metric']} at step {int(worst['at_step'])} "
        f"({worst['run_a']} vs {worst['run_b']})"
    )
    if "gkd.beta" in a:
        measured += "; β compared: " + ", ".join(f"{b:g}" for b in sorted(a["gkd.beta"].dropna().unique()))
    short = _short_pairs(a, runs, plan) if runs is not None else []
    if short:
        measured += f"; {len(short)} pair{'s' if len(short) > 1 else ''} compared on fewer steps than planned"
        details += short
    status: CriterionStatus = "pass" if bad.empty and no_common.empty else "fail"
    return Result(name, title, status, thr, measured, details, applies)


def _short_pairs(agreement: pd.DataFrame, runs: pd.DataFrame, plan) -> list:
    """One line per compared pair with a run that logged fewer training steps than planned (an incomplete run
    let through by ``no_failed_runs.allow_incomplete``, or a failed one): how many steps were compared."""
    planned = pd.to_numeric(planned_max_steps(runs, plan), errors="coerce")
    steps = dict(zip(runs["run"], planned))
    logged = dict(zip(runs["run"], runs["train_steps"])) if "train_steps" in runs.columns else {}
    out = []
    for (ra, rb), g in agreement.groupby(["run_a", "run_b"], sort=False):
        want = max(steps.get(ra, np.nan), steps.get(rb, np.nan))
        if not want == want:  # no planned steps recorded
            continue
        low = [(r, int(logged[r])) for r in (ra, rb) if r in logged and logged[r] < (steps.get(r) or want)]
        if low:
            out.append(
                f"{ra} vs {rb}: compared on {int(g['common_steps'].max())} common steps of {int(want)} planned ("
                + ", ".join(f"{r} logged {n} of {int(steps.get(r) or want)}" for r, n in low)
                + ")"
            )
    return out


def beta_forms_unchanged(ev: Evidence, c: Any) -> Result:
    """Needs a paper and a continuous run equal in every other key (one precision, one β of ``c.betas``); not
    applicable without such a pair (``-m loss=original,continuous`` compares two precisions, not two forms)."""
    title = "β ∈ {" + ", ".join(f"{b:g}" for b in c.betas) + "} unchanged between paper and continuous forms"
    sweep = ev.sweep
    runs = sweep.runs[sweep.runs["gkd.beta"].isin(c.betas)]
    betas = ", ".join(f"{b:g}" for b in c.betas)
    forms = set(runs["loss.beta_form"].dropna())
    if not set(BETA_FORMS) <= forms:
        lacking = " and ".join(f for f in BETA_FORMS if f not in forms)
        res = _not_applicable(
            "beta_forms_unchanged",
            title,
            _agreement_thr(c),
            f"the sweep has no {lacking} point at β ∈ {{{betas}}} (β forms in the sweep: "
            f"{_values(sweep.runs, 'loss.beta_form')})",
        )
    elif not paired_runs(runs, "loss.beta_form", "paper", "continuous", sweep.plan):
        res = _not_applicable(
            "beta_forms_unchanged",
            title,
            _agreement_thr(c),
            f"the sweep has no paper/continuous pair at one precision and β ∈ {{{betas}}} "
            f"(paper precisions: {_values(runs[runs['loss.beta_form'] == PAPER], 'loss.precision')}"
            f"; continuous: {_values(runs[runs['loss.beta_form'] == CONTINUOUS], 'loss.precision')})",
        )
    else:
        agreement = step_agreement(
            sweep, "loss.beta_form", "paper", "continuous", runs=runs, metrics=c.metrics, rtol=c.rtol, atol=c.atol
        )
        res = _agreement_result(
            "beta_forms_unchanged",
            title,
            agreement,
            c,
            "no paired paper/continuous runs at these β (runs equal in every other key)",
            f"applies: paper and continuous points at one precision and β ∈ {{{betas}}}",
            runs,
            sweep.plan,
        )
    # The formula itself, in FP64 on the β-curve's fixed inputs: the forms must coincide exactly at these β.
    s, t = beta_defect_inputs()
    curve = fp64_beta_curve(s, t, c.betas).pivot(index="beta", columns="form", values="D")
    diff = float((curve[PAPER] - curve[CONTINUOUS]).abs().max())
    res.details.append(
        f"FP64 formula check (fixed synthetic inputs): max |D_paper - D_continuous| over these β = {diff:.3g}"
    )
    if diff > c.atol:
        res.status = "fail"
    return res


def precisions_unchanged_in_fp32(ev: Evidence, c: Any) -> Result:
    """Needs a native and an fp32 run equal in every other key with FP32 on both sides at the loss, and their
    FP64 spot checks. Each side is judged against FP64, not against the other: fp32 must be no further from
    FP64 than native, ``max rel err(fp32) <= max rel err(native) + rtol``. How far the two curves are apart is
    shown, never judged (the fix being closer to FP64 moves it away from native)."""
    title = "fp32 is no further from FP64 than native where both sides are FP32"
    thr = (
        f"max |loss − FP64|/|FP64| over an fp32 run's spot checks <= its native twin's + {c.rtol:g} "
        "(FP32/FP32 at the loss; each side judged against FP64)"
    )
    r = ev.runs
    both = r[(r["dtype.student"] == "float32") & (r["dtype.teacher"] == "float32")]
    pairs = paired_runs(both, "loss.precision", "native", "fp32", ev.sweep.plan)
    if not pairs:
        precs = set(both["loss.precision"].dropna())
        return _not_applicable(
            "precisions_unchanged_in_fp32",
            title,
            thr,
            f"the sweep has no native and fp32 runs equal in every other key with FP32 on both "
            f"sides at the loss (FP32/FP32 precisions: {', '.join(sorted(map(str, precs))) or 'none'})",
        )
    applies = "applies: native and fp32 runs with FP32/FP32 at the loss"
    spots = ev.spots
    err = spots[np.isfinite(spots["rel_err"].astype(float))].groupby("run", observed=True)["rel_err"].max()
    details, bad, measured_pairs, worst = [], 0, 0, None
    for a, b in pairs:
        if a not in err.index or b not in err.index:
            details.append(
                f"{a} vs {b}: no FP64 spot check on " + " and ".join(x for x in (a, b) if x not in err.index)
            )
            continue
        measured_pairs += 1
        ea, eb = float(err[a]), float(err[b])
        ok = eb <= ea + c.rtol
        bad += not ok
        worst = max(worst or -np.inf, eb - ea)
        details.append(f"{b}: {eb:.3g} from FP64 vs native {a}: {ea:.3g} ({'ok' if ok else 'further from FP64'})")
    agreement = step_agreement(ev.sweep, "loss.precision", "native", "fp32", runs=both, metrics=c.metrics)
    ld = largest_divergence(agreement)
    if ld:
        details.append(
            f"information only: native and fp32 curves apart by up to {ld['max_rel_diff']:.3g} relative "
            f"in {ld['metric']} at step {ld['at_step']}"
        )
    if not measured_pairs:
        res = _not_measured(
            "precisions_unchanged_in_fp32",
            title,
            thr,
            "no FP64 spot checks in the native/fp32 pairs (monitor.spot_check off?)",
            c.required,
            applies,
        )
        res.details = details
        return res
    status: CriterionStatus = "pass" if bad == 0 and measured_pairs == len(pairs) else "fail"
    measured = (
        f"{measured_pairs} native/fp32 pairs judged against FP64: {bad} with fp32 further from FP64 than "
        f"native (largest excess {worst:+.3g})"
    )
    return Result("precisions_unchanged_in_fp32", title, status, thr, measured, details, applies)


def _said(x: Any) -> bool:
    """Whether a table cell holds text to show (not None, NaN or blank)."""
    return isinstance(x, str) and bool(x.strip())


def no_failed_runs(ev: Evidence, c: Any) -> Result:
    """Applies to every sweep: every planned run completed (all its steps)."""
    title = "No failed runs"
    allowed = {"completed", "incomplete"} if c.allow_incomplete else {"completed"}
    thr = "every run completed" + ("" if c.allow_incomplete else " all run.max_steps steps")
    r = ev.runs
    bad = r[~r["outcome"].isin(allowed)]
    counts = r["outcome"].value_counts().to_dict()
    details = [
        f"{x.run}: {x.outcome}"
        + (f" — {x.error}" if _said(x.error) else "")  # an empty cell is NaN, never shown as "nan"
        + (f" ({x.problems})" if _said(x.problems) else "")
        for x in bad.itertuples()
    ]
    noted = r[r["outcome"].isin(allowed) & r["problems"].map(_said)]
    details += [f"{x.run}: note: {x.problems}" for x in noted.itertuples()]
    measured = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f" of {len(r)} runs"
    missing = r[r["outcome"] == "missing"]
    if len(missing):
        measured += (
            "; planned but without a run folder: "
            + ", ".join(map(str, missing["run"].head(10)))
            + (f" ... ({len(missing)})" if len(missing) > 10 else "")
        )
    return Result(
        "no_failed_runs",
        title,
        "pass" if bad.empty else "fail",
        thr,
        measured,
        details,
        "applies to every sweep (planned points from the sweep's "
        + (
            f"{ev.sweep.plan.where})"
            if getattr(ev.sweep, "plan", None) is not None
            else "plan: none, so completeness is not checked against planned points)"
        ),
    )


def patched_not_worse(ev: Evidence, c: Any) -> Result:
    """Held-out outcome (issue 20): the upper 95% t bound of (patched − original)/original final eval/jsd,
    seed-paired, is <= ``c.margin`` (gkd_harness.analysis.signoff.outcome)."""
    from gkd_harness.analysis.signoff.outcome import patched_not_worse as measure

    name, title = "patched_not_worse", "Patched loss distills no worse on held-out data"
    thr = (
        f"upper 95% bound of (patched − original)/original eval/jsd at the final planned step <= {c.margin:.2%} "
        "(non-inferiority margin; same seed, same step; every planned seed)"
    )
    m = measure(ev.sweep, precisions_of(ORIGINAL)[0], ev.patched_precisions, c.margin)
    status = m["status"]
    if status == "not_measured" and not (c.required or m["required"]):  # required in the outcome experiments
        status = "skipped"
    return Result(name, title, status, thr, m["measured"], m["details"], m["applies"])


def candidate_certified(ev: Evidence, c: Any) -> Result:
    """A candidate fix (``loss=candidate``) passes ``gkd-certify``, once per sha256, cached in the sweep folder
    (gkd_harness.analysis.signoff.certificates)."""
    from gkd_harness.analysis.signoff.certificates import certificate_rows

    raw, thr, measured, details, applies = certificate_rows(ev.runs, ev.sweep.source, c.quick, c.strict)
    status = as_status(raw)
    if status == "fail" and not c.required:
        status = "skipped"
    return Result(
        "candidate_certified",
        "Candidate fix passes the loss certificate (gkd-certify)",
        status,
        thr,
        measured,
        details,
        applies,
    )


CRITERIA = {
    "no_negative_patched": no_negative_patched,
    "no_nonfinite": no_nonfinite,
    "spot_tolerance": spot_tolerance,
    "original_shows_defect": original_shows_defect,
    "beta_forms_unchanged": beta_forms_unchanged,
    "precisions_unchanged_in_fp32": precisions_unchanged_in_fp32,
    "no_failed_runs": no_failed_runs,
    "patched_not_worse": patched_not_worse,
    "candidate_certified": candidate_certified,
}


_NEGATIVE_KEYS = (NEG_LOSS_CALLS, NEG_LOSS_CALLS_TOTAL, LOSS_CALLS_TOTAL, MIN_TOKEN_JSD, NEG_TOKEN_FRAC)


def _spot(key: str) -> bool:
    return key.startswith("spot/")


def _reads(ev: Evidence, name: str, c: Any) -> tuple:
    """``(runs, key -> bool)``: the runs criterion ``name`` reads and which of their logged keys (None: it reads
    no logged value)."""
    r = ev.runs
    if name == "no_negative_patched":
        return set(ev.judged["run"]), lambda k: k in _NEGATIVE_KEYS
    if name == "no_nonfinite":
        return set(ev.judged["run"]), lambda k: k in c.metrics or _spot(k) or k == NONFINITE_CALLS_TOTAL
    if name == "spot_tolerance":
        return set(ev.judged["run"]), _spot
    if name == "original_shows_defect":
        return set(ev.originals["run"]), lambda k: _spot(k) or k in _NEGATIVE_KEYS
    if name == "beta_forms_unchanged":
        return set(r.loc[r["gkd.beta"].isin(c.betas), "run"]), lambda k: k in c.metrics
    if name == "precisions_unchanged_in_fp32":
        return set(r["run"]), lambda k: k in c.metrics or _spot(k)
    if name == "patched_not_worse":
        return set(r["run"]), lambda k: k.startswith("eval/")
    return set(), None


def _conflicted(ev: Evidence, r: Result, c: Any) -> Result:
    """``r``, or ``not_measured`` (``skipped`` when not required) when the criterion reads a record that was
    recorded twice with different values, naming each run and step: a step (or evaluation) it reads, or a run
    whose identity (config) its records give two ways, which no criterion can place (``no_failed_runs`` fails
    such a run as tampered, and judges no logged value)."""
    if r.status == "disabled" or not ev.conflicts:
        return r
    runs, reads = _reads(ev, r.name, c)
    hits = [x for x in ev.conflicts if x.step is None and reads is not None]
    if r.status != "not_applicable":
        hits += [x for x in ev.conflicts if x.step is not None and reads is not None and x.run in runs and reads(x.key)]
    if not hits:
        return r
    from gkd_harness.analysis.signoff.outcome import held_out_declared

    lines = [x.line() for x in hits]
    required = c.required or (r.name == "patched_not_worse" and held_out_declared(ev.sweep))
    return Result(
        r.name,
        r.title,
        "not_measured" if required else "skipped",
        r.threshold,
        f"{len(hits)} conflicting record(s), not judged by order: {lines[0]}",
        lines + r.details,
        r.applies,
    )


def evaluate_evidence(ev: Evidence, cfg: SignoffCriteria) -> tuple:
    """Evaluate every criterion on ``ev`` -> (verdict "pass"|"fail", [Result]); a criterion that reads
    conflicting records is not measured (:func:`_conflicted`)."""
    assert tuple(CRITERIA) == CRITERIA_NAMES, "criteria functions and schema sections differ"
    results = []
    for name, fn in CRITERIA.items():
        c = getattr(cfg, name)
        if not c.enabled:
            results.append(
                Result(
                    name,
                    name,
                    "disabled",
                    "",
                    "turned off by the criteria file",
                    applies="turned off by the criteria file",
                )
            )
            continue
        results.append(_conflicted(ev, fn(ev, c), c))
    verdict = "fail" if any(r.status in FAILING_STATUSES for r in results) else "pass"
    return verdict, results


def evaluate(sweep: Sweep, cfg: SignoffCriteria) -> tuple:
    """Evaluate every criterion on ``sweep`` -> (verdict "pass"|"fail", [Result])."""
    return evaluate_evidence(build_evidence(sweep, cfg), cfg)


def counts(results: list) -> dict:
    """How many criteria passed, failed (``fail`` or a required ``not_measured``), were not applicable, skipped
    (not required, nothing measured), and turned off by the criteria file (``disabled``), and which."""
    by = {
        "passed": ("pass",),
        "failed": FAILING_STATUSES,
        "not_applicable": ("not_applicable",),
        "skipped": ("skipped",),
        "disabled": ("disabled",),
    }
    out: Dict[str, Any] = {k: sum(r.status in v for r in results) for k, v in by.items()}
    out["names"] = {k: [r.name for r in results if r.status in v] for k, v in by.items()}
    return out
