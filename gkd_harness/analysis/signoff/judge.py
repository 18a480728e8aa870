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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gkd_harness.analysis.signoff.criteria import Evidence, build_evidence, evaluate_evidence
from gkd_harness.analysis.signoff.criteria_file import SignoffCriteria, load_criteria
from gkd_harness.analysis.sweep.evidence import mixed_evidence
from gkd_harness.analysis.sweep.plan import plan_problems
from gkd_harness.analysis.sweep.records import Sweep, UnusableInput, mixed_sweep_problems

__all__ = ["Judged", "load_runs", "judge", "margin_line"]


@dataclass
class Judged:
    """A sweep's judgement: the criteria used, the evidence, the verdict and each criterion's result, what
    ``allow_mixed`` let through (``mixed``)."""

    sweep: Sweep
    cfg: SignoffCriteria
    ev: Evidence
    verdict: str
    results: list
    mixed: list
    allow_mixed: bool
    criteria_file: Optional[Path] = None


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
    ``allow_mixed`` is false, naming each problem (``label``: how the sweep is named in that line)."""
    plan = getattr(sweep, "plan", None)
    cfg = load_criteria(
        criteria_file,
        plan.signoff if plan is not None else None,
        f"{plan.where} (the plan's declared criteria)" if plan is not None else "the plan",
    )
    mixed = mixed_problems(sweep)
    if mixed and not allow_mixed:
        raise UnusableInput(
            f"{label or sweep.source} is not one comparison: {'; '.join(mixed)} (--allow-mixed analyses them together)"
        )
    ev = build_evidence(sweep, cfg)
    verdict, results = evaluate_evidence(ev, cfg)
    return Judged(sweep, cfg, ev, verdict, results, mixed, allow_mixed, criteria_file)


def margin_line(j: Judged) -> str:
    """The non-inferiority margin in the verdict line, with where it comes from, when ``patched_not_worse``
    applies (else empty)."""
    r = next((r for r in j.results if r.name == "patched_not_worse"), None)
    if r is None or r.status in ("not_applicable", "disabled"):
        return ""
    plan = getattr(j.sweep, "plan", None)
    declared = ((plan.signoff if plan is not None else {}) or {}).get("patched_not_worse", {}) or {}
    where = "the plan" if "margin" in declared else "the shipped criteria"
    if j.criteria_file is not None and "margin" in Path(j.criteria_file).read_text():
        where = f"--criteria {j.criteria_file}"
    return f"; non-inferiority margin {j.cfg.patched_not_worse.margin:.2%} ({where})"
