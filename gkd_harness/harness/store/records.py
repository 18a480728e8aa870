"""The typed records of a run folder and a sweep folder: one ``read`` and one ``write`` per file.

Every file named in :data:`gkd_harness.harness.contract.RECORD_FILES` is opened here and nowhere else (a layer
test holds every other module to it): the launcher and the rank write through these functions, every reader in
``analysis/`` reads through them.

========================  ==========================================  =================================
file                      record                                      read / write
========================  ==========================================  =================================
``summary.json``          :class:`Summary` (a typed mapping)          :func:`read_summary` / :func:`write_summary`
``command.json``          :class:`Command`                            :func:`read_command` / :func:`write_command`
``config.yaml``           the resolved config (nested mapping)        :func:`read_config` / :func:`write_config`
``metrics.jsonl``         metrics rows (one JSON object per step)     :func:`open_metrics`, :func:`read_metrics_rows` /
                                                                      :func:`write_metrics_rows`, :func:`metrics_appender`
evaluation rows           the rows of ``metrics.jsonl`` whose metrics
                          are all held-out ones                       :func:`read_evaluation_rows` (written as rows)
``captures/``             :class:`CaptureEntry` per capture file      :func:`read_captures` / :func:`capture_path`
``sweep_manifest.json``   :class:`Manifest` (the sweep's plan)        :func:`read_manifest` / :func:`write_manifest`
========================  ==========================================  =================================

A read returns None when the file is absent and raises :class:`RecordError` (one line naming the file) when it is
not the record (not JSON, not an object, a field of the wrong type). Writes are atomic and redacted
(:func:`gkd_harness.harness.config.secrets.redact`), and raise
:class:`~gkd_harness.harness.store.files.RunFolderError` naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Tuple, TypedDict

from gkd_harness.harness.config.secrets import redact, redact_text
from gkd_harness.harness.contract import (
    CAPTURE_FILE,
    CAPTURES_DIR,
    COMMAND_FILE,
    CONFIG_FILE,
    EVAL_JSD,
    EVAL_METRICS,
    METRICS_FILE,
    RUN_STATUSES,
    SUMMARY_FILE,
    SWEEP_MANIFEST_FILE,
    TRAIN_GLOBAL_STEP,
    WANDB_DIR,
)
from gkd_harness.harness.store.files import dump_json, write_atomic
from gkd_harness.harness.store.metrics_io import MetricsAppender, read_metrics

__all__ = [
    "RecordError",
    "Summary",
    "read_summary",
    "write_summary",
    "summary_path",
    "folders_with_summary",
    "Command",
    "read_command",
    "write_command",
    "wandb_run_id",
    "read_quietly",
    "read_config",
    "write_config",
    "metrics_path",
    "open_metrics",
    "read_metrics_rows",
    "write_metrics_rows",
    "metrics_appender",
    "is_evaluation_row",
    "read_evaluation_rows",
    "CaptureEntry",
    "capture_path",
    "read_captures",
    "Manifest",
    "manifest_from_mapping",
    "read_manifest",
    "write_manifest",
]


class RecordError(ValueError):
    """A record file that is not its record (not JSON, not an object, a field of the wrong type); ``path``: the
    file. The message is one line naming it."""

    def __init__(self, path: Path, why: str, os_error: Optional[OSError] = None):
        super().__init__(f"{path}: {why}")
        self.path, self.os_error = path, os_error


def _bounded_text(path: Path) -> Optional[str]:
    """A record file's text: a regular file of bounded size (a FIFO, a device or a huge file is refused, never
    read: harness/config/user_files.py); None when absent."""
    from gkd_harness.harness.config.user_files import UserFileError, read_text

    try:
        return read_text(path)
    except FileNotFoundError:
        return None
    except UserFileError as e:
        raise RecordError(path, e.reason) from None
    except OSError as e:
        raise RecordError(path, f"cannot be read ({e})", e) from None
    except UnicodeDecodeError as e:
        raise RecordError(path, f"cannot be read ({e})") from None


def _json_object(path: Path) -> Optional[Dict[str, Any]]:
    text = _bounded_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(path, f"not valid JSON ({e})") from None
    except RecursionError:
        raise RecordError(path, "not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise RecordError(path, "expected a JSON object")
    return data


# ---------------------------------------------------------------------------------------------------------------
# summary.json
# ---------------------------------------------------------------------------------------------------------------
class Summary(TypedDict, total=False):
    """``summary.json``: the run's status and identity (:mod:`gkd_harness.harness.store.run_folder` keeps it).

    status: running | completed | failed | interrupted (:data:`gkd_harness.harness.contract.RUN_STATUSES`);
    config: the flat resolved config; versions: package -> version (ms-swift, torch, transformers, ...);
    provenance: harness commit, dirty flag, sha256 of the loss and rank-side code; data_sha256: config key ->
    sha256 of the data file it names (:data:`gkd_harness.harness.contract.DATA_KEYS`); experiment: the preset."""

    status: str
    error: Optional[str]
    signal: Optional[str]
    run_name: str
    group: Optional[str]
    config: Dict[str, Any]
    fingerprint: str
    harness_version: Optional[str]
    harness_code_sha256: Optional[str]
    dtypes_seen: Dict[str, Any]
    versions: Dict[str, Optional[str]]
    provenance: Dict[str, Any]
    data_sha256: Dict[str, Optional[str]]
    last_step: int
    started_at: str
    ended_at: Optional[str]
    wall_s: Optional[float]
    experiment: Optional[str]
    inputs: Dict[str, Any]
    runtime: Dict[str, Any]
    world_size: int
    device: Optional[str]


#: summary.json fields that must be objects when present.
_SUMMARY_OBJECTS = ("config", "dtypes_seen", "versions", "provenance", "data_sha256", "inputs", "runtime")


def read_summary(run_dir: str | os.PathLike[str], check: bool = True) -> Optional[Summary]:
    """``run_dir``'s summary.json; None when absent. ``check``: a ``status`` outside :data:`RUN_STATUSES` or a
    field of :data:`_SUMMARY_OBJECTS` that is not an object raises :class:`RecordError`."""
    path = Path(run_dir) / SUMMARY_FILE
    data = _json_object(path)
    if data is None or not check:
        return data  # type: ignore[return-value]
    if data.get("status") not in RUN_STATUSES:
        raise RecordError(path, f"'status' must be {'|'.join(RUN_STATUSES)}, got {data.get('status')!r}")
    for key in _SUMMARY_OBJECTS:
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise RecordError(path, f"'{key}' must be an object")
    return data  # type: ignore[return-value]


def summary_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where ``run_dir``'s summary.json is (for a watcher that compares its bytes between polls)."""
    return Path(run_dir) / SUMMARY_FILE


