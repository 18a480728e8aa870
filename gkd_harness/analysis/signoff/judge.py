"""One verdict, computed in one place: ``gkd-analyze``, ``gkd-analyze --verify`` and ``gkd-dashboard`` all call
:func:`load_runs` and :func:`judge`, so they judge the same runs against the same plan with the same criteria.

* :func:`load_runs`: the runs of a sweep from its source (local run folders with the sweep's plan, wandb offline
  files, the wandb server);
* :func:`judge`: the criteria (the shipped ones, the values the plan declares, a ``--criteria`` file over both),
  what makes the runs not one comparison (runs outside the plan, several groups, two ms-swift versions or
  rank-side codes, runs without provenance, a variant with two loss sources: refused unless ``allow_mixed``),
  the evidence, and the verdict with every criterion's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gkd_harness.analysis.signoff.criteria import Evidence, build_evidence, evaluate_evidence
from gkd_harness.analysis.signoff.criteria_file import SignoffCriteria, criteria_changes, load_criteria
from gkd_harness.analysis.sweep.evidence import mixed_evidence
from gkd_harness.analysis.sweep.plan import plan_problems
from gkd_harness.analysis.sweep.records import Sweep, UnusableInput, mixed_sweep_problems
from gkd_harness.harness.contract import FAILING_STATUSES

__all__ = ["Judged", "load_runs", "judge", "margin_line", "rests_on", "headline"]


@dataclass
class Judged:
    """A sweep's judgement: the criteria used, the evidence, the verdict and each criterion's result, what
    ``allow_mixed`` let through (``mixed``), and what the verdict rests on: ``changes`` (each criteria key whose
    value is not the shipped one: ``{key, shipped, value, by}``, ``by`` the --criteria file or the plan),
    ``shipped`` (``{verdict, failed}`` with the --criteria file's changes taken out; None without such changes)
    and ``headline`` (the defect's and the fix's numbers, from the criteria: :func:`headline`)."""

    sweep: Sweep
    cfg: SignoffCriteria
    ev: Evidence
    verdict: str
    results: list
    mixed: list
    allow_mixed: bool
    criteria_file: Optional[Path] = None
    changes: list = field(default_factory=list)
    shipped: Optional[dict] = None
    headline: Optional[str] = None


def load_runs(source: str, sweep: str, group: Optional[str]) -> Sweep:
    """The runs of ``sweep`` from ``source`` (local | wandb-offline | wandb); a local sweep folder brings its
    plan (:mod:`gkd_harness.analysis.sweep.plan`)."""
    from gkd_harness.analysis.sweep.offline import load_wandb_offline
    from gkd_harness.analysis.sweep.runs import load_sweep
    from gkd_harness.analysis.sweep.wandb_api import load_wandb_sweep

    if source == "local":
        return _only_group(load_sweep(Path(sweep)), group) if group else load_sweep(Path(sweep))
    if source == "wandb-offline":
        return load_wandb_offline(Path(sweep), group)
    if not group:
        raise UnusableInput("--source wandb needs --group (the sweep's wandb group)")
    return load_wandb_sweep(sweep, group)


def _only_group(sweep: Sweep, group: str) -> Sweep:
    """The runs of wandb group ``group`` (and the planned points without a run folder); :class:`UnusableInput`
    when none is of that group."""
    import dataclasses

    r = sweep.runs
    keep = (r["group"] == group) | (r["outcome"] == "missing")
    if not (r["group"] == group).any():
        raise UnusableInput(f"{sweep.source}: no run of group {group!r}")
    names = set(r.loc[keep, "run"])

    def only(df):
        return df[df["run"].isin(names)].reset_index(drop=True) if "run" in df.columns else df

    return dataclasses.replace(
        sweep,
        runs=r[keep].reset_index(drop=True),
        history=only(sweep.history),
        nonfinite=only(sweep.nonfinite),
        evals=only(sweep.evals),
    )


def mixed_problems(sweep: Sweep) -> list:
    """Why the loaded runs are not one comparison (empty when they are)."""
    return plan_problems(sweep.runs, getattr(sweep, "plan", None)) + mixed_sweep_problems(sweep) + mixed_evidence(sweep)


def judge(sweep: Sweep, criteria_file: Optional[Path] = None, allow_mixed: bool = False, label: Any = None) -> Judged:
    """Judge ``sweep``: raises :class:`UnusableInput` (exit 2) when its runs are not one comparison and
    ``allow_mixed`` is false, naming each problem (``label``: how the sweep is named in that line).

    When the --criteria file changes a value, the sweep is also judged without it (the shipped criteria and the
    plan's declared ones), so the verdict line can say whether the file decided the verdict."""
    plan = getattr(sweep, "plan", None)
    declared_src = f"{plan.where} (the plan's declared criteria)" if plan is not None else "the plan"
    declared = plan.signoff if plan is not None else None
    cfg = load_criteria(criteria_file, declared, declared_src)
    mixed = mixed_problems(sweep)
    if mixed and not allow_mixed:
        raise UnusableInput(
            f"{label or sweep.source} is not one comparison: {'; '.join(mixed)} (--allow-mixed analyses them together)"
        )
    ev = build_evidence(sweep, cfg)
    verdict, results = evaluate_evidence(ev, cfg)
    shipped_cfg = load_criteria()
    planned_cfg = load_criteria(None, declared, declared_src) if declared else shipped_cfg
    by_plan = {k for k, _, _ in criteria_changes(planned_cfg, shipped_cfg)}
    by_file = {k for k, _, _ in criteria_changes(cfg, planned_cfg)}
    changes = [
        {
            "key": k,
            "shipped": old,
            "value": new,
            "by": _file_label(criteria_file)
            if k in by_file
            else (plan.where if plan is not None and k in by_plan else "?"),
        }
        for k, old, new in criteria_changes(cfg, shipped_cfg)
    ]
    shipped = None
    if by_file:
        v, res = evaluate_evidence(build_evidence(sweep, planned_cfg), planned_cfg)
        shipped = {"verdict": v, "failed": [r.name for r in res if r.status in FAILING_STATUSES]}
    return Judged(
        sweep, cfg, ev, verdict, results, mixed, allow_mixed, criteria_file, changes, shipped, headline(ev, results)
    )


def _file_label(criteria_file: Optional[Path]) -> str:
    """How the verdict names a --criteria file: its name (the path and sha256 are in verdict.json's inputs)."""
    return Path(criteria_file).name if criteria_file is not None else ""


def _shown(v: Any) -> str:
    """A criteria value as the YAML writes it: ``true``, ``null``, ``0.0001``, ``[0, 1]``."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_shown(x) for x in v) + "]"
    return str(v)


def rests_on(j: Judged) -> str:
    """What the verdict rests on besides the shipped criteria, in one sentence for the banner, the console's
    verdict line and verdict.json: each changed key with its shipped and its used value, by whom (the --criteria
    file or the plan), and the verdict the shipped criteria give when a --criteria file changed something.
    Empty when every value is the shipped one."""
    if not j.changes:
        return ""
    parts = []
    for by in dict.fromkeys(c["by"] for c in j.changes):
        mine = [c for c in j.changes if c["by"] == by]
        by_file = j.criteria_file is not None and by == _file_label(j.criteria_file)
        who = f"criteria file {by}" if by_file else f"the plan ({by})"
        parts.append(
            f"{who} changes " + ", ".join(f"{c['key']} {_shown(c['shipped'])} → {_shown(c['value'])}" for c in mine)
        )
    text = "; ".join(parts)
    if j.shipped is not None:
        if j.shipped["verdict"] != j.verdict:
            failed = ", ".join(j.shipped["failed"])
            text += f"; without the criteria file the verdict is {j.shipped['verdict'].upper()}" + (
                f" ({failed})" if failed else ""
            )
        else:
            text += f"; without the criteria file the verdict is also {j.shipped['verdict'].upper()}"
    return text


#: The criteria that say whether the fix holds (their failure is the headline's "Fix"), and the defect's.
_FIX_CRITERIA = ("no_negative_patched", "no_nonfinite", "spot_tolerance")
_DEFECT_CRITERION = "original_shows_defect"


def _failing_text(results: list, names: tuple) -> str:
    bad = [r for r in results if r.name in names and r.status in FAILING_STATUSES]
    out = []
    for r in bad:
        first = next((d for d in r.details if not d.startswith("FP64 formula check")), None)
        out.append(f"{r.name} {r.status} ({first or r.measured})")
    return "; ".join(out)


def headline(ev: Evidence, results: list) -> Optional[str]:
    """One line with the defect's and the fix's numbers, computed from the criteria: the original (native) loss's
    negative loss calls and its worst gradient error against FP64, then the same two for the patched runs, e.g.
    "Defect: original (native) 20/20 negative loss calls, gradient up to 0.3 off FP64 (relative L2). Fix: patched
    (fp32) 0/40 negative loss calls, gradient within 2e-06 of FP64." A side whose criteria fail says so instead
    of its numbers ("Fix: NOT shown: spot_tolerance fail (...)"), so the line never contradicts a failing
    criterion. None when neither side logged anything and nothing failed."""
    import pandas as pd

    from gkd_harness.harness.contract import ORIGINAL, PATCHED

    neg, spots = ev.negatives, ev.spots
    parts = []
    for role, what, names in ((ORIGINAL, "Defect", (_DEFECT_CRITERION,)), (PATCHED, "Fix", _FIX_CRITERIA)):
        failing = _failing_text(results, names)
        if failing:
            parts.append(f"{what}: NOT {'seen' if role == ORIGINAL else 'shown'}: {failing}.")
            continue
        n = neg[neg["variant"] == role] if "variant" in neg.columns else neg.iloc[0:0]
        s = spots[spots["variant"] == role] if "variant" in spots.columns else spots.iloc[0:0]
        calls, negative = n["loss_calls"].sum(min_count=1), n["neg_loss_calls"].sum(min_count=1)
        grad = s["grad_rel_l2"].max() if "grad_rel_l2" in s.columns and s["grad_rel_l2"].notna().any() else None
        if pd.isna(calls) and grad is None:
            continue
        precisions = ", ".join(sorted({str(p) for p in n["loss.precision"].dropna()}))
        said = [f"{negative:.0f}/{calls:.0f} negative loss calls"] if not pd.isna(calls) else []
        if grad is not None:
            said.append(
                f"gradient up to {grad:.2g} off FP64 (relative L2)"
                if role == ORIGINAL
                else f"gradient within {grad:.2g} of FP64"
            )
        parts.append(f"{what}: {role} ({precisions}) {', '.join(said)}.")
    return " ".join(parts) or None


def margin_line(j: Judged) -> str:
    """The non-inferiority margin in the verdict line, with where it comes from, when ``patched_not_worse``
    applies (else empty)."""
    r = next((r for r in j.results if r.name == "patched_not_worse"), None)
    if r is None or r.status in ("not_applicable", "disabled"):
        return ""
    plan = getattr(j.sweep, "plan", None)
    declared = ((plan.signoff if plan is not None else {}) or {}).get("patched_not_worse", {}) or {}
    where = "the plan" if "margin" in declared else "the shipped criteria"
    if any(c["key"] == "patched_not_worse.margin" and c["by"] == _file_label(j.criteria_file) for c in j.changes):
        where = f"--criteria {j.criteria_file}"
    return f"; non-inferiority margin {j.cfg.patched_not_worse.margin:.2%} ({where})"
