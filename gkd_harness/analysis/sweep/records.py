"""The tables every loader produces, and the one function that builds them.

Lowest layer of the loaders (:mod:`gkd_harness.analysis.sweep.runs`, :mod:`gkd_harness.analysis.sweep.wandb_api`, :mod:`gkd_harness.analysis.sweep.offline`
all import from here; this module imports none of them).

:class:`Sweep`:

* ``runs``: one row per run, keyed by ``run``; config columns with their dotted names (``loss.precision``,
  ``loss.beta_form``, ``gkd.beta``, ``gkd.temperature``, ``gkd.topk``, ``run.seed``, ``backend.name``, ...),
  the dtypes seen at the loss boundary (``dtype.student``, ``dtype.teacher``), ``status`` as the run reported
  it, and ``outcome`` in {completed, failed, incomplete, missing, tampered}. Failed or incomplete runs are kept
  and marked; a completed run whose log lacks a step that ``run.max_steps`` and ``run.logging_steps`` promise is
  incomplete (the problems name the steps); ``missing`` is a point the sweep planned that has no run folder;
  ``tampered``: a metrics record breaks the record types (:mod:`gkd_harness.analysis.sweep.metrics`; the problems name the
  lines, which are left out). Counted apart: ``n_planned`` (steps ``run.max_steps``/``run.logging_steps``
  promise), ``n_logged`` (training steps logged), ``n_evals`` (held-out evaluation records).
  ``low_precision``: a BF16/FP16 side reaches the loss (``mixed_dtypes``: the two sides differ as well).
* ``history``: one row per (run, step) with one column per metric name (``train/loss``, ``spot/grad_rel_l2``,
  ...). Several lines logged for the same step are merged (later non-null values win, except counts and error
  maxima, where the worst copy wins) and reported in the run's problems. NaN and ±Inf stay as
  they were logged; a metric a step did not log is also NaN there. An evaluation record sits on the row of its
  step (its ``eval/*`` columns) without being a second copy of a training step.
* ``evals``: one row per held-out evaluation record (``run, step`` and its metrics), apart from training steps.
* ``nonfinite``: one row per logged value that was NaN or ±Inf (columns ``run, step, metric, value``), so a
  logged NaN can be told apart from a metric that was not logged at that step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional

import numpy as np
import pandas as pd

from gkd_harness.analysis.sweep.metrics import MetricsTable, table_from_frame, table_from_rows
from gkd_harness.harness.contract import (
    DATA_KEYS,
    METRICS_FILE,
    MIN_TOKEN_JSD,
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    NEG_TOKEN_FRAC,
    NONFINITE_CALLS_TOTAL,
    ROLE_BY_PRECISION,
    SPOT_GRAD_REL_L2,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_REL_ERR,
    SPOT_PARAM_GRAD_REL_L2,
    SPOT_SIGN_MISMATCH,
)

__all__ = [
    "UnusableInput",
    "RunRecord",
    "Sweep",
    "CONFIG_COLUMNS",
    "TRACKING_COLUMNS",
    "TRAINING_KEYS",
    "int_step",
    "RecordConflict",
    "step_conflicts",
    "tabulate",
    "expected_steps",
    "mixed_sweep_problems",
    "step_gaps",
    "RecordConflict",
    "step_conflicts",
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
#: Config keys that change what a run learns besides the loss variant and its gkd.* settings: the data, the
#: optimiser, the steps and the held-out evaluation. Runs of one plan agree on each unless the plan sweeps it
#: (:func:`gkd_harness.analysis.sweep.plan.plan_problems`); they are part of a variant's identity.
TRAINING_KEYS = (
    "run.dataset",
    "run.learning_rate",
    "run.per_device_batch_size",
    "run.grad_accum",
    "run.max_length",
    "run.max_steps",
    "run.logging_steps",
    "model.student",
    "model.teacher",
    "monitor.eval.dataset",
    "monitor.eval.every_n_steps",
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

    config: flat dotted keys. history: a :class:`~gkd_harness.analysis.sweep.metrics.MetricsTable` (run folders), a list of
    metric dicts (each with an int ``step``), or a DataFrame with a ``step`` column; for a DataFrame (where a NaN
    and a missing value look alike) ``nonfinite`` lists the logged NaN/±Inf values as ``(step, metric, value)``.
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
    #: the sweep point the run carries (a wandb run: its folder relative to the sweep folder), else None
    point: Optional[str] = None
    #: the copy of the sweep's manifest the run carries (a wandb run), else None
    manifest: Any = None
    #: sha256 of the data files the run read, by config key (summary.json ``data_sha256``)
    data_sha256: dict = field(default_factory=dict)
    #: the experiment preset the run was launched with (summary.json ``experiment``)
    experiment: Optional[str] = None
    #: config keys of the run's identity its records give differently (:class:`RecordConflict`, ``step`` None)
    conflicts: list = field(default_factory=list)


def _empty_nonfinite() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run": pd.Series([], dtype=object),
            "step": pd.Series([], dtype="int64"),
            "metric": pd.Series([], dtype=object),
            "value": pd.Series([], dtype="float64"),
        }
    )


@dataclass
class Sweep:
    """A loaded sweep. ``runs``: one row per run. ``history``: one row per (run, step).
    ``nonfinite``: every logged NaN/±Inf value, ``[run, step, metric, value]``. ``evals``: one row per held-out
    evaluation record, ``[run, step, metrics]``."""

    source: str
    runs: pd.DataFrame
    history: pd.DataFrame
    nonfinite: pd.DataFrame = field(default_factory=_empty_nonfinite)
    evals: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame({"run": pd.Series([], dtype=object), "step": pd.Series([], dtype="int64")})
    )
    #: the sweep's plan (:class:`gkd_harness.analysis.sweep.plan.Plan`), None when the source has none
    plan: Any = None
    #: records of one fact with different values (:class:`RecordConflict`): a run and step whose records disagree
    conflicts: tuple = ()
    #: what the evidence lacks, one line each (e.g. "no plan: completeness not checked"); criteria and the
    #: banner say it
    lacks: tuple = ()

    def run_history(self, run: str) -> pd.DataFrame:
        """History of one run, indexed by step ``[steps, metrics]``."""
        h = self.history[self.history["run"] == run]
        return h.set_index("step").sort_index()

    @property
    def groups(self) -> list:
        return sorted({g for g in self.runs["group"].dropna().unique()})


def mixed_sweep_problems(sweep: "Sweep") -> list:
    """Why ``sweep`` is not one sweep: runs of more than one wandb group, or several runs with one run id (a folder
    copied twice). Empty when it is one sweep. (Runs outside the plan: :func:`gkd_harness.analysis.sweep.plan.
    plan_problems`.)"""
    r = sweep.runs
    out: list = []
    groups = r["group"].dropna().value_counts()
    if len(groups) > 1:
        out.append("runs of more than one group: " + ", ".join(f"{g} ({n} runs)" for g, n in groups.items()))
    if "copy_of" in r:
        for orig, g in r[r["copy_of"].notna()].groupby("copy_of"):
            paths = [p for p in r.loc[r["run"] == orig, "path"].tolist() + g["path"].tolist() if p]
            out.append(
                f"run id {orig} appears {len(g) + 1} times" + (f" ({', '.join(map(str, paths))})" if paths else "")
            )
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


def _metrics_table(rec: RunRecord) -> MetricsTable:
    """The run's records as a :class:`~gkd_harness.analysis.sweep.metrics.MetricsTable`, whatever the loader gave."""
    if isinstance(rec.history, MetricsTable):
        return rec.history
    if isinstance(rec.history, pd.DataFrame):
        return table_from_frame(rec.history, rec.nonfinite)
    return table_from_rows(rec.history or [])