def folders_with_summary(root: str | os.PathLike[str]) -> List[Path]:
    """Every folder under ``root`` (itself included) holding a summary.json: the run folders gkd-train wrote."""
    return sorted(p.parent for p in Path(root).rglob(SUMMARY_FILE))


def write_summary(run_dir: str | os.PathLike[str], summary: Mapping[str, Any]) -> Path:
    """Write ``run_dir``'s summary.json (atomic, redacted)."""
    path = Path(run_dir) / SUMMARY_FILE
    write_atomic(path, dump_json(redact(dict(summary))), Path(run_dir))
    return path


# ---------------------------------------------------------------------------------------------------------------
# command.json
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Command:
    """``command.json``: the ms-swift command line gkd-train ran and the environment it set (shown values:
    secrets redacted)."""

    argv: Tuple[str, ...]
    env: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def wandb_run_id(self) -> Optional[str]:
        return self.env.get("WANDB_RUN_ID") or None


def read_command(run_dir: str | os.PathLike[str]) -> Optional[Command]:
    path = Path(run_dir) / COMMAND_FILE
    data = _json_object(path)
    if data is None:
        return None
    argv, env = data.get("argv") or [], data.get("env") or {}
    if not isinstance(argv, list) or not isinstance(env, dict):
        raise RecordError(path, "expected {'argv': [...], 'env': {...}}")
    return Command(tuple(str(a) for a in argv), {str(k): str(v) for k, v in env.items()})


def wandb_run_id(run_dir: str | os.PathLike[str]) -> Optional[str]:
    """The run's wandb id: the ``WANDB_RUN_ID`` gkd-train gave ms-swift (command.json), else the id in the name
    of the newest run folder wandb wrote (``wandb/offline-run-<time>-<id>``); None when neither says."""
    try:
        command = read_command(run_dir)
    except RecordError:
        command = None
    if command is not None and command.wandb_run_id:
        return command.wandb_run_id
    folder = Path(run_dir) / WANDB_DIR
    runs = sorted(folder.glob("*run-*-*")) if folder.is_dir() else []
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def read_quietly(read: Any, run_dir: str | os.PathLike[str]) -> Any:
    """``read(run_dir)``, None where the file is absent or not its record (a report's provenance table, which
    shows what a run folder says and never refuses it)."""
    try:
        return read(run_dir)
    except RecordError:
        return None


