"""Load a sweep's runs into two tidy pandas tables.

Sources (same output either way):

* local run folders (the default): ``config.yaml``, ``metrics.jsonl``, ``summary.json`` per run, as written by
  ``gkd-train`` (run folder contract in ``DESIGN.md``);
* wandb, through the public API (``wandb.Api().runs(path, filters={"group": ...})``) reading *full* histories
  with ``scan_history`` (sampled ``history()`` would miscount negative-loss calls);
* wandb offline run files (``offline-run-*/run-*.wandb``), decoded record by record, for machines without a
  wandb server and for tests.

Output, :class:`Sweep`:

* ``runs``: one row per run, keyed by ``run``; config columns with their dotted names (``loss.precision``,
  ``loss.beta_form``, ``gkd.beta``, ``gkd.temperature``, ``gkd.topk``, ``run.seed``, ``backend.name``, ...),
  the dtypes seen at the loss boundary (``dtype.student``, ``dtype.teacher``), ``status`` as the run reported
  it, and ``outcome`` in {completed, failed, incomplete}. Failed or incomplete runs are kept and marked.
* ``history``: one row per (run, step) with one column per metric name (``train/loss``, ``spot/grad_rel_l2``,
  ...). Several lines logged for the same step are merged (later non-null values win).

Problems that make the input unusable (missing sweep, a run folder without ``summary.json``, unparseable
JSON, a metrics line without ``step``) raise :class:`UnusableInput` naming the file.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

import pandas as pd

try:  # msgspec decodes JSON lines ~3x faster than json; both give identical Python objects.
    import msgspec

    _decode = msgspec.json.decode
    _DecodeError = (msgspec.DecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover
    _decode = json.loads
    _DecodeError = (json.JSONDecodeError, UnicodeDecodeError)

__all__ = [
    "UnusableInput",
    "Sweep",
    "RunRecord",
    "CONFIG_COLUMNS",
    "load_sweep",
    "load_run_folder",
    "find_run_folders",
    "load_wandb_sweep",
    "load_wandb_offline",
    "runs_from_wandb",
    "OfflineRun",
    "find_offline_runs",
    "tabulate",
    "flatten",
]

#: Config columns every runs table carries (NaN/None when a run does not say).
CONFIG_COLUMNS = (
    "loss.precision",
    "loss.beta_form",
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
_SKIP_DIRS = {"wandb", "swift", "captures", ".hydra", "__pycache__", ".submitit", "report"}
_LOW_PRECISION = {"bfloat16", "float16", "bf16", "fp16", "half"}


_HYDRA_VERDICT = "job_return.json"  # written by launch.sweep's Hydra callback for every sweep point


class UnusableInput(Exception):
    """The sweep cannot be analysed (exit code 2). The message names the offending file or folder."""


@dataclass
class RunRecord:
    """One run before tabulation.

    config: flat dotted keys. history: list of metric dicts, each with an int ``step``.
    """

    name: str
    status: str  # as reported: completed | failed | running (wandb: finished->completed, crashed->failed)
    config: dict
    history: Any  # list of dicts, or a DataFrame with a ``step`` column
    error: Optional[str] = None
    group: Optional[str] = None
    path: Optional[str] = None
    dtypes_seen: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    last_step: Optional[int] = None
    wall_s: Optional[float] = None
    problems: list = field(default_factory=list)


@dataclass
class Sweep:
    """A loaded sweep. ``runs``: one row per run. ``history``: one row per (run, step)."""

    source: str
    runs: pd.DataFrame
    history: pd.DataFrame

    def run_history(self, run: str) -> pd.DataFrame:
        """History of one run, indexed by step ``[steps, metrics]``."""
        h = self.history[self.history["run"] == run]
        return h.set_index("step").sort_index()

    @property
    def groups(self) -> list:
        return sorted({g for g in self.runs["group"].dropna().unique()})


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def flatten(d: Mapping, prefix: str = "") -> dict:
    """Nested mapping -> flat dict with dotted keys (``{"loss": {"precision": x}}`` -> ``{"loss.precision": x}``)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


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
    s = str(x)
    return s.replace("torch.", "")