#: Metrics where a larger value is worse (counts, error maxima): duplicate copies of a step keep the largest.
_WORST_IS_MAX = (
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    NONFINITE_CALLS_TOTAL,
    NEG_TOKEN_FRAC,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_REL_ERR,
    SPOT_GRAD_REL_L2,
    SPOT_SIGN_MISMATCH,
    SPOT_PARAM_GRAD_REL_L2,
)
#: Metrics where a smaller value is worse: duplicate copies keep the smallest.
_WORST_IS_MIN = (MIN_TOKEN_JSD,)


def _duplicates(steps, what: str) -> list:
    """``[problem]`` naming the steps ``steps`` holds more than once (empty when none)."""
    steps = np.asarray(steps)
    if len(steps) < 2 or bool((np.diff(steps) > 0).all()):  # the usual case: ascending, so no copies
        return []
    s = pd.Series(steps)
    counts = s[s.duplicated(keep=False)].value_counts().sort_index()
    if not len(counts):
        return []
    return [
        f"{what}: "
        + ", ".join(f"step {int(x)} x{int(n)}" for x, n in counts.head(20).items())
        + (f" ... ({len(counts)} steps)" if len(counts) > 20 else "")
    ]


@dataclass(frozen=True)
class RecordConflict:
    """Two records of one fact with different values: a training step (or an evaluation) logged twice
    (``step`` set, ``key`` the metric), or a config key of a run's identity that ``summary.json`` and
    ``config.yaml`` give differently (``step`` None). Evidence of a problem, never resolved by order: the run is
    ``tampered`` and every criterion that reads it is not measured (:mod:`gkd_harness.analysis.signoff.criteria`).
    ``values``: the distinct values, sorted by their text (the same whatever the order they were recorded in)."""

    run: str
    key: str
    values: tuple
    step: Optional[int] = None
    evaluation: bool = False

    def line(self) -> str:
        shown = " vs ".join(repr(v) if isinstance(v, str) else f"{v!r}" for v in self.values)
        if self.step is None:
            return f"{self.run}: {self.key} is {shown} (summary.json vs config.yaml)"
        what = "evaluation" if self.evaluation else "step"
        return f"{self.run} {what} {self.step}: {self.key} recorded twice with different values ({shown})"