def write_command(run_dir: str | os.PathLike[str], command: Command) -> Path:
    path = Path(run_dir) / COMMAND_FILE
    write_atomic(path, dump_json(redact({"argv": list(command.argv), "env": dict(command.env)})), Path(run_dir))
    return path


# ---------------------------------------------------------------------------------------------------------------
# config.yaml
# ---------------------------------------------------------------------------------------------------------------
def read_config(run_dir: str | os.PathLike[str]) -> Optional[Dict[str, Any]]:
    """``run_dir``'s config.yaml as a nested mapping; None when absent."""
    import yaml

    from gkd_harness.harness.config.user_files import UserFileError, check_yaml

    path = Path(run_dir) / CONFIG_FILE
    text = _bounded_text(path)
    if text is None:
        return None
    try:
        check_yaml(text, path)  # alias-free: no expansion blow-up
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except UserFileError as e:
        raise RecordError(path, e.reason) from None
    except yaml.YAMLError as e:
        raise RecordError(path, f"not valid YAML ({e})") from None
    except RecursionError:
        raise RecordError(path, "not valid YAML (nested too deeply)") from None
    if not isinstance(data, dict):
        raise RecordError(path, "expected a mapping")
    return data


def write_config(run_dir: str | os.PathLike[str], yaml_text: str) -> Path:
    """config.yaml (atomic); credentials are redacted again here."""
    path = Path(run_dir) / CONFIG_FILE
    write_atomic(path, redact_text(yaml_text), Path(run_dir))
    return path


# ---------------------------------------------------------------------------------------------------------------
# metrics.jsonl: metrics rows and evaluation rows
# ---------------------------------------------------------------------------------------------------------------
def metrics_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where ``run_dir``'s metrics rows are (for a reader that streams the file itself)."""
    return Path(run_dir) / METRICS_FILE


def open_metrics(run_dir: str | os.PathLike[str]) -> Optional[IO[bytes]]:
    """``run_dir``'s metrics.jsonl opened for reading (binary, line by line: the streaming reader of
    ``gkd_harness.analysis.sweep.metrics``); None when absent. The caller closes it."""
    try:
        return open(Path(run_dir) / METRICS_FILE, "rb")
    except FileNotFoundError:
        return None


def read_metrics_rows(run_dir: str | os.PathLike[str]) -> List[Dict[str, Any]]:
    """Every complete row of ``run_dir``'s metrics.jsonl (a torn line skipped); empty when absent."""
    return read_metrics(Path(run_dir) / METRICS_FILE)


def write_metrics_rows(run_dir: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]]) -> Path:
    """Replace ``run_dir``'s metrics.jsonl with ``rows`` (atomic; NaN/±Inf written as Python's json writes them)."""
    path = Path(run_dir) / METRICS_FILE
    write_atomic(path, "".join(json.dumps(dict(r), allow_nan=True) + "\n" for r in rows), Path(run_dir))
    return path


def metrics_appender(run_dir: str | os.PathLike[str], **kw: Any) -> MetricsAppender:
    """The rank's stream of metrics rows into ``run_dir``'s metrics.jsonl."""
    return MetricsAppender(Path(run_dir) / METRICS_FILE, **kw)


_EVAL = frozenset(EVAL_METRICS)
#: Evaluation prefixes: the contract's (``eval/``), and transformers' metric_key_prefix of an evaluation log
#: (``eval_loss``; Megatron's and HF's own logs), which wandb's HF integration rewrites to ``eval/loss``.
_EVAL_PREFIXES = (EVAL_JSD.split("/")[0] + "/", "eval_")
#: Keys that place a row rather than measure anything (transformers adds its step and epoch to every log).
_PLACE = frozenset(("step", TRAIN_GLOBAL_STEP, "train/epoch"))


def is_evaluation_row(keys: Iterable[str]) -> bool:
    """True when the metric keys of one row (its step and epoch aside) are all held-out evaluation metrics
    (``eval/*`` of the contract, or transformers' ``eval_*``): an evaluation row, not a training step."""
    metric = [k for k in keys if k not in _PLACE]
    return bool(metric) and all(k in _EVAL or k.startswith(_EVAL_PREFIXES) for k in metric)


def read_evaluation_rows(run_dir: str | os.PathLike[str]) -> List[Dict[str, Any]]:
    """The held-out evaluation rows of ``run_dir``'s metrics.jsonl, in file order."""
    return [r for r in read_metrics_rows(run_dir) if isinstance(r, dict) and is_evaluation_row(r)]


