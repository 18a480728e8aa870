"""The sweep's plan: what was launched, read from ``sweep_manifest.json`` (written at launch by
``gkd_harness.launch.sweep``), the one thing ``gkd-analyze``, ``gkd-dashboard`` and ``--verify`` judge a sweep by.

The manifest is append-only: ``launches`` holds every launch of the sweep folder (``id``, ``at``, ``points``, what
it ``adds``, ``drops`` and ``keeps``); ``points`` is the plan now; ``declared`` gives, per point, the seed, the
steps and the held-out evaluation interval that its config declares (and the point's overrides, the keys it
sweeps); ``signoff`` holds the criteria values the experiment preset declares (the non-inferiority margin of
``experiment=outcome``). A manifest of the first layout (``points`` only) and Hydra's ``multirun.yaml`` give the
point names alone.

:func:`read_plan` reads it; :func:`plan_problems` says which runs lie outside it (a copied run, another sweep's
run) and which training keys differ between runs though the plan sweeps none of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from gkd_harness.analysis.sweep.records import TRAINING_KEYS, RunRecord, UnusableInput
from gkd_harness.harness.contract import SWEEP_MANIFEST_FILE
from gkd_harness.harness.store.records import Manifest, RecordError, read_manifest

__all__ = [
    "Plan",
    "read_plan",
    "plan_of",
    "carried_plan",
    "missing_points",
    "apply_plan",
    "planned_by",
    "plan_problems",
    "TRAINING_KEYS",
    "EVAL_EVERY",
    "NO_PLAN",
    "require_plan",
]

EVAL_EVERY = "monitor.eval.every_n_steps"
#: What the evidence lacks when the source holds no plan (:attr:`gkd_harness.analysis.sweep.records.Sweep.lacks`),
#: the words the banner shows when ``--no-plan`` accepts it.
NO_PLAN = "no plan: completeness not checked"
_MULTIRUN_FILE = "multirun.yaml"


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Plan:
    """A sweep's plan. ``where``: the file it came from; ``points``: the planned point names (folder names);
    ``declared``: point -> ``{run.seed, run.max_steps, run.logging_steps, monitor.eval.every_n_steps, overrides}``
    (empty for a plan that declares names only); ``launches``: every launch; ``signoff``: declared criteria values."""

    where: str
    points: tuple
    declared: dict = field(default_factory=dict)
    launches: tuple = ()
    signoff: dict = field(default_factory=dict)
    group: Optional[str] = None

    @property
    def last_launch(self) -> dict:
        return dict(self.launches[-1]) if self.launches else {}

    def dropped(self) -> dict:
        """Point -> the id of the launch that dropped it from the plan (and never planned it again)."""
        out: dict = {}
        for launch in self.launches:
            for n in launch.get("drops") or []:
                out[str(n)] = launch.get("id")
            for n in launch.get("points") or []:
                out.pop(str(n), None)
        return {n: i for n, i in out.items() if n not in self.points}

    def value(self, point: str, key: str) -> Optional[int]:
        return _int((self.declared.get(point) or {}).get(key))

    @property
    def seeds(self) -> list:
        """The seeds the plan declares (sorted); empty when it declares none."""
        return sorted({s for p in self.points if (s := self.value(p, "run.seed")) is not None})

    @property
    def eval_declared(self) -> bool:
        """Whether the plan configures the held-out evaluation (``monitor.eval.every_n_steps`` > 0) for its points."""
        return any((self.value(p, EVAL_EVERY) or 0) > 0 for p in self.points)

    def swept_keys(self) -> set:
        """Keys some planned point overrides (``key=value``), i.e. keys the plan sweeps."""
        keys = set()
        for p in self.points:
            for line in (self.declared.get(p) or {}).get("overrides") or []:
                k, sep, _ = str(line).lstrip("+~").partition("=")
                if sep:
                    keys.add(k)
        return keys

    def summary(self) -> dict:
        """What verdict.json records of the plan (``--verify`` compares it)."""
        return {
            "file": self.where,
            "launches": [int(x.get("id") or 0) for x in self.launches],
            "points": len(self.points),
            "seeds": self.seeds,
            "eval_declared": self.eval_declared,
            "signoff": self.signoff,
        }


def plan_of(manifest: Manifest, where: str) -> Plan:
    """The :class:`Plan` of a sweep manifest record (``where``: the file it came from, as the report names it)."""
    return Plan(
        where,
        tuple(manifest.points),
        dict(manifest.declared),
        tuple(manifest.launches),
        dict(manifest.signoff),
        manifest.group,
    )


def _from_manifest(root: Path) -> Optional[Plan]:
    try:
        manifest = read_manifest(root)
    except RecordError as e:
        raise UnusableInput(str(e)) from None
    return plan_of(manifest, SWEEP_MANIFEST_FILE) if manifest is not None else None


def carried_plan(manifests: list) -> tuple:
    """``(plan, problems)`` from the copies of the sweep's manifest the runs carry (wandb: each run's files hold
    the manifest as it was when the run started): the copy with the most launches (the latest plan; earlier
    launches are its prefix). Copies of one launch count that disagree are a problem (runs of two sweeps).
    ``(None, [])`` when no run carries one."""
    if not manifests:
        return None, []
    latest = max(manifests, key=lambda m: len(m.launches))
    problems = []
    others = {
        tuple(m.points) for m in manifests if len(m.launches) == len(latest.launches) and m.points != latest.points
    }
    if others:
        problems.append(
            f"the runs carry {len(others) + 1} different plans of launch {len(latest.launches)} (runs of two sweeps)"
        )
    return plan_of(latest, f"{SWEEP_MANIFEST_FILE} (carried by the runs)"), problems


def _from_multirun(path: Path) -> Plan:
    try:
        from omegaconf import DictConfig, OmegaConf

        from gkd_harness.harness.launcher.sweep_points import point_name, sweep_points

        config = OmegaConf.load(path)
        if not isinstance(config, DictConfig):
            raise TypeError("not a mapping")
        names = [point_name(job, config) for job in sweep_points(config)]
    except Exception as e:  # noqa: BLE001 - a sweeper the basic expansion does not know
        raise UnusableInput(f"{path}: cannot list the sweep's planned points ({type(e).__name__}: {e})") from None
    return Plan(path.name, tuple(names), {}, ({"id": 1, "points": names},), {})


def read_plan(sweep: os.PathLike) -> Optional[Plan]:
    """The plan of the sweep folder ``sweep``: ``sweep_manifest.json``, else Hydra's ``multirun.yaml`` (names
    only), else None (a copied or hand-made sweep: no plan, the runs found are judged as they are)."""
    root = Path(sweep)
    plan = _from_manifest(root)
    if plan is not None:
        return plan
    if (root / _MULTIRUN_FILE).is_file():
        return _from_multirun(root / _MULTIRUN_FILE)
    return None


def _text(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "null"
    return str(v)


def plan_problems(runs: pd.DataFrame, plan: Optional[Plan]) -> list:
    """Why the runs are not the plan's runs, one line each (empty when they are): runs whose folder the plan does
    not name (``in_plan`` false), and training keys (:data:`TRAINING_KEYS`) on which runs that did not fail differ
    though no planned point overrides them (a run of another sweep, with another dataset or learning rate)."""
    out = []
    if plan is not None and "in_plan" in runs.columns:
        outside = runs[runs["in_plan"] == False]  # noqa: E712 - a column of True/False/None
        if len(outside):
            names = [str(x) for x in outside["point"].fillna(outside["run"])]
            out.append(
                f"{len(names)} run(s) outside the plan ({plan.where}, launch "
                f"{plan.last_launch.get('id', 1)}: {len(plan.points)} points): "
                + ", ".join(names[:5])
                + (" ..." if len(names) > 5 else "")
            )
    swept = plan.swept_keys() if plan is not None else set()
    # the runs whose evidence is judged: a missing point has no config, a failed one fails no_failed_runs anyway
    known = runs[~runs["outcome"].isin(["missing", "failed"])] if "outcome" in runs.columns else runs
    for key in TRAINING_KEYS:
        if key in swept or key not in known.columns:
            continue
        values = known[key].map(_text)
        values = values[values != "null"]
        if values.nunique() > 1:
            parts = [
                f"{v} ({len(g)} runs: {', '.join(map(str, known.loc[g.index, 'run'][:2]))}"
                + (", ..." if len(g) > 2 else "")
                + ")"
                for v, g in values.groupby(values, sort=True)
            ]
            out.append(f"runs differ in {key}, which the plan does not sweep: " + "; ".join(parts))
    return out


def planned_by(plan: Plan, point: str) -> Optional[int]:
    """The id of the last launch that planned ``point`` (None when none did)."""
    ids = [int(x.get("id") or 0) for x in plan.launches if point in (x.get("points") or [])]
    return ids[-1] if ids else None


def missing_points(plan: Optional[Plan], have: set, what: str = "run folder") -> list:
    """A ``missing`` :class:`RunRecord` for each point ``plan`` plans that is not in ``have`` (the points that
    have a run: folder names relative to the sweep folder, or the points the runs carry)."""
    if plan is None:
        return []
    out = []
    for name in plan.points:
        if name in have:
            continue
        out.append(
            RunRecord(
                name=name,
                status="missing",
                config={},
                history=[],
                path=None,
                error=f"planned by launch {planned_by(plan, name)} of {len(plan.launches)} ({plan.where}) but has "
                f"no {what}",
                problems=["never started, cancelled while pending, or its folder was deleted"],
            )
        )
    return out


def _eval_steps(sweep: Any) -> dict:
    evals = getattr(sweep, "evals", None)
    if not isinstance(evals, pd.DataFrame) or "run" not in evals.columns or not len(evals):
        return {}
    return {str(run): set(int(s) for s in g["step"]) for run, g in evals.groupby("run", sort=False, observed=True)}


def apply_plan(sweep: Any, plan: Optional[Plan], root: Optional[Path]) -> Any:
    """``sweep`` (a :class:`~gkd_harness.analysis.sweep.records.Sweep`) with its plan: ``plan`` set, and in
    ``runs`` the columns ``point`` (the run's folder relative to ``root``) and ``in_plan``; a completed run is
    ``incomplete`` when

    * the plan declares other ``run.max_steps`` for its point than the run was configured with (a 4-step run
      in an 8-step point's folder);
    * the held-out evaluation is configured (by the plan, else by the run's own config) and the run has no
      evaluation record at its final planned step: every criterion that reads held-out values needs the final
      one, at the same step on both sides of a pair."""
    import dataclasses

    r = sweep.runs.copy()
    points = []
    carried = r["sweep_point"] if "sweep_point" in r.columns else pd.Series([None] * len(r), index=r.index)
    for path, name, point in zip(r["path"], r["run"], carried):
        if isinstance(point, str) and point:  # the point the run carries (a wandb source)
            points.append(point)
        elif isinstance(path, str) and path and root is not None:
            rel = os.path.relpath(path, root)
            points.append(Path(path).name if rel == "." else rel)
        else:
            points.append(str(name))
    r["point"] = points
    r["in_plan"] = [p in plan.points for p in points] if plan is not None else None
    evals = _eval_steps(sweep)
    for i in r.index:
        if r.at[i, "outcome"] in ("missing", "tampered"):
            continue
        point = str(r.at[i, "point"])
        declared = plan is not None and point in plan.declared
        run_steps = _int(r.at[i, "run.max_steps"])
        plan_steps = plan.value(point, "run.max_steps") if declared and plan is not None else None
        every = plan.value(point, EVAL_EVERY) if declared and plan is not None else _int(r.at[i, EVAL_EVERY])
        notes = []
        if plan_steps is not None and run_steps is not None and plan_steps != run_steps:
            notes.append(
                f"the plan declares run.max_steps={plan_steps} for {point}; this run was configured for {run_steps}"
            )
        final = plan_steps or run_steps
        if r.at[i, "outcome"] == "completed" and every and every > 0 and final:
            have = evals.get(str(r.at[i, "run"]), set())
            if final not in have:
                last = max(have) if have else None
                notes.append(
                    f"no held-out evaluation at its final planned step {final} ({EVAL_EVERY}={every}, and at the "
                    f"end); {'last one at step ' + str(last) if last is not None else 'none logged'}"
                )
        if notes:
            if r.at[i, "outcome"] == "completed":
                r.at[i, "outcome"] = "incomplete"
            old = r.at[i, "problems"]
            r.at[i, "problems"] = "; ".join(([old] if isinstance(old, str) and old else []) + notes)
    lacks = tuple(x for x in sweep.lacks if x != NO_PLAN) + (() if plan is not None else (NO_PLAN,))
    return dataclasses.replace(sweep, runs=r, plan=plan, lacks=lacks)


def require_plan(sweep: Any, no_plan: bool = False) -> Any:
    """``sweep`` when it has a plan, or when ``no_plan`` accepts a sweep without one (its evidence then says
    :data:`NO_PLAN`); else :class:`UnusableInput` (exit 2): without the plan a deleted point, a cancelled array
    task or a run never started cannot be seen, so no verdict could say the sweep is complete."""
    if getattr(sweep, "plan", None) is None and not no_plan:
        raise UnusableInput(
            f"{sweep.source.split(':', 1)[-1]}: no plan (no {SWEEP_MANIFEST_FILE} or multirun.yaml in the sweep "
            "folder, and no run carries one), so missing points cannot be told; --no-plan judges the runs found "
            "without checking completeness"
        )
    return sweep