def step_conflicts(run: str, t: MetricsTable) -> list:
    """The :class:`RecordConflict` of one run's records: each (step, metric) logged more than once with different
    values, training records and evaluation records apart (identical copies are no conflict: they collapse)."""
    steps = np.asarray(t.steps)
    if len(steps) < 2 or bool((np.diff(steps) > 0).all()):
        return []
    out = []
    for evaluation in (False, True):
        rows = np.asarray(t.evaluation) == evaluation
        if rows.sum() < 2:
            continue
        for key, col in t.columns.items():
            df = pd.DataFrame({"step": steps[rows], "v": col[rows]}).dropna()
            if not len(df):
                continue
            n = df.groupby("step")["v"].nunique()
            for step in n.index[n > 1]:
                values = tuple(sorted(set(df.loc[df["step"] == step, "v"].tolist()), key=repr))
                out.append(RecordConflict(run, key, values, int(step), evaluation))
    return sorted(out, key=lambda c: (c.step or 0, c.key))


def _history_frame(name: str, t: MetricsTable) -> tuple:
    """-> (history ``[steps, metrics]`` one row per step, problems, conflicts). Training records and evaluation
    records are counted apart: an evaluation at a training step joins that step's row. Copies of one step that log
    the same values collapse into one (a note names the steps); copies that log a metric with different values are
    a :class:`RecordConflict`, whatever their order: that metric is unknown (NaN) at that step, except counts and
    error maxima, where the worst copy stands (a negative or a large error in any copy counts, in either order)."""
    df = t.frame()
    if len(df) < 2 or bool((np.diff(t.steps) > 0).all()):  # the usual case: ascending, so no copies
        return df, [], []
    if not df["step"].duplicated().any():
        return df.sort_values("step", kind="stable", ignore_index=True), [], []
    conflicts = step_conflicts(name, t)
    merged = df.groupby("step", sort=True).first()  # the one value of each metric where the copies agree
    for col in _WORST_IS_MAX:
        if col in merged.columns:
            merged[col] = pd.to_numeric(df[col], errors="coerce").groupby(df["step"]).max()
    for col in _WORST_IS_MIN:
        if col in merged.columns:
            merged[col] = pd.to_numeric(df[col], errors="coerce").groupby(df["step"]).min()
    worst = set(_WORST_IS_MAX) | set(_WORST_IS_MIN)
    for c in conflicts:
        if c.key not in worst:
            merged.loc[c.step, c.key] = np.nan
    problems = []
    copies = _duplicates(t.steps[~t.evaluation], "duplicate logged steps") + _duplicates(
        t.steps[t.evaluation], "duplicate evaluation records"
    )
    if conflicts:
        problems.append(
            f"conflicting records ({len(conflicts)}, no copy wins): "
            + "; ".join(c.line() for c in conflicts[:5])
            + (" ..." if len(conflicts) > 5 else "")
        )
        problems += copies
    elif copies:
        problems += [p + " (identical copies, collapsed)" for p in copies]
    return merged.reset_index(), problems, conflicts