# ---------------------------------------------------------------------------------------------------------------
# captures/
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CaptureEntry:
    """One capture of the loss inputs: its step, the global rank that wrote it, and the file."""

    step: int
    rank: int
    path: Path


_CAPTURE_NAME = re.compile(
    "^" + re.escape(CAPTURE_FILE).replace(r"\{step\}", r"(\d+)").replace(r"\{rank\}", r"(\d+)") + "$"
)


def capture_path(capture_dir: str | os.PathLike[str], step: int, rank: int) -> Path:
    """Where the capture of ``step`` by global ``rank`` is written (``captures/step{S}_rank{R}.safetensors``)."""
    return Path(capture_dir) / CAPTURE_FILE.format(step=int(step), rank=int(rank))


def read_captures(run_dir: str | os.PathLike[str]) -> List[CaptureEntry]:
    """The captures index of ``run_dir`` (sorted by step, then rank); empty when it captured nothing."""
    folder = Path(run_dir) / CAPTURES_DIR
    if not folder.is_dir():
        return []
    out = []
    for p in folder.iterdir():
        m = _CAPTURE_NAME.match(p.name)
        if m:
            out.append(CaptureEntry(int(m.group(1)), int(m.group(2)), p))
    return sorted(out, key=lambda c: (c.step, c.rank))


# ---------------------------------------------------------------------------------------------------------------
# sweep_manifest.json: the sweep's plan
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Manifest:
    """``sweep_manifest.json`` (``gkd_harness.launch.sweep.write_manifest`` appends each launch).

    points: the planned point names now (folders relative to the sweep folder); declared: point -> what its
    config declares (``run.seed``, ``run.max_steps``, ``run.logging_steps``, ``monitor.eval.every_n_steps``,
    ``overrides``); launches: every launch (``id``, ``at``, ``launcher``, ``points``, ``adds``, ``drops``,
    ``keeps``, ``signoff``); signoff: criteria values the experiment preset declares; group: the wandb group."""

    points: Tuple[str, ...]
    declared: Dict[str, Any] = dataclasses.field(default_factory=dict)
    launches: Tuple[Dict[str, Any], ...] = ()
    signoff: Dict[str, Any] = dataclasses.field(default_factory=dict)
    group: Optional[str] = None
    written_at: Optional[str] = None
    launcher: Optional[str] = None
    schema: Optional[int] = None

    def to_mapping(self) -> Dict[str, Any]:
        return {
            "schema": self.schema,
            "points": list(self.points),
            "group": self.group,
            "launcher": self.launcher,
            "written_at": self.written_at,
            "launches": [dict(x) for x in self.launches],
            "declared": dict(self.declared),
            "signoff": dict(self.signoff),
        }


def manifest_from_mapping(data: Any, where: Optional[Path] = None) -> Manifest:
    """A manifest's JSON object as a :class:`Manifest` (``where``: the file it came from, for the error line). A
    manifest of the first layout (``points`` only) has one launch."""
    where = where if where is not None else Path(SWEEP_MANIFEST_FILE)
    points = data.get("points") if isinstance(data, dict) else None
    if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
        raise RecordError(where, "'points' must be a list of point names")
    declared = data.get("declared") if isinstance(data.get("declared"), dict) else {}
    launches = [dict(x) for x in (data.get("launches") or []) if isinstance(x, dict)]
    if not launches:
        launches = [{"id": 1, "at": data.get("written_at"), "launcher": data.get("launcher"), "points": list(points)}]
    signoff = data.get("signoff") if isinstance(data.get("signoff"), dict) else {}
    group = data.get("group")
    return Manifest(
        tuple(points),
        dict(declared),
        tuple(launches),
        dict(signoff),
        str(group) if group is not None else None,
        data.get("written_at"),
        data.get("launcher"),
        data.get("schema") if isinstance(data.get("schema"), int) else None,
    )


def read_manifest(sweep_dir: str | os.PathLike[str]) -> Optional[Manifest]:
    """``sweep_dir``'s sweep_manifest.json; None when absent."""
    path = Path(sweep_dir) / SWEEP_MANIFEST_FILE
    data = _json_object(path)
    return None if data is None else manifest_from_mapping(data, path)


def write_manifest(sweep_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``sweep_dir``'s sweep_manifest.json (atomic)."""
    path = Path(sweep_dir) / SWEEP_MANIFEST_FILE
    write_atomic(path, json.dumps(manifest.to_mapping(), indent=1, default=str), Path(sweep_dir))
    return path