def _is_mixed(student: Optional[str], teacher: Optional[str]) -> bool:
    """True when the two sides reach the loss in different dtypes and one of them is low precision."""
    if not student or not teacher:
        return False
    return student != teacher and (student in _LOW_PRECISION or teacher in _LOW_PRECISION)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UnusableInput(f"{path}: file missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnusableInput(f"{path}: not valid JSON ({e})") from None


def _int_step(value: Any, where: str) -> int:
    if isinstance(value, bool) or value is None:
        raise UnusableInput(f"{where}: 'step' must be an integer, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise UnusableInput(f"{where}: 'step' must be an integer, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise UnusableInput(f"{where}: 'step' must be an integer, got {value!r}")
    return int(f)


# ---------------------------------------------------------------------------
# local run folders
# ---------------------------------------------------------------------------


def find_run_folders(sweep: os.PathLike) -> list:
    """Run folders under ``sweep`` (a folder holding ``summary.json``, ``metrics.jsonl`` or ``config.yaml``).

    ``sweep`` itself counts when it is a run folder. Tool folders (``wandb/``, ``swift/``, ``captures/``,
    ``.hydra/``) are not searched. Raises :class:`UnusableInput` when the folder is missing or holds no run.
    """
    root = Path(sweep)
    if not root.exists():
        raise UnusableInput(f"sweep folder {root} does not exist")
    if not root.is_dir():
        raise UnusableInput(f"sweep {root} is not a folder")
    markers = ("summary.json", "metrics.jsonl", "config.yaml")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        hydra_verdict = ".hydra" in dirnames and (Path(dirpath) / ".hydra" / _HYDRA_VERDICT).exists()
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        if hydra_verdict or any(m in filenames for m in markers):
            found.append(Path(dirpath))
            dirnames[:] = []  # a run folder's subfolders are its own (captures, swift, wandb)
    if not found:
        raise UnusableInput(f"no run folders under {root}: expected sub-folders with summary.json and metrics.jsonl")
    return found


def _decode_line(raw: bytes) -> Any:
    """One JSON line; msgspec first, Python's json for what it rejects (NaN/Infinity, which Python writes)."""
    try:
        return _decode(raw)
    except _DecodeError:
        return json.loads(raw)


def _read_metrics_strict(path: Path, status: str) -> tuple:
    """Parse ``metrics.jsonl`` line by line -> (rows, problems), naming the first bad line.

    A truncated last line (no newline) is tolerated only for a run that did not report completion: it is what
    a killed writer leaves."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows, problems = [], []
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        where = f"{path}:{i + 1}"
        try:
            obj = _decode_line(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if i == last and status != "completed":
                problems.append(f"truncated last line in {path.name} ignored")
                continue
            raise UnusableInput(f"{where}: not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise UnusableInput(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
        if "step" not in obj:
            raise UnusableInput(f"{where}: metrics line has no 'step'")
        obj["step"] = _int_step(obj["step"], where)
        rows.append(obj)
    return rows, problems


def _read_metrics_fast(path: Path) -> Optional[pd.DataFrame]:
    """The common case (a well-formed file of numeric metrics) through pyarrow's JSON reader; None when the
    file needs the strict line-by-line parser (any parse/type problem, or pyarrow missing)."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:  # pragma: no cover
        return None
    size = path.stat().st_size
    if size == 0:
        return None
    try:
        table = pj.read_json(path, read_options=pj.ReadOptions(block_size=max(1 << 20, size + 1), use_threads=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    if "step" not in table.column_names or table.num_rows == 0:
        return None
    for f in table.schema:
        if not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type)
                or pa.types.is_null(f.type)):
            return None  # strings, nested values: let the strict path handle them
    if not pa.types.is_integer(table.schema.field("step").type) or table.column("step").null_count:
        return None
    return table.to_pandas()


def _read_metrics(path: Path, status: str):
    """-> (rows as a DataFrame or a list of dicts, problems)."""
    df = _read_metrics_fast(path)
    if df is not None:
        return df, []
    return _read_metrics_strict(path, status)


def load_run_folder(path: os.PathLike) -> RunRecord:
    """Read one run folder (contract in DESIGN.md). Raises :class:`UnusableInput` on missing/corrupt files."""
    path = Path(path)
    summary_path = path / "summary.json"
    verdict_path = path / ".hydra" / _HYDRA_VERDICT
    hydra_verdict = _read_json(verdict_path) if verdict_path.exists() else None
    if not summary_path.exists():
        if isinstance(hydra_verdict, dict) and hydra_verdict.get("status") == "FAILED":
            # The point failed before the harness wrote anything (e.g. a config error): a failed run.
            return RunRecord(name=path.name, status="failed", error=hydra_verdict.get("error"), config={},
                             history=[], path=str(path), problems=["failed before summary.json was written"])
        raise UnusableInput(f"run folder {path}: summary.json missing (every run writes it at start)")
    summary = _read_json(summary_path)
    if not isinstance(summary, dict):
        raise UnusableInput(f"{summary_path}: expected a JSON object")
    status = summary.get("status")
    if status not in ("running", "completed", "failed"):
        raise UnusableInput(f"{summary_path}: 'status' must be running|completed|failed, got {status!r}")
    config = summary.get("config") or {}
    if not isinstance(config, dict):
        raise UnusableInput(f"{summary_path}: 'config' must be an object")
    config = flatten(config)
    if isinstance(hydra_verdict, dict) and hydra_verdict.get("status") == "FAILED" and status != "failed":
        summary = dict(summary, error=summary.get("error") or hydra_verdict.get("error"))
        status = "failed"
    cfg_yaml = path / "config.yaml"
    if cfg_yaml.exists():
        import yaml

        try:
            resolved = yaml.load(cfg_yaml.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        except yaml.YAMLError as e:
            raise UnusableInput(f"{cfg_yaml}: not valid YAML ({e})") from None
        if not isinstance(resolved, dict):
            raise UnusableInput(f"{cfg_yaml}: expected a mapping")
        for k, v in flatten(resolved).items():
            config.setdefault(k, v)
    metrics_path = path / "metrics.jsonl"
    problems = []
    if metrics_path.exists():
        history, problems = _read_metrics(metrics_path, status)
    elif status == "completed":
        raise UnusableInput(f"run folder {path}: metrics.jsonl missing although summary.json says completed")
    else:
        history = []
        problems.append("no metrics.jsonl")
    return RunRecord(
        name=str(summary.get("run_name") or path.name),
        status=status,
        error=summary.get("error"),
        group=summary.get("group"),
        config=config,
        history=history,
        path=str(path),
        dtypes_seen=dict(summary.get("dtypes_seen") or {}),
        versions=dict(summary.get("versions") or {}),
        last_step=summary.get("last_step"),
        wall_s=summary.get("wall_s"),
        problems=problems,
    )


def load_sweep(sweep: os.PathLike) -> Sweep:
    """Load every run folder under ``sweep`` into a :class:`Sweep`."""
    records = [load_run_folder(p) for p in find_run_folders(sweep)]
    return tabulate(records, source=f"local:{Path(sweep)}")


# ---------------------------------------------------------------------------
# tabulation (shared by all sources)
# ---------------------------------------------------------------------------


def _history_frame(rec: RunRecord) -> pd.DataFrame:
    if isinstance(rec.history, pd.DataFrame):
        df = rec.history
    elif not rec.history:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    else:
        df = pd.DataFrame.from_records(rec.history)
    if df["step"].duplicated().any():
        df = df.groupby("step", sort=True).last().reset_index()  # last non-null per column
    else:
        df = df.sort_values("step", kind="stable")
    return df


def tabulate(records: Iterable[RunRecord], source: str) -> Sweep:
    """RunRecords -> :class:`Sweep` (runs table + history table). Run names are made unique."""
    rows, frames, seen = [], [], {}
    for rec in records:
        name = rec.name
        if name in seen:
            seen[name] += 1
            name = f"{name}#{seen[rec.name]}"
        else:
            seen[name] = 0
        cfg = _canonical_config(rec.config)
        h = _history_frame(rec)
        h.insert(0, "run", name)
        frames.append(h)
        n_logged = int(len(h))
        last_logged = int(h["step"].max()) if n_logged else None
        last_step = rec.last_step if rec.last_step is not None else last_logged
        max_steps = cfg.get("run.max_steps")
        student = _dtype_name(rec.dtypes_seen.get("student", cfg.get("dtypes_seen.student")))
        teacher = _dtype_name(rec.dtypes_seen.get("teacher", cfg.get("dtypes_seen.teacher")))
        problems = list(rec.problems)
        if rec.status == "failed":
            outcome = "failed"
        elif rec.status == "running":
            outcome = "incomplete"
            problems.append("status is still 'running' (died without closing, or not finished)")
        else:
            outcome = "completed"
            if max_steps not in (None, "") and last_step is not None and int(last_step) < int(max_steps):
                outcome = "incomplete"
                problems.append(f"completed at step {last_step} < run.max_steps={max_steps}")
        if n_logged == 0 and outcome == "completed":
            outcome = "incomplete"
            problems.append("no metrics logged")
        row = {
            "run": name,
            "group": rec.group if rec.group is not None else cfg.get("group"),
            "status": rec.status,
            "outcome": outcome,
            "error": rec.error,
            "problems": "; ".join(problems),
            "last_step": last_step,
            "n_logged": n_logged,
            "dtype.student": student,
            "dtype.teacher": teacher,
            "mixed_dtypes": _is_mixed(student, teacher),
            "path": rec.path,
            "wall_s": rec.wall_s,
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
        {"native": "original", "fp32": "patched", "fp64": "reference"}).fillna("unknown")
    history = pd.concat(frames, ignore_index=True, sort=False)
    history["step"] = history["step"].astype("int64")
    return Sweep(source=source, runs=runs, history=history)


# ---------------------------------------------------------------------------
# wandb: public API and offline run files
# ---------------------------------------------------------------------------

_WANDB_STATE = {"finished": "completed", "failed": "failed", "crashed": "failed", "killed": "failed",
                "running": "running", "preempted": "failed", "pending": "running"}
_STEP_KEYS = ("step", "train/global_step", "_step")


def _plain(obj: Any) -> Any:
    """wandb config/summary values -> plain Python (the API wraps config values as {"value": x})."""
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def runs_from_wandb(runs: Iterable[Any], include_job_types=None) -> list:
    """Convert wandb run objects into :class:`RunRecord` s.

    Each object needs ``name``, ``group``, ``job_type``, ``state``, ``config``, ``summary`` and
    ``scan_history()`` (the public API's :class:`wandb.apis.public.Run`, or :class:`OfflineRun`).
    Analysis runs (``job_type == "analysis"``) are skipped.
    """
    out = []
    for r in runs:
        job_type = getattr(r, "job_type", None)
        if job_type == "analysis" or (include_job_types and job_type not in include_job_types):
            continue
        config = flatten(_plain(dict(r.config)))
        config = {k[:-6] if k.endswith(".value") else k: v for k, v in config.items()}
        summary = _plain(dict(r.summary))
        history = []
        for row in r.scan_history():
            step = next((row[k] for k in _STEP_KEYS if row.get(k) is not None), None)
            if step is None:
                continue
            item = {k: v for k, v in row.items() if not k.startswith("_") and v is not None}
            item["step"] = _int_step(step, f"wandb run {r.name}")
            history.append(item)
        status = summary.get("status") if summary.get("status") in ("completed", "failed", "running") else None
        state = _WANDB_STATE.get(str(getattr(r, "state", "")), "running")
        # The wandb run state is authoritative for crashes; the harness' own status for failures it caught.
        if status is None or state == "failed":
            status = state
        dtypes = {}
        for side in ("student", "teacher"):
            v = config.get(f"dtypes_seen.{side}", summary.get(f"dtypes_seen.{side}"))
            if v is None and isinstance(summary.get("dtypes_seen"), Mapping):
                v = summary["dtypes_seen"].get(side)
            if v is not None:
                dtypes[side] = v
        versions = {k.split("versions.", 1)[1]: v for k, v in config.items()
                    if k.startswith("versions.") or ".versions." in k}
        out.append(RunRecord(
            name=str(r.name), status=status, config=config, history=history,
            error=summary.get("error"), group=getattr(r, "group", None), path=getattr(r, "path_str", None),
            dtypes_seen=dtypes, versions=versions, last_step=summary.get("last_step"),
            problems=list(getattr(r, "problems", []) or []),
        ))
    return out


def load_wandb_sweep(path: str, group: str, api: Any = None) -> Sweep:
    """Load a sweep from wandb's public API: ``path`` = ``entity/project``, runs filtered by ``group``.

    Histories come from ``scan_history`` (every logged row), never the sampled ``history()``.
    """
    if api is None:
        import wandb

        api = wandb.Api()
    try:
        runs = list(api.runs(path, filters={"group": group}))
    except Exception as e:  # network, auth, unknown project
        raise UnusableInput(f"wandb {path} group {group!r}: cannot list runs ({e})") from None
    records = runs_from_wandb(runs)
    if not records:
        raise UnusableInput(f"wandb {path} group {group!r}: no runs")
    return tabulate(records, source=f"wandb:{path}/{group}")


# --- offline run files (LevelDB-style log of protobuf records) ---------------

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _read_wandb_records(path: Path) -> Iterator[bytes]:
    """Yield the raw protobuf records of a ``.wandb`` transaction log (LevelDB log framing, 32 KiB blocks).

    A torn tail (what a killed process leaves) ends the iteration; a bad header or checksum raises."""
    data = path.read_bytes()
    if len(data) < 7 or data[:4] != b":W&B":
        raise UnusableInput(f"{path}: not a wandb run file (bad header)")
    pos, pending = 7, b""
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        if pos + _HEADER > len(data):
            return
        crc, length, rtype = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if crc == 0 and length == 0 and rtype == 0:  # zero padding at end of block
            pos += left
            continue
        start, end = pos + _HEADER, pos + _HEADER + length
        if end > len(data):
            return  # torn write at the end
        payload = data[start:end]
        if zlib.crc32(bytes([rtype]) + payload) & 0xFFFFFFFF != crc:
            raise UnusableInput(f"{path}: checksum mismatch at byte {pos}")
        pos = end
        if rtype == _FULL:
            yield payload
        elif rtype == _FIRST:
            pending = payload
        elif rtype == _MIDDLE:
            pending += payload
        elif rtype == _LAST:
            yield pending + payload
            pending = b""
        else:
            raise UnusableInput(f"{path}: unknown record type {rtype} at byte {pos}")


def _item_key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def _item_value(item) -> Any:
    try:
        return json.loads(item.value_json)
    except (json.JSONDecodeError, ValueError):
        return item.value_json


class OfflineRun:
    """A wandb offline run read from its ``run-*.wandb`` file, with the public API's run interface
    (``name``, ``id``, ``group``, ``job_type``, ``state``, ``config``, ``summary``, ``scan_history()``)."""

    def __init__(self, path: os.PathLike):
        from wandb.proto import wandb_internal_pb2 as pb

        self.path = Path(path)
        self.path_str = str(self.path)
        self.id = self.name = self.group = self.job_type = self.project = None
        self.config, self.summary, self._history = {}, {}, []
        self.tags = []
        exit_code = None
        for raw in _read_wandb_records(self.path):
            rec = pb.Record()
            try:
                rec.ParseFromString(raw)
            except Exception as e:
                raise UnusableInput(f"{self.path}: undecodable record ({e})") from None
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r = rec.run
                self.id = r.run_id or self.id
                self.name = r.display_name or self.name or r.run_id
                self.group = r.run_group or self.group
                self.job_type = r.job_type or self.job_type
                self.project = r.project or self.project
                self.tags = list(r.tags) or self.tags
                self._update_config(r.config)
            elif kind == "config":
                self._update_config(rec.config)
            elif kind == "history":
                row = {_item_key(it): _item_value(it) for it in rec.history.item}
                if rec.history.HasField("step"):
                    row.setdefault("_step", rec.history.step.num)
                self._history.append(row)
            elif kind == "summary":
                for it in rec.summary.update:
                    self.summary[_item_key(it)] = _item_value(it)
                for it in rec.summary.remove:
                    self.summary.pop(_item_key(it), None)
            elif kind == "exit":
                exit_code = rec.exit.exit_code
        self.problems = []
        if self.id is None:
            # Only the file header: the process died before wandb flushed anything. Keep it as a crashed run.
            self.id = self.name = self.path.stem.replace("run-", "", 1)
            self.problems.append(f"{self.path.name} holds no records (killed before wandb flushed)")
            self.state = "crashed"
            return
        self.state = "running" if exit_code is None else ("finished" if exit_code == 0 else "failed")

    def _update_config(self, cfg) -> None:
        for it in cfg.update:
            key = _item_key(it)
            if key == "_wandb":
                continue
            self.config[key] = _item_value(it)
        for it in cfg.remove:
            self.config.pop(_item_key(it), None)

    def scan_history(self) -> Iterator[dict]:
        return iter(self._history)


def find_offline_runs(root: os.PathLike) -> list:
    """All ``run-*.wandb`` files under ``root`` (sorted)."""
    return sorted(Path(root).rglob("run-*.wandb"))


def load_wandb_offline(root: os.PathLike, group: Optional[str] = None) -> Sweep:
    """Load the wandb offline runs under ``root`` (optionally only one ``group``) into a :class:`Sweep`."""
    root = Path(root)
    if not root.exists():
        raise UnusableInput(f"folder {root} does not exist")
    files = find_offline_runs(root)
    if not files:
        raise UnusableInput(f"no wandb offline run files (run-*.wandb) under {root}")
    runs = [OfflineRun(f) for f in files]
    if group is not None:
        # A run whose file holds no records has no known group: keep it (marked), it may be this sweep's.
        runs = [r for r in runs if r.group == group or r.group is None]
    records = runs_from_wandb(runs)
    if not records:
        raise UnusableInput(f"no training runs in the wandb offline files under {root}"
                            + (f" for group {group!r}" if group else ""))
    return tabulate(records, source=f"wandb-offline:{root}")