def _evals_frame(name: str, t: MetricsTable) -> pd.DataFrame:
    """The run's evaluation records ``[run, step, metrics]`` (only the metrics they log)."""
    rows = t.evaluation
    cols = {k: v[rows] for k, v in t.columns.items() if rows.any() and pd.notna(v[rows]).any()}
    return pd.DataFrame({"run": name, "step": t.steps[rows], **cols})


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
    have = np.unique(
        np.fromiter((int(s) for s in logged), dtype=np.int64)
        if not isinstance(logged, np.ndarray)
        else logged.astype(np.int64)
    )
    if status == "completed":
        want = expected_steps(max_steps, every)
    else:
        want = expected_steps(max_steps, every, last=int(have[-1]) if len(have) else None)
    want_arr = np.asarray(want, dtype=np.int64)
    return [int(s) for s in want_arr[~np.isin(want_arr, have, assume_unique=True)]]


def _outcome(rec: RunRecord, cfg: Mapping, last_step: Optional[int], n_logged: int, tampered: bool = False) -> tuple:
    """-> (outcome, extra problems) from the reported status, the steps logged and ``run.max_steps``."""
    problems: List[str] = []
    max_steps = cfg.get("run.max_steps")
    if rec.status == "missing":
        return "missing", problems
    if tampered:  # a record breaks the record types: the log cannot be trusted, whatever the run reported
        return "tampered", problems
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


