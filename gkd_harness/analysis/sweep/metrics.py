"""Metric records into columnar arrays: ``metrics.jsonl`` in one pass, and the same table from other sources.

The lowest module of the loaders: it imports no other ``analysis`` module (``records`` and ``runs`` build on it).

:func:`read_metrics_file` reads a run folder's ``metrics.jsonl`` line by line, streaming (the file is never held
whole), with no Python object kept per step: each line is decoded by msgspec against the record type (a JSON
object of numbers) and its values are appended, in C, to one flat ``array('d')`` per *key set* (a run logs a handful
of distinct key sets: training steps, training steps with a spot check, evaluation records). At the end every key
set is scattered into one float64 column per metric (NaN where a record did not log the metric). A line the typed
decoder refuses (Python's ``NaN``/``Infinity`` tokens, a string, a bool, a torn or blank line) takes the slow path,
``json.loads`` and the checks below; a healthy file never takes it.

Records are typed (the contract of :mod:`gkd_harness.harness.store.metrics_io`):

* ``step`` is an integer: a string (``"2"``), a float (``2.0``, ``1.5``), a bool or null is a **tampered record**;
* every metric name of the contract (:data:`KNOWN_METRICS`) holds a number (int or float, NaN/±Inf included; null
  counts as not logged): a string, a bool, a list or an object there is a tampered record.

A tampered record is left out of the table and listed in :attr:`MetricsTable.tampered` (``line N: why``): the
sign-off reports the run as ``tampered`` (:mod:`gkd_harness.analysis.sweep.records`). A line that is not JSON at all, or not an
object, or has no ``step``, makes the file unusable (:attr:`MetricsTable.unusable`), except a torn last line of a
run that did not report completion (what a killed writer leaves), which is skipped with a problem. A key outside
the contract with a value that is not a number is dropped (named once in the problems).

Evaluation records are kept apart from training records: a record whose metrics are all held-out evaluation
metrics (:data:`gkd_harness.harness.contract.EVAL_METRICS`, as ``gkd_harness.harness.rank.callbacks`` writes them; ``eval_*`` for logs
that keep transformers' own evaluation prefix, ``eval/*`` as wandb writes them) is an evaluation record
(:attr:`MetricsTable.evaluation`), so an evaluation at a training step is not a second copy of that step.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import msgspec
import numpy as np

from gkd_harness.harness.config.user_files import MAX_LINE, bounded_lines
from gkd_harness.harness.contract import ALL_METRICS, ROLLOUT_METRICS, TRAIN_GLOBAL_STEP
from gkd_harness.harness.store.records import is_evaluation_row

__all__ = [
    "MetricsTable",
    "KNOWN_METRICS",
    "read_metrics_file",
    "table_from_rows",
    "table_from_frame",
    "is_evaluation_record",
]

#: The metric names of the contract: each holds a number in every record that logs it.
KNOWN_METRICS = frozenset(ALL_METRICS + ROLLOUT_METRICS + (TRAIN_GLOBAL_STEP,))
_STEP = "step"
#: The record type: a JSON object of numbers (msgspec refuses bools, strings, null and nested values for it).
_DECODE = msgspec.json.Decoder(Dict[str, Union[int, float]]).decode
_DecodeError = msgspec.DecodeError
#: An evaluation record: the evaluation rows of the store's record (:func:`gkd_harness.harness.store.records.
#: is_evaluation_row`), their one definition.
is_evaluation_record = is_evaluation_row


@dataclass
class MetricsTable:
    """The records of one run, in file order, as columns.

    steps: int64 ``[n]``; evaluation: bool ``[n]`` (True for an evaluation record); columns: one array ``[n]`` per
    metric (float64, NaN where the record did not log it; object only for a non-numeric key of another source);
    nonfinite: ``(step, metric, value)`` for every logged NaN/±Inf; problems: notes for the run's problems;
    tampered: ``line N: why`` per record that breaks the record types; unusable: why the file cannot be read
    (None when it can)."""

    steps: np.ndarray
    evaluation: np.ndarray
    columns: Dict[str, np.ndarray]
    nonfinite: List[Tuple[int, str, float]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    tampered: List[str] = field(default_factory=list)
    unusable: Optional[str] = None

    def __len__(self) -> int:
        return int(len(self.steps))

    def frame(self):
        """``[n, 1 + metrics]`` DataFrame: ``step`` then the metric columns (no copy of the columns)."""
        import pandas as pd

        data = {_STEP: self.steps, **self.columns}
        return pd.DataFrame(data, copy=False)


class _KeySet:
    """The records that log one key set: their row numbers and their values, flat in file order."""

    __slots__ = ("keys", "rows", "values", "evaluation")

    def __init__(self, keys: tuple):
        self.keys = keys
        self.rows = array("q")
        self.values = array("d")
        self.evaluation = is_evaluation_record(keys)


def _why_untyped(obj: Mapping) -> Optional[str]:
    """Why a decoded record breaks the record types (None when it does not)."""
    step = obj.get(_STEP)
    if type(step) is not int:
        return f"'step' must be an integer, got {step!r} ({type(step).__name__})"
    for k, v in obj.items():
        if k in KNOWN_METRICS and v is not None and type(v) not in (int, float):
            return f"{k!r} must be a number, got {v!r} ({type(v).__name__})"
    return None


def _numbers(obj: Mapping, dropped: Dict[str, str]) -> Dict[str, Any]:
    """The record's numeric entries (``step`` first as it came); non-numeric values of keys outside the contract
    are dropped and named once in ``dropped``; null is not logged."""
    out: Dict[str, Any] = {}
    for k, v in obj.items():
        if type(v) in (int, float):
            out[k] = v
        elif v is not None and k not in dropped:
            dropped[k] = type(v).__name__
    return out


#: The largest ``metrics.jsonl`` the reader accepts (bytes; ``GKD_ANALYZE_MAX_METRICS_BYTES`` overrides it). A run
#: of 200,000 logged steps with every harness metric is about 150 MB; 4 GiB is far beyond any real run and keeps a
#: wrong file (a disk image, ``/dev/zero``) from filling memory.
MAX_METRICS_BYTES = 4 * 1024**3


def metrics_file_problem(path: os.PathLike) -> Optional[str]:
    """One line when ``path`` cannot be a metrics stream: not a regular file (a FIFO would block the reader, a
    device such as ``/dev/zero`` never ends), or larger than :data:`MAX_METRICS_BYTES`; None when it can."""
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        return f"{os.fspath(path)}: cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(st.st_mode):
        return f"{os.fspath(path)}: not a regular file (a metrics stream is a file gkd-train writes)"
    limit = int(os.environ.get("GKD_ANALYZE_MAX_METRICS_BYTES") or MAX_METRICS_BYTES)
    if st.st_size > limit:
        return (
            f"{os.fspath(path)}: {st.st_size:,} bytes, over the reader's limit of {limit:,} "
            "(GKD_ANALYZE_MAX_METRICS_BYTES raises it)"
        )
    return None


def read_metrics_file(path: os.PathLike, completed: bool) -> MetricsTable:
    """Read one ``metrics.jsonl`` (``completed``: the run reported completion, so a torn last line is damage).

    Returns the table; :attr:`MetricsTable.unusable` names the first line that makes the file unreadable."""
    name = os.fspath(path)
    sets: Dict[tuple, _KeySet] = {}
    steps = array("q")
    tampered: List[str] = []
    problems: List[str] = []
    dropped: Dict[str, str] = {}
    decode, DecodeError = _DECODE, _DecodeError
    n = 0
    lineno = 0
    bad = metrics_file_problem(path)
    if bad is not None:
        return _unusable(bad)
    with open(path, "rb") as f:
        for lineno, line in bounded_lines(f, MAX_LINE):  # a line past the bound is never read whole (issue 48, 6)
            if line is None:
                return _unusable(f"{name}:{lineno}: a line of more than {MAX_LINE:,} bytes (not read)")
            raw = line
            try:
                obj = decode(raw)
                step = obj.get(_STEP)
                if type(step) is not int:
                    raise _Untyped
            except (DecodeError, _Untyped):
                try:
                    obj = json.loads(raw)  # Python's NaN/Infinity tokens, strings, bools
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    if not raw.strip():
                        continue
                    if not raw.endswith(b"\n") and not completed:
                        problems.append(f"truncated last line in {os.path.basename(name)} ignored")
                        continue
                    return _unusable(f"{name}:{lineno}: not valid JSON ({e})")
                if not isinstance(obj, dict):
                    return _unusable(f"{name}:{lineno}: expected a JSON object per line, got {type(obj).__name__}")
                if _STEP not in obj:
                    return _unusable(f"{name}:{lineno}: metrics line has no 'step'")
                why = _why_untyped(obj)
                if why is not None:
                    tampered.append(f"line {lineno}: {why}")
                    continue
                obj = _numbers(obj, dropped)
                step = obj[_STEP]
            keys = tuple(obj)
            ks = sets.get(keys)
            if ks is None:
                ks = sets[keys] = _KeySet(keys)
            ks.rows.append(n)
            ks.values.extend(obj.values())
            steps.append(int(step))  # an int on both paths (checked above); int() for the type checker
            n += 1
    if dropped:
        problems.append(
            "non-numeric values of keys outside the contract ignored: "
            + ", ".join(f"{k} ({t})" for k, t in sorted(dropped.items()))
        )
    table = _assemble(n, steps, sets)
    table.problems, table.tampered = problems, tampered
    return table


class _Untyped(Exception):
    """A record the typed decoder accepted whose ``step`` is not an integer (a float, or missing)."""


def _unusable(why: str) -> MetricsTable:
    empty = np.zeros(0, dtype=np.int64)
    return MetricsTable(empty, np.zeros(0, dtype=bool), {}, unusable=why)


def _assemble(n: int, steps: array, sets: Dict[tuple, _KeySet]) -> MetricsTable:
    """Scatter every key set's flat values into one column per metric; list the logged NaN/±Inf."""
    step_arr = np.frombuffer(steps, dtype=np.int64).copy() if n else np.zeros(0, dtype=np.int64)
    evaluation = np.zeros(n, dtype=bool)
    columns: Dict[str, np.ndarray] = {}
    nonfinite = []
    for keys in list(sets):
        ks = sets.pop(keys)
        rows = np.frombuffer(ks.rows, dtype=np.int64)
        values = np.frombuffer(ks.values, dtype=np.float64).reshape(len(rows), len(keys))
        if ks.evaluation:
            evaluation[rows] = True
        for j, k in enumerate(keys):
            if k == _STEP:
                continue
            col = columns.get(k)
            if col is None:
                col = columns[k] = np.full(n, np.nan)
            v = values[:, j]
            col[rows] = v
            bad = ~np.isfinite(v)
            if bad.any():
                nonfinite += [(int(step_arr[r]), k, float(x)) for r, x in zip(rows[bad], v[bad])]
        del rows, values, ks
    nonfinite.sort(key=lambda t: t[0])
    return MetricsTable(step_arr, evaluation, columns, nonfinite=nonfinite)


