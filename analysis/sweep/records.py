"""The tables every loader produces, and the one function that builds them.

Lowest layer of the loaders (:mod:`analysis.sweep.runs`, :mod:`analysis.sweep.wandb_api`, :mod:`analysis.sweep.offline`
all import from here; this module imports none of them).

:class:`Sweep`:

* ``runs``: one row per run, keyed by ``run``; config columns with their dotted names (``loss.precision``,
  ``loss.beta_form``, ``gkd.beta``, ``gkd.temperature``, ``gkd.topk``, ``run.seed``, ``backend.name``, ...),
  the dtypes seen at the loss boundary (``dtype.student``, ``dtype.teacher``), ``status`` as the run reported
  it, and ``outcome`` in {completed, failed, incomplete, missing}. Failed or incomplete runs are kept and
  marked; a completed run whose log lacks a step that ``run.max_steps`` and ``run.logging_steps`` promise is
  incomplete (the problems name the steps); ``missing`` is a point the sweep planned that has no run folder.
  ``low_precision``: a BF16/FP16 side reaches the loss (``mixed_dtypes``: the two sides differ as well).
* ``history``: one row per (run, step) with one column per metric name (``train/loss``, ``spot/grad_rel_l2``,
  ...). Several lines logged for the same step are merged (later non-null values win, except counts and error
  maxima, where the worst copy wins) and reported in the run's problems. NaN and ±Inf stay as
  they were logged; a metric a step did not log is also NaN there.
* ``nonfinite``: one row per logged value that was NaN or ±Inf (columns ``run, step, metric, value``), so a
  logged NaN can be told apart from a metric that was not logged at that step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from harness.contract import (MIN_TOKEN_JSD, NEG_LOSS_CALLS, NEG_LOSS_CALLS_TOTAL, NEG_TOKEN_FRAC,
                              NONFINITE_CALLS_TOTAL, SPOT_GRAD_REL_L2, SPOT_LOSS_ABS_ERR, SPOT_LOSS_REL_ERR,
                              SPOT_PARAM_GRAD_REL_L2, SPOT_SIGN_MISMATCH)

__all__ = [
    "UnusableInput",
    "RunRecord",
    "Sweep",
    "CONFIG_COLUMNS",
    "TRACKING_COLUMNS",
    "int_step",
    "tabulate",
    "expected_steps",
    "mixed_sweep_problems",
    "step_gaps",
]

#: Config columns every runs table carries (NaN/None when a run does not say).
CONFIG_COLUMNS = (
    "loss.precision",
    "loss.beta_form",
    "loss.source",  # loss=candidate: the candidate's file or module, and its label
    "loss.name",
    "gkd.beta",
    "gkd.temperature",
    "gkd.topk",
    "gkd.sft_alpha",
    "gkd.lmbda",
    "gkd.seq_kd",
    "run.seed",
    "run.max_steps",
    "backend.name",
    "model.student",
    "model.teacher",
    "model.student_dtype",
    "model.teacher_dtype",
)
#: wandb target of the runs (used to put the analysis run next to them).
TRACKING_COLUMNS = ("tracking.wandb.project", "tracking.wandb.entity", "tracking.wandb.group", "tracking.wandb.mode")
_LOW_PRECISION = {"bfloat16", "float16", "bf16", "fp16", "half"}
_NONFINITE_COLUMNS = ["run", "step", "metric", "value"]


class UnusableInput(Exception):
    """The sweep cannot be analysed (exit code 2). The message names the offending file or folder."""


@dataclass
class RunRecord:
    """One run before tabulation.

    config: flat dotted keys. history: list of metric dicts (each with an int ``step``), or a DataFrame with a
    ``step`` column; for a DataFrame (where a NaN and a missing value look alike) ``nonfinite`` lists the
    logged NaN/±Inf values as ``(step, metric, value)``.
    """

    name: str
    status: str  # as reported: completed | failed | running (wandb: finished->completed, crashed->failed);
    # missing: a point the sweep planned that has no run folder
    config: dict
    history: Any
    error: Optional[str] = None
    group: Optional[str] = None
    path: Optional[str] = None
    dtypes_seen: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    last_step: Optional[int] = None
    wall_s: Optional[float] = None
    problems: list = field(default_factory=list)
    nonfinite: list = field(default_factory=list)


def _empty_nonfinite() -> pd.DataFrame:
    return pd.DataFrame({"run": pd.Series([], dtype=object), "step": pd.Series([], dtype="int64"),
                         "metric": pd.Series([], dtype=object), "value": pd.Series([], dtype="float64")})


@dataclass
class Sweep:
    """A loaded sweep. ``runs``: one row per run. ``history``: one row per (run, step).
    ``nonfinite``: every logged NaN/±Inf value, ``[run, step, metric, value]``."""

    source: str
    runs: pd.DataFrame
    history: pd.DataFrame
    nonfinite: pd.DataFrame = field(default_factory=_empty_nonfinite)

    def run_history(self, run: str) -> pd.DataFrame:
        """History of one run, indexed by step ``[steps, metrics]``."""
        h = self.history[self.history["run"] == run]
        return h.set_index("step").sort_index()

    @property
    def groups(self) -> list:
        return sorted({g for g in self.runs["group"].dropna().unique()})


def mixed_sweep_problems(sweep: "Sweep") -> list:
    """Why ``sweep`` is not one sweep: runs of more than one wandb group, or several runs with one run id
    (a folder copied twice). Empty when it is one sweep."""
    r = sweep.runs
    out = []
    groups = r["group"].dropna().value_counts()
    if len(groups) > 1:
        out.append("runs of more than one group: " + ", ".join(f"{g} ({n} runs)" for g, n in groups.items()))
    if "copy_of" in r:
        for orig, g in r[r["copy_of"].notna()].groupby("copy_of"):
            paths = [p for p in r.loc[r["run"] == orig, "path"].tolist() + g["path"].tolist() if p]
            out.append(f"run id {orig} appears {len(g) + 1} times" + (f" ({', '.join(map(str, paths))})"
                                                                     if paths else ""))
    return out


def int_step(value: Any, where: str) -> int:
    """A logged ``step`` as an int; raises :class:`UnusableInput` naming ``where`` for anything else."""
    if isinstance(value, bool) or value is None:
        raise UnusableInput(f"{where}: 'step' must be an integer, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise UnusableInput(f"{where}: 'step' must be an integer, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise UnusableInput(f"{where}: 'step' must be an integer, got {value!r}")
    return int(f)


def _canonical_config(flat: Mapping) -> dict:
    """Keep every key, and make sure each of :data:`CONFIG_COLUMNS` is present when some key ends with it
    (wandb configs may nest the harness config under a prefix, e.g. ``harness.loss.precision``)."""
    out = dict(flat)
    for col in CONFIG_COLUMNS + TRACKING_COLUMNS + ("dtypes_seen.student", "dtypes_seen.teacher", "group", "run_name"):
        if col in out:
            continue
        hits = [k for k in flat if k.endswith("." + col)]
        if hits:
            out[col] = flat[min(hits, key=len)]
    return out


def _dtype_name(x: Any) -> Optional[str]:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return str(x).replace("torch.", "")


def _is_mixed(student: Optional[str], teacher: Optional[str]) -> bool:
    """True when the two sides reach the loss in different dtypes and one of them is low precision."""
    if not student or not teacher:
        return False
    return student != teacher and (student in _LOW_PRECISION or teacher in _LOW_PRECISION)


def _is_low_precision(student: Optional[str], teacher: Optional[str]) -> bool:
    """True when either side reaches the loss in BF16/FP16 (mixed or not: BF16/BF16 included)."""
    return bool(student in _LOW_PRECISION or teacher in _LOW_PRECISION)


def _nonfinite_rows(name: str, rec: RunRecord) -> list:
    """``(run, step, metric, value)`` for every logged float that is NaN or ±Inf: scanned in a list-of-dicts
    history, taken from ``rec.nonfinite`` for a DataFrame history."""
    if isinstance(rec.history, pd.DataFrame) or not rec.history:
        return [(name, int(step), metric, float(v)) for step, metric, v in rec.nonfinite]
    out = []
    for row in rec.history:
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                out.append((name, row["step"], k, v))
    return out


#: Metrics where a larger value is worse (counts, error maxima): duplicate copies of a step keep the largest.
_WORST_IS_MAX = (NEG_LOSS_CALLS, NEG_LOSS_CALLS_TOTAL, NONFINITE_CALLS_TOTAL, NEG_TOKEN_FRAC, SPOT_LOSS_ABS_ERR,
                 SPOT_LOSS_REL_ERR, SPOT_GRAD_REL_L2, SPOT_SIGN_MISMATCH, SPOT_PARAM_GRAD_REL_L2)
#: Metrics where a smaller value is worse: duplicate copies keep the smallest.
_WORST_IS_MIN = (MIN_TOKEN_JSD,)


def _history_frame(rec: RunRecord) -> tuple:
    """-> (history ``[steps, metrics]`` one row per step, problems). Copies of one step are merged: the later
    non-null value wins, except for counts and error maxima (the worst copy wins, so a negative or a large
    error in any copy counts); each duplicated step is reported."""
    if isinstance(rec.history, pd.DataFrame):
        df = rec.history
    elif not rec.history:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")}), []
    else:
        df = pd.DataFrame.from_records(rec.history)
    problems = []
    dup = df["step"].duplicated(keep=False)
    if dup.any():
        counts = df.loc[dup, "step"].value_counts().sort_index()
        problems.append("duplicate logged steps (worst copy counted for counts and errors): "
                        + ", ".join(f"step {int(s)} x{int(n)}" for s, n in counts.head(20).items())
                        + (f" ... ({len(counts)} steps)" if len(counts) > 20 else ""))
        g = df.groupby("step", sort=True)
        merged = g.last()  # last non-null per column
        for col in _WORST_IS_MAX:
            if col in merged.columns:
                merged[col] = pd.to_numeric(df[col], errors="coerce").groupby(df["step"]).max()
        for col in _WORST_IS_MIN:
            if col in merged.columns:
                merged[col] = pd.to_numeric(df[col], errors="coerce").groupby(df["step"]).min()
        df = merged.reset_index()
    else:
        df = df.sort_values("step", kind="stable")
    return df, problems


def _int_or_none(x: Any) -> Optional[int]:
    try:
        if x is None or x == "" or (isinstance(x, float) and math.isnan(x)):
            return None
        return int(x)
    except (TypeError, ValueError):
        return None


def expected_steps(max_steps: Optional[int], logging_steps: Optional[int], last: Optional[int] = None) -> list:
    """The steps a run promises to log: every multiple of ``logging_steps`` (default 1) up to ``max_steps``
    (or up to ``last`` for a run that stopped early)."""
    end = max_steps if last is None else min(max_steps or last, last)
    if end is None or end < 1:
        return []
    every = logging_steps if logging_steps and logging_steps > 0 else 1
    return list(range(every, end + 1, every))


def _ranges(steps: list) -> str:
    """[3, 4, 5, 8] -> "3-5, 8"."""
    out, steps = [], sorted(steps)
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(f"{steps[i]}" if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out[:20]) + (f" ... ({len(steps)} steps)" if len(out) > 20 else "")


def step_gaps(logged: Iterable[int], cfg: Mapping, status: str, last_step: Optional[int]) -> list:
    """Steps promised by ``run.max_steps`` and ``run.logging_steps`` that ``logged`` lacks (a completed run:
    all of them; a failed or running one: those up to its last logged step)."""
    max_steps = _int_or_none(cfg.get("run.max_steps"))
    every = _int_or_none(cfg.get("run.logging_steps"))
    logged = set(int(s) for s in logged)
    if status == "completed":
        want = expected_steps(max_steps, every)
    else:
        want = expected_steps(max_steps, every, last=max(logged) if logged else None)
    return [s for s in want if s not in logged]


def _outcome(rec: RunRecord, cfg: Mapping, last_step: Optional[int], n_logged: int) -> tuple:
    """-> (outcome, extra problems) from the reported status, the steps logged and ``run.max_steps``."""
    problems = []
    max_steps = cfg.get("run.max_steps")
    if rec.status == "missing":
        return "missing", problems
    if rec.status == "failed":
        return "failed", problems
    if rec.status == "interrupted":  # a stop signal (preemption, time-out, Ctrl-C): never a completed run
        problems.append(f"interrupted ({rec.error or 'stop signal'}) at step {last_step}")
        return "failed", problems
    if rec.status == "running":
        problems.append("status is still 'running' (died without closing, or not finished)")
        return "incomplete", problems
    outcome = "completed"
    try:
        short = max_steps not in (None, "") and last_step is not None and int(last_step) < int(max_steps)
    except (TypeError, ValueError):
        short = False
        problems.append(f"run.max_steps={max_steps!r} is not an integer")
    if short:
        outcome = "incomplete"
        problems.append(f"completed at step {last_step} < run.max_steps={max_steps}")
    if n_logged == 0:
        outcome = "incomplete"
        problems.append("no metrics logged")
    return outcome, problems


def tabulate(records: Iterable[RunRecord], source: str) -> Sweep:
    """RunRecords -> :class:`Sweep` (runs, history and non-finite tables). Run names are made unique."""
    rows, frames, bad, seen = [], [], [], {}
    for rec in records:
        name, copy_of = rec.name, None
        if name in seen:
            seen[name] += 1
            name, copy_of = f"{name}#{seen[rec.name]}", rec.name
        else:
            seen[name] = 0
        cfg = _canonical_config(rec.config)
        bad += _nonfinite_rows(name, rec)
        h, dup_problems = _history_frame(rec)
        h.insert(0, "run", name)
        frames.append(h)
        n_logged = int(len(h))
        last_logged = int(h["step"].max()) if n_logged else None
        last_step = rec.last_step if rec.last_step is not None else last_logged
        student = _dtype_name(rec.dtypes_seen.get("student", cfg.get("dtypes_seen.student")))
        teacher = _dtype_name(rec.dtypes_seen.get("teacher", cfg.get("dtypes_seen.teacher")))
        outcome, more = _outcome(rec, cfg, last_step, n_logged)
        gaps = step_gaps(h["step"], cfg, rec.status, last_step) if rec.status != "missing" and n_logged else []
        if gaps:
            more.append(f"steps {_ranges(gaps)} not logged (run.max_steps={cfg.get('run.max_steps')}, logging "
                        f"every {cfg.get('run.logging_steps') or 1} step(s); {n_logged} steps logged)")
            if outcome == "completed":
                outcome = "incomplete"
        more += dup_problems
        row = {
            "run": name,
            "group": rec.group if rec.group is not None else cfg.get("group"),
            "status": rec.status,
            "outcome": outcome,
            "error": rec.error,
            "problems": "; ".join(list(rec.problems) + more),
            "last_step": last_step,
            "n_logged": n_logged,
            "dtype.student": student,
            "dtype.teacher": teacher,
            "mixed_dtypes": _is_mixed(student, teacher),
            "low_precision": _is_low_precision(student, teacher),
            "path": rec.path,
            "wall_s": rec.wall_s,
            "copy_of": copy_of,
        }
        for col in CONFIG_COLUMNS + TRACKING_COLUMNS:
            row[col] = cfg.get(col)
        for k, v in (rec.versions or {}).items():
            row[f"version.{k}"] = v
        rows.append(row)
    if not rows:
        raise UnusableInput(f"{source}: no runs found")
    runs = pd.DataFrame(rows)
    for col in ("gkd.beta", "gkd.temperature", "gkd.sft_alpha", "gkd.lmbda"):
        runs[col] = pd.to_numeric(runs[col], errors="coerce")
    runs["variant"] = runs["loss.precision"].map(
        {"native": "original", "fp32": "patched", "fp64": "reference", "candidate": "patched"}).fillna("unknown")
    history = pd.concat(frames, ignore_index=True, sort=False)
    history["step"] = history["step"].astype("int64")
    nonfinite = pd.DataFrame(bad, columns=_NONFINITE_COLUMNS) if bad else _empty_nonfinite()
    if bad:
        nonfinite["step"] = nonfinite["step"].astype("int64")
        nonfinite["value"] = nonfinite["value"].astype("float64")
    return Sweep(source=source, runs=runs, history=history, nonfinite=nonfinite)