def _stack_history(frames: list) -> pd.DataFrame:
    """The runs' history frames ``[(run, frame [steps, 1 + metrics])]`` as one table ``[rows, run + step +
    metrics]``, built column by column into one preallocated float64 block: each run's column is released as soon
    as it is copied, so the peak is the table plus one column, never every run's frames beside their
    concatenation (``pd.concat``: twice the table). ``run`` is categorical (400k copies of 200 names: every
    run-keyed step works on codes; group by it with observed=True)."""
    names = [n for n, _ in frames]
    cols: Dict[str, List[Any]] = {c: [] for _, f in frames for c in f.columns if c != "step"}
    lengths = np.array([len(f) for _, f in frames], dtype=np.int64)
    total = int(lengths.sum())
    parts = [{c: f[c].to_numpy() for c in f.columns} for _, f in frames]
    frames.clear()  # the frames' columns now live in ``parts`` alone, released one by one below
    numeric = [c for c in cols if all(c not in p or p[c].dtype.kind in "fiub" for p in parts)]
    block = np.empty((len(numeric), total), dtype=np.float64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for j, c in enumerate(numeric):
        for i, p in enumerate(parts):
            v = p.pop(c, None)
            block[j, starts[i] : starts[i + 1]] = np.nan if v is None else v
    history = pd.DataFrame(block.T, columns=numeric, copy=False)
    for c in cols:
        if c not in numeric:  # another source's non-numeric key: an object column of its own
            history[c] = np.concatenate(
                [p.pop(c) if c in p else np.full(n, None, dtype=object) for p, n in zip(parts, lengths)]
            )
    steps = np.concatenate([p.pop("step").astype(np.int64) for p in parts]) if parts else np.empty(0, np.int64)
    order = sorted(range(len(names)), key=lambda i: names[i])
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    run = pd.Categorical.from_codes(np.repeat(rank, lengths), categories=[names[i] for i in order])
    history.insert(0, "step", steps)
    history.insert(0, "run", run)
    _return_freed_heap()
    return history


def _return_freed_heap() -> None:
    """Hand the heap pages the runs' records and frames freed back to the system (glibc ``malloc_trim``): their
    columns are small blocks (a 2,000-step column is 16 KiB, under malloc's mmap threshold), so without it the
    process keeps their pages (measured: 340 MiB of a 1,000 x 2,000 sweep) and every later allocation of the
    sign-off comes on top. A no-op where the C library has no ``malloc_trim`` (musl, macOS)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return
    if trim is not None:
        trim(0)


def tabulate(records: Iterable[RunRecord], source: str) -> Sweep:
    """RunRecords -> :class:`Sweep` (runs, history and non-finite tables). Run names are made unique."""
    rows: List[dict] = []
    frames: List[Any] = []
    evals: List[Any] = []
    bad: List[Any] = []
    conflicts: List[RecordConflict] = []
    seen: Dict[str, int] = {}
    for rec in records:
        name, copy_of = rec.name, None
        if name in seen:
            seen[name] += 1
            name, copy_of = f"{name}#{seen[rec.name]}", rec.name
        else:
            seen[name] = 0
        cfg = _canonical_config(rec.config)
        t = _metrics_table(rec)
        bad += [(name, int(step), metric, float(v)) for step, metric, v in t.nonfinite]
        h, dup_problems, step_conflicts = _history_frame(name, t)
        conflicts += [RecordConflict(name, c.key, c.values) for c in rec.conflicts] + step_conflicts
        frames.append((name, h))
        if t.evaluation.any():
            evals.append(_evals_frame(name, t))
        trained = np.unique(t.steps[~t.evaluation])
        n_logged = int(len(trained))
        last_logged = int(trained[-1]) if n_logged else (int(h["step"].max()) if len(h) else None)
        last_step = rec.last_step if rec.last_step is not None else last_logged
        student = _dtype_name(rec.dtypes_seen.get("student", cfg.get("dtypes_seen.student")))
        teacher = _dtype_name(rec.dtypes_seen.get("teacher", cfg.get("dtypes_seen.teacher")))
        outcome, more = _outcome(
            rec, cfg, last_step, n_logged, tampered=bool(t.tampered or step_conflicts or rec.conflicts)
        )
        more += [f"records disagree: {c.line()}" for c in rec.conflicts]
        if t.tampered:
            more.append(
                f"tampered records in {METRICS_FILE} (left out): "
                + "; ".join(t.tampered[:5])
                + (f" ... ({len(t.tampered)} records)" if len(t.tampered) > 5 else "")
            )
        gaps = step_gaps(trained, cfg, rec.status, last_step) if rec.status != "missing" and n_logged else []
        if gaps:
            more.append(
                f"steps {_ranges(gaps)} not logged (run.max_steps={cfg.get('run.max_steps')}, logging "
                f"every {cfg.get('run.logging_steps') or 1} step(s); {n_logged} steps logged)"
            )
            if outcome == "completed":
                outcome = "incomplete"
        more += list(t.problems) + dup_problems
        row = {
            "run": name,
            "group": rec.group if rec.group is not None else cfg.get("group"),
            "status": rec.status,
            "outcome": outcome,
            "error": rec.error,
            "problems": "; ".join(list(rec.problems) + more),
            "last_step": last_step,
            "n_planned": len(
                expected_steps(_int_or_none(cfg.get("run.max_steps")), _int_or_none(cfg.get("run.logging_steps")))
            ),
            "n_logged": n_logged,
            "n_evals": int(t.evaluation.sum()),
            "dtype.student": student,
            "dtype.teacher": teacher,
            "mixed_dtypes": _is_mixed(student, teacher),
            "low_precision": _is_low_precision(student, teacher),
            "path": rec.path,
            "wall_s": rec.wall_s,
            "copy_of": copy_of,
            "sweep_point": rec.point,
            "experiment": rec.experiment,
        }
        for key in DATA_KEYS:
            row[f"sha256.{key}"] = (rec.data_sha256 or {}).get(key)
        for col in CONFIG_COLUMNS + TRACKING_COLUMNS + TRAINING_KEYS:
            row[col] = cfg.get(col)
        for k, v in (rec.versions or {}).items():
            row[f"version.{k}"] = v
        rows.append(row)
        del rec, t, h  # the run's columns now live in ``frames`` alone (released one by one by _stack_history)
    if not rows:
        raise UnusableInput(f"{source}: no runs found")
    runs = pd.DataFrame(rows)
    for col in ("gkd.beta", "gkd.temperature", "gkd.sft_alpha", "gkd.lmbda"):
        runs[col] = pd.to_numeric(runs[col], errors="coerce")
    runs["variant"] = runs["loss.precision"].map(ROLE_BY_PRECISION).fillna("unknown")
    history = _stack_history(frames)
    nonfinite = pd.DataFrame(bad, columns=_NONFINITE_COLUMNS) if bad else _empty_nonfinite()
    if bad:
        nonfinite["step"] = nonfinite["step"].astype("int64")
        nonfinite["value"] = nonfinite["value"].astype("float64")
    out = Sweep(source=source, runs=runs, history=history, nonfinite=nonfinite, conflicts=tuple(conflicts))
    if evals:
        out.evals = pd.concat(evals, ignore_index=True, sort=False)
    return out