def table_from_rows(rows: Iterable[Mapping[str, Any]]) -> MetricsTable:
    """The table of records already decoded (wandb histories: each row with an int ``step``). Numeric columns are
    float64; a column that holds anything else keeps its values as objects."""
    rows = list(rows)
    n = len(rows)
    steps = np.fromiter((int(r[_STEP]) for r in rows), dtype=np.int64, count=n)
    evaluation = np.fromiter((is_evaluation_record(r) for r in rows), dtype=bool, count=n)
    columns: Dict[str, np.ndarray] = {}
    nonfinite = []
    for i, r in enumerate(rows):
        for k, v in r.items():
            if k == _STEP:
                continue
            col = columns.get(k)
            if col is None:
                col = columns[k] = np.full(n, np.nan)
            if col.dtype != object and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
                col = columns[k] = col.astype(object)
            col[i] = v
            if isinstance(v, float) and not math.isfinite(v):
                nonfinite.append((int(steps[i]), k, v))
    return MetricsTable(steps, evaluation, columns, nonfinite=nonfinite)


def table_from_frame(df, nonfinite: Iterable = ()) -> MetricsTable:
    """The table of a history DataFrame (a ``step`` column, one column per metric; ``nonfinite`` lists its logged
    NaN/±Inf, which the frame cannot tell from a missing value). A row is an evaluation record when its non-null
    metrics are all evaluation metrics."""
    steps = df[_STEP].to_numpy(dtype=np.int64)
    names = [c for c in df.columns if c != _STEP]
    columns = {c: df[c].to_numpy() for c in names}
    evaluation = np.zeros(len(df), dtype=bool)
    eval_cols = [c for c in names if is_evaluation_record([c])]
    if eval_cols:
        logged = df[names].notna()
        evaluation = (
            logged[eval_cols].any(axis=1) & ~logged[[c for c in names if c not in eval_cols]].any(axis=1)
        ).to_numpy()
    return MetricsTable(steps, evaluation, columns, nonfinite=[(int(s), m, float(v)) for s, m, v in nonfinite])
