"""The run-folder contract: layout, one owner at a time, config fingerprint, and every write of its files.

Run folder (one per run, ``run.output_dir``)::

    .lock              the owner: {"pid", "host", "started_at", "pid_start", "token", "slurm_job_id",
                       "slurm_restart_count"}; present while a run lives
    config.yaml        resolved harness config (secrets redacted)
    metrics.jsonl      one JSON object per logging step, contract metric names + "step", flushed line by line
    summary.json       status running|completed|failed|interrupted (then "signal"), error, run_name, group, flat config, fingerprint,
                       harness_version, dtypes_seen, versions, last_step, started_at, ended_at, wall_s
    captures/          step{S}_rank{R}.safetensors where capture is enabled
    wandb/             WANDB_DIR
    swift/             ms-swift's own output_dir (logging.jsonl, args.json)
    previous_attempts/<n>/   earlier attempts, moved here only by the lock's owner

Ownership: :class:`RunLock` (``RunFolder.lock()``) is held for a run's whole life. A second owner gets
:class:`RunFolderBusy` at once; a lock left by a dead process on this host, or by this same SLURM job before
it was requeued (any host), is taken over, with a note. Only the
owner may archive (move) files, so nothing ever moves a live run's files.

Identity: :func:`config_fingerprint` hashes every key of the resolved (flat, redacted) config plus the harness
version. :meth:`RunFolder.check_prior` says what to do with an earlier attempt: skip a completed one only when
the fingerprint matches, else stop with :class:`ConfigMismatch` listing the keys that differ.

Errors: every failed write raises :class:`RunFolderError`, one line naming the file and ``run.output_dir``;
temporary files are removed on every path; :meth:`RunFolder.record_failure` records ``failed`` where the disk
allows (rewriting summary.json in place when there is no room for a new file).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno as _errno
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from harness.config.secrets import REDACTED, find_secret_keys, redact, redact_name, redact_text, secret_values
from harness.contract import ARCHIVE_DIR, CAPTURES_DIR, CONFIG_FILE, LOCK_FILE, METRICS_FILE, PLUGIN_SETTINGS_FILE, SUMMARY_FILE, SWIFT_DIR, SWIFT_LOG, WANDB_DIR

log = logging.getLogger("gkd_harness.run_folder")

#: The owner refreshes the lock's mtime this often; a lock of another host older than STALE_AFTER_S is stale.
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
#: What an attempt leaves in its folder (moved together by :meth:`RunFolder.archive_previous_attempt`).
ATTEMPT_FILES = (METRICS_FILE, SUMMARY_FILE, CONFIG_FILE, CAPTURES_DIR, WANDB_DIR, SWIFT_DIR, SWIFT_LOG,
                 "command.json", PLUGIN_SETTINGS_FILE)
#: Keys that say where and how to run a config, not what it trains: left out of the fingerprint and the diff.
FINGERPRINT_EXCLUDE = frozenset({"run.output_dir", "run.overwrite", "run.resume", "run.dry_run", "run.verbose"})
PACKAGE = "gkd-harness"


# ----------------------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------------------
class RunFolderError(RuntimeError):
    """A run folder could not be created, written or owned. ``path``: the file or folder at fault;
    ``run_dir``: the run folder (``run.output_dir``). The message is one line naming both."""

    def __init__(self, message: str, path: Optional[Path] = None, run_dir: Optional[Path] = None,
                 errno: Optional[int] = None):
        super().__init__(message)
        self.path, self.run_dir, self.errno = path, run_dir, errno


class RunFolderBusy(RunFolderError):
    """Another live process owns the run folder (``owner``: the lock's content)."""

    def __init__(self, message: str, run_dir: Path, owner: Mapping[str, Any]):
        super().__init__(message, run_dir / LOCK_FILE, run_dir)
        self.owner = dict(owner)


class ConfigMismatch(RunFolderError):
    """The folder holds an attempt of a different config (``differing``: the keys that differ)."""

    def __init__(self, message: str, run_dir: Path, differing: List[str]):
        super().__init__(message, run_dir / SUMMARY_FILE, run_dir)
        self.differing = list(differing)


def _os_error(err: OSError, action: str, path: Path, run_dir: Path) -> RunFolderError:
    code = _errno.errorcode.get(err.errno or 0, "")
    reason = f"{err.strerror or err} ({code})" if code else str(err.strerror or err)
    try:
        where = path.relative_to(run_dir)
        what = f"{action} run.output_dir {run_dir}" if str(where) == "." else \
            f"{action} {where} in run.output_dir {run_dir}"
    except ValueError:
        what = f"{action} {path} (run.output_dir {run_dir})"
    return RunFolderError(f"cannot {what}: {reason}", path, run_dir, err.errno)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ----------------------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------------------
def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def package_versions() -> Dict[str, Optional[str]]:
    """Versions of the packages whose arithmetic the results depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out: Dict[str, Optional[str]] = {}
    for name in ("ms-swift", "torch", "transformers", "trl", "wandb"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def harness_version() -> str:
    """The installed gkd-harness version (``"unknown"`` when the package is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown"


def _write_atomic(path: Path, text: str, run_dir: Path) -> None:
    """Write ``text`` to ``path`` through ``.<name>.<pid>.tmp`` + rename; the temporary file never survives."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise _os_error(e, "write", path, run_dir) from None
    finally:
        if tmp.exists() or tmp.is_symlink():
            _unlink_quietly(tmp)


def _write_in_place(path: Path, text: str, run_dir: Path) -> None:
    """Overwrite an existing file's bytes (reuses its blocks: what still works on a full disk)."""
    try:
        with open(path, "r+") as f:
            f.seek(0)
            f.write(text)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise _os_error(e, "write", path, run_dir) from None


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, default=str)


# ----------------------------------------------------------------------------------------------------------
# fingerprint
# ----------------------------------------------------------------------------------------------------------
def canonical_config(flat_config: Mapping[str, Any], exclude: Iterable[str] = FINGERPRINT_EXCLUDE) -> Dict[str, Any]:
    """The comparable form of a flat config: secrets redacted, ``exclude`` keys dropped, values as they read back
    from summary.json (a JSON round trip: tuples -> lists, unknown types -> str), keys sorted."""
    skip = set(exclude)
    data = {str(k): v for k, v in redact(dict(flat_config)).items() if str(k) not in skip}
    return json.loads(json.dumps(dict(sorted(data.items())), default=str))


def config_fingerprint(flat_config: Mapping[str, Any], version: Optional[str] = None,
                       exclude: Iterable[str] = FINGERPRINT_EXCLUDE) -> str:
    """sha256 (hex, 64 characters) over every key and value of the flat resolved config (paths included; the
    ``exclude`` keys that only say where/how to run left out) plus the harness ``version``."""
    payload = {"config": canonical_config(flat_config, exclude),
               "harness_version": harness_version() if version is None else version}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_diff(old_flat: Mapping[str, Any], new_flat: Mapping[str, Any],
                exclude: Iterable[str] = FINGERPRINT_EXCLUDE) -> List[str]:
    """Sorted keys whose value differs between two flat configs, or that only one of them has."""
    old, new = canonical_config(old_flat, exclude), canonical_config(new_flat, exclude)
    return sorted(k for k in set(old) | set(new) if old.get(k, ...) != new.get(k, ...))


def summary_diff(summary: Mapping[str, Any], flat_config: Mapping[str, Any],
                 version: Optional[str] = None) -> List[str]:
    """Keys that differ between a folder's summary.json and a new flat config; ``"harness_version"`` when the
    versions differ, ``"fingerprint"`` when the stored fingerprint is absent (a folder of an older harness) or
    does not match although no key differs. Empty: same config."""
    version = harness_version() if version is None else version
    keys = config_diff(summary.get("config") or {}, flat_config)
    if summary.get("harness_version") != version:
        keys.append("harness_version")
    if not keys and summary.get("fingerprint") != config_fingerprint(flat_config, version):
        keys.append("fingerprint")
    return keys


def _show(value: Any, width: int = 40) -> str:
    text = json.dumps(value, default=str) if value is not ... else "(absent)"
    return text if len(text) <= width else text[: width - 3] + "..."


def mismatch_message(run_dir: Path, summary: Mapping[str, Any], flat_config: Mapping[str, Any],
                     differing: List[str], what: str = "a completed run") -> str:
    """One line: which keys differ (old -> new) and the two ways on: a new group / folder, or run.overwrite=true."""
    old, new = canonical_config(summary.get("config") or {}), canonical_config(flat_config)
    shown = []
    for k in differing[:8]:
        if k == "harness_version":
            shown.append(f"harness_version {_show(summary.get('harness_version'))} -> {_show(harness_version())}")
        elif k == "fingerprint":
            shown.append("fingerprint (absent or different)")
        else:
            shown.append(f"{k} {_show(old.get(k, ...))} -> {_show(new.get(k, ...))}")
    more = f" and {len(differing) - 8} more" if len(differing) > 8 else ""
    return (f"run.output_dir {run_dir} holds {what} of a different config ({len(differing)} keys differ: "
            f"{'; '.join(shown)}{more}); to keep both, use a new group (tracking.wandb.group=...) or another "
            f"run.output_dir; to replace it, add run.overwrite=true (the old attempt moves to "
            f"{run_dir / ARCHIVE_DIR}/<n>)")


@dataclass(frozen=True)
class PriorAttempt:
    """What :meth:`RunFolder.check_prior` found and what to do with it.

    ``action``: ``"new"`` (nothing there: start), ``"skip"`` (completed with the same fingerprint: return
    ``summary``), ``"resume"`` (unfinished, same fingerprint, resume asked: continue from its checkpoint),
    ``"restart"`` (archive the earlier attempt, then start). ``differing``: keys that differ (may be non-empty
    for ``restart``, to log).
    """

    action: str
    summary: Optional[Dict[str, Any]] = None
    differing: Tuple[str, ...] = field(default_factory=tuple)


# ----------------------------------------------------------------------------------------------------------
# ownership
# ----------------------------------------------------------------------------------------------------------
def _proc_start(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _proc_state(pid: int) -> Optional[str]:
    """The kernel's state letter of ``pid`` (field 3 of /proc/<pid>/stat: R, S, D, Z, ...), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def pid_alive(pid: int, pid_start: Optional[str] = None) -> bool:
    """Is process ``pid`` (on this host) alive, and the same process that recorded ``pid_start``? A zombie (exited,
    not yet reaped by its parent) is not alive."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    if _proc_state(int(pid)) in ("Z", "X"):
        return False
    if pid_start is not None:
        now = _proc_start(int(pid))
        if now is not None and now != pid_start:
            return False  # the pid was reused by another process
    return True


def read_lock(run_dir: str | os.PathLike) -> Optional[Dict[str, Any]]:
    """The lock's content (``{"pid", "host", "started_at", ...}``), ``{}`` for an unreadable one, ``None`` if absent."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def describe_owner(owner: Mapping[str, Any]) -> str:
    return (f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')} since {owner.get('started_at', '?')}"
            if owner else "an unreadable lock")


def host_name() -> str:
    """The host name a lock records."""
    return socket.gethostname()


def _requeued_self(owner: Mapping[str, Any], me: Mapping[str, Any]) -> bool:
    """Is ``owner`` the lock of this same SLURM job before a requeue (same SLURM_JOB_ID, on another host or from
    an earlier SLURM_RESTART_COUNT)? SLURM ends a job's processes before it requeues it, so that owner is gone."""
    job = me.get("slurm_job_id")
    if not job or str(owner.get("slurm_job_id")) != str(job):
        return False
    if owner.get("host") != me.get("host"):
        return True
    try:
        return int(owner.get("slurm_restart_count") or 0) < int(me.get("slurm_restart_count") or 0)
    except (TypeError, ValueError):
        return False


def owned_by_this_process(run_dir: str | os.PathLike) -> bool:
    """Does this process hold the run folder's lock?"""
    owner = read_lock(run_dir)
    return bool(owner) and owner.get("pid") == os.getpid() and owner.get("host") == host_name()


@contextlib.contextmanager
def _guard(run_dir: Path) -> Iterator[None]:
    """Serialise lock takeovers on this host: flock on the folder itself (best effort where unsupported)."""
    import fcntl

    fd = None
    try:
        fd = os.open(run_dir, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        pass
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


class RunLock:
    """Ownership of one run folder, held for the run's whole life (``with RunLock(d) as lock: ...``).

    ``acquire()`` creates the folder if needed and writes ``.lock`` = {pid, host, started_at, pid_start, token,
    slurm_job_id}; a daemon thread then refreshes its mtime every ``heartbeat_s``. A live owner -> 
    :class:`RunFolderBusy` at once, naming the folder and the owner. Taken over, with ``note`` saying whose it was
    (also logged): a lock of a dead pid (or a reused one) on this host, an unreadable lock, and a lock of another
    host whose heartbeat stopped more than ``stale_after_s`` ago (a node that died), and, at once, the lock of this
    same SLURM job before a requeue (same ``SLURM_JOB_ID``, another host or an earlier ``SLURM_RESTART_COUNT``).
    ``release()`` removes the lock
    if it is still this one's.
    """

    def __init__(self, run_dir: str | os.PathLike, heartbeat_s: float = HEARTBEAT_S,
                 stale_after_s: float = STALE_AFTER_S):
        self.run_dir = Path(run_dir).expanduser().resolve()
        self.path = self.run_dir / LOCK_FILE
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.note: Optional[str] = None
        self.owner: Optional[Dict[str, Any]] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def held(self) -> bool:
        lock = read_lock(self.run_dir)
        return bool(lock) and self.owner is not None and lock.get("token") == self.owner["token"]

    def _busy(self, owner: Mapping[str, Any], why: str) -> RunFolderBusy:
        return RunFolderBusy(f"run.output_dir {self.run_dir} is in use by {describe_owner(owner)} ({why}; lock "
                             f"{self.path}): wait for that run to end, or choose another run.output_dir", self.run_dir,
                             owner)

    def acquire(self) -> Optional[str]:
        """Take ownership; returns the takeover note (None when the folder was free). Raises
        :class:`RunFolderBusy` (owned) or :class:`RunFolderError` (cannot create / write)."""
        if self.owner is not None and self.held:
            return self.note
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _os_error(e, "create", self.run_dir, self.run_dir) from None
        me = {"pid": os.getpid(), "host": host_name(), "started_at": now_iso(),
              "pid_start": _proc_start(os.getpid()), "token": uuid.uuid4().hex,
              "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
              "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT")}
        tmp = self.run_dir / f"{LOCK_FILE}.{os.getpid()}.tmp"
        try:
            with _guard(self.run_dir):
                owner = read_lock(self.run_dir)
                note = None
                if owner is not None:
                    why_stale = "that process is gone"
                    if _requeued_self(owner, me):
                        why_stale = (f"SLURM job {me['slurm_job_id']} was requeued: the lock was its own earlier "
                                     "run's")
                    elif owner.get("host") and owner.get("host") != me["host"]:
                        age = self._age()
                        if age is not None and age < self.stale_after_s:
                            raise self._busy(owner, f"another host, lock refreshed {age:.0f} s ago; if that process "
                                                    f"is gone, delete the lock or wait {self.stale_after_s:.0f} s")
                        why_stale = f"its heartbeat stopped {age or 0:.0f} s ago"
                    elif owner and isinstance(owner.get("pid"), int) and \
                            pid_alive(owner["pid"], owner.get("pid_start")):
                        same = owner["pid"] == me["pid"]
                        raise self._busy(owner, "this same process, through another RunLock" if same else "alive")
                    note = f"took over the stale lock of {describe_owner(owner)} in {self.run_dir} ({why_stale})"
                try:
                    tmp.write_text(json.dumps(me))
                    if owner is None:
                        os.link(tmp, self.path)  # atomic create: fails if someone else created it meanwhile
                    else:
                        os.replace(tmp, self.path)
                except FileExistsError:
                    other = read_lock(self.run_dir) or {}
                    raise self._busy(other, "created at the same moment") from None
                except OSError as e:
                    raise _os_error(e, "write", self.path, self.run_dir) from None
        finally:
            _unlink_quietly(tmp)
        self.owner, self.note = me, note
        if note:
            log.warning(note)
        self._stop.clear()
        if self.heartbeat_s and self.heartbeat_s > 0:
            self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
            self._thread.start()
        return note

    def _age(self) -> Optional[float]:
        try:
            return max(0.0, time.time() - self.path.stat().st_mtime)
        except OSError:
            return None

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if self.held:
                    os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Give up ownership (removes ``.lock`` only while it is still this lock's)."""
        if self.owner is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with _guard(self.run_dir):
            if self.held:
                _unlink_quietly(self.path)
        self.owner = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


# ----------------------------------------------------------------------------------------------------------
# the folder
# ----------------------------------------------------------------------------------------------------------
class RunFolder:
    """The run folder of one run; every writer of the contract files goes through here.

    Writes raise :class:`RunFolderError` (one line naming the file and run.output_dir); moving files
    (:meth:`archive_previous_attempt`) needs the folder's lock (:meth:`lock`) held by this process.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # layout -------------------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def captures_dir(self) -> Path:
        return self.path / "captures"

    @property
    def wandb_dir(self) -> Path:
        return self.path / "wandb"

    @property
    def swift_dir(self) -> Path:
        return self.path / "swift"

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_FILE

    # ownership ----------------------------------------------------------------------------------------
    def lock(self) -> RunLock:
        """This folder's :class:`RunLock` (not yet acquired): ``with folder.lock() as lock: ...``."""
        return RunLock(self.path)

    def owner(self) -> Optional[Dict[str, Any]]:
        return read_lock(self.path)

    # files --------------------------------------------------------------------------------------------
    def create(self) -> "RunFolder":
        for d in (self.path, self.wandb_dir):
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _os_error(e, "create", d, self.path) from None
        return self

    def write_config(self, yaml_text: str) -> None:
        """config.yaml (atomic). The caller passes redacted text; credentials are redacted again here."""
        _write_atomic(self.config_path, redact_text(yaml_text), self.path)

    def write_json(self, name: str, data: Any) -> Path:
        """Any other JSON file of the folder (command.json, plugin_settings.json), atomic and redacted."""
        path = self.path / name
        _write_atomic(path, _json(redact(data)), self.path)
        return path

    def archive_previous_attempt(self, reason: Optional[str] = None) -> Optional[Path]:
        """Move an earlier attempt's files to ``previous_attempts/<n>/`` so a restart starts clean.

        Only the lock's owner may do this (:class:`RunFolderError` otherwise): a live run's files never move.
        ``reason`` is written to ``previous_attempts/<n>/archived.json``. Returns the archive folder, or None when
        there was nothing to move.
        """
        present = [n for n in ATTEMPT_FILES if (self.path / n).exists()]
        if not present:
            return None
        if not owned_by_this_process(self.path):
            owner = read_lock(self.path)
            who = describe_owner(owner) if owner is not None else "nobody"
            raise RunFolderError(f"refusing to move files of run.output_dir {self.path}: this process does not hold "
                                 f"its lock (held by {who}); acquire RunFolder.lock() first", self.lock_path, self.path)
        root = self.path / ARCHIVE_DIR
        n = 1
        while (root / str(n)).exists():
            n += 1
        target = root / str(n)
        try:
            target.mkdir(parents=True)
            for name in present:
                os.replace(self.path / name, target / name)
        except OSError as e:
            raise _os_error(e, "archive the earlier attempt of", self.path, self.path) from None
        _write_atomic(target / "archived.json", _json({"archived_at": now_iso(), "reason": reason,
                                                       "files": present}), self.path)
        return target

    def truncate_metrics(self, last_step: int) -> int:
        """Keep only the metrics lines up to ``last_step`` (a run resumed from that checkpoint); returns lines kept."""
        rows = [r for r in read_metrics(self.metrics_path) if int(r.get("step", 0)) <= last_step]
        _write_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows), self.path)
        return len(rows)

    def read_summary(self) -> Optional[Dict[str, Any]]:
        try:
            return json.loads(self.summary_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        except OSError as e:
            raise _os_error(e, "read", self.summary_path, self.path) from None

    def is_completed(self) -> bool:
        summary = self.read_summary()
        return bool(summary) and summary.get("status") == "completed"

    def has_attempt(self) -> bool:
        """Does the folder hold any file of an earlier attempt?"""
        return any((self.path / n).exists() for n in ATTEMPT_FILES)

    def check_prior(self, flat_config: Mapping[str, Any], *, overwrite: bool = False,
                    resume: bool = False) -> PriorAttempt:
        """Decide what to do with an earlier attempt in this folder, given the new flat resolved config.

        - nothing there -> ``new``
        - completed: same fingerprint -> ``skip`` (``restart`` with ``overwrite``); different -> ``restart`` with
          ``overwrite``, else :class:`ConfigMismatch` (one line: the keys that differ and how to proceed)
        - unfinished (failed, or running under a stale lock): same fingerprint -> ``resume`` if ``resume`` else
          ``restart``; different -> ``restart`` (it is archived, not lost), but a resume of a different config ->
          :class:`ConfigMismatch` unless ``overwrite``
        Call it while holding the lock, so the answer cannot change before you act on it.
        """
        summary = self.read_summary()
        if summary is None:
            return PriorAttempt("restart" if self.has_attempt() else "new")
        differing = tuple(summary_diff(summary, flat_config))
        if summary.get("status") == "completed":
            if not differing:
                return PriorAttempt("restart" if overwrite else "skip", summary)
            if overwrite:
                return PriorAttempt("restart", summary, differing)
            raise ConfigMismatch(mismatch_message(self.path, summary, flat_config, list(differing)), self.path,
                                 list(differing))
        if resume and not differing:
            return PriorAttempt("resume", summary)
        if resume and not overwrite:
            raise ConfigMismatch(mismatch_message(self.path, summary, flat_config, list(differing),
                                                  "an unfinished run (run.resume=true)"), self.path, list(differing))
        return PriorAttempt("restart", summary, differing)

    # summary.json -------------------------------------------------------------------------------------
    def _write_summary(self, summary: Mapping[str, Any]) -> None:
        _write_atomic(self.summary_path, _json(redact(dict(summary))), self.path)

    def start_summary(self, run_name: str, group: Optional[str], flat_config: Mapping[str, Any]) -> Dict[str, Any]:
        """summary.json of a new attempt: status running, the flat config (redacted), its fingerprint, the
        harness version and the provenance (git commit and dirty flag, sha256 of the loss code, ms-swift version:
        :mod:`harness.store.provenance`)."""
        from harness.store.provenance import provenance

        version = harness_version()
        summary = {
            "status": "running", "error": None, "run_name": redact_name(str(run_name)), "group": group,
            "config": canonical_config(flat_config, exclude=()),
            "fingerprint": config_fingerprint(flat_config, version), "harness_version": version,
            "dtypes_seen": {}, "versions": package_versions(), "last_step": 0, "started_at": now_iso(), "ended_at": None, "wall_s": None,
            "provenance": provenance(flat_config.get("loss.precision"), flat_config.get("loss.source")),
        }
        self._write_summary(summary)
        return summary

    def update_summary(self, **fields: Any) -> Dict[str, Any]:
        """Merge ``fields`` into summary.json (nested dicts merged one level deep)."""
        summary = self.read_summary() or {}
        for k, v in fields.items():
            if isinstance(v, Mapping) and isinstance(summary.get(k), Mapping):
                summary[k] = {**summary[k], **v}
            else:
                summary[k] = v
        self._write_summary(summary)
        return summary

    def finish_summary(self, status: str, error: Optional[str] = None) -> Dict[str, Any]:
        """Final status (completed | failed | interrupted) with ended_at, wall_s and last_step; raises :class:`RunFolderError`."""
        summary = self.read_summary() or {}
        started = summary.get("started_at")
        wall = None
        if started:
            wall = (_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(started)).total_seconds()
        last = last_metrics_step(self.metrics_path)
        return self.update_summary(status=status, error=error, ended_at=now_iso(), wall_s=wall,
                                   last_step=max(int(summary.get("last_step") or 0), last))

    def record_failure(self, error: str) -> bool:
        """Best effort, never raises: summary.json says ``failed`` with ``error``. When there is no room for a new
        file (full disk) the existing summary.json is rewritten in place. Returns whether it was recorded."""
        try:
            self.finish_summary("failed", error)
            return True
        except RunFolderError as first:
            log.debug(f"summary.json: atomic write failed ({first}); trying in place")
        except Exception as e:  # noqa: BLE001 - reading a broken folder must not hide the run's own error
            log.warning(f"could not record the failure in {self.summary_path}: {e}")
            return False
        summary = self.read_summary_quietly() or {}
        summary.update(status="failed", error=error, ended_at=now_iso())
        text = _json(redact(summary))
        try:
            _write_in_place(self.summary_path, text, self.path)
            return True
        except RunFolderError:
            pass
        # not even the old size fits: the shortest record that still says failed
        try:
            _write_in_place(self.summary_path, _json({"status": "failed", "error": str(error)[:200]}), self.path)
            return True
        except RunFolderError as e:
            log.warning(f"could not record the failure: {e}")
            return False

    def record_interrupt(self, signal_name: str) -> bool:
        """Best effort, never raises: summary.json says ``interrupted`` (a stop signal: preemption, time-out,
        Ctrl-C) with ``signal`` and ``last_step``, the metrics' last step. Returns whether it was recorded."""
        error = f"interrupted by {signal_name}"
        try:
            self.finish_summary("interrupted", error)
            self.update_summary(signal=signal_name)
            return True
        except Exception as e:  # noqa: BLE001 - a stop must never end in a traceback
            log.warning(f"could not record the interruption in {self.summary_path}: {e}")
        try:  # a full disk: the existing file's blocks
            summary = self.read_summary_quietly() or {}
            summary.update(status="interrupted", error=error, signal=signal_name, ended_at=now_iso(),
                           last_step=max(int(summary.get("last_step") or 0), last_metrics_step(self.metrics_path)))
            _write_in_place(self.summary_path, _json(redact(summary)), self.path)
            return True
        except Exception:  # noqa: BLE001
            return False

    def read_summary_quietly(self) -> Optional[Dict[str, Any]]:
        try:
            return self.read_summary()
        except RunFolderError:
            return None


# ----------------------------------------------------------------------------------------------------------
# metrics.jsonl
# ----------------------------------------------------------------------------------------------------------
class MetricsWriter:
    """Appends one JSON object per logging step to ``metrics.jsonl``; each line is flushed and fsynced.

    A write that fails (full disk) is rolled back to the previous end of the file, so no torn line is left
    to swallow the next record, and raises :class:`RunFolderError`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _os_error(e, "create", self.path.parent, self.path.parent) from None

    def write(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(dict(record), default=float, allow_nan=True) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise _os_error(e, "append to", self.path, self.path.parent) from None
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)  # no torn line left behind
            raise _os_error(e, "append to", self.path, self.path.parent) from None
        finally:
            os.close(fd)


def read_metrics(path: str | os.PathLike) -> List[Dict[str, Any]]:
    """All complete lines of a metrics stream (a torn line is skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def tail_step(metrics: Path) -> Optional[int]:
    """Global step of the last complete line of a metrics.jsonl, reading only its tail (progress polling)."""
    try:
        with metrics.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def last_metrics_step(path: str | os.PathLike) -> int:
    steps = [int(r.get("step", 0)) for r in read_metrics(path)]
    return max(steps) if steps else 0


# ----------------------------------------------------------------------------------------------------------
# secrets in Hydra's own files and folder names
# ----------------------------------------------------------------------------------------------------------


def _override_secret_values(overrides: Iterable[str]) -> List[str]:
    out = []
    for item in overrides:
        key, sep, value = str(item).partition("=")
        if sep and find_secret_keys({key.lstrip("+~"): value}):
            out.append(value.strip("'\""))
    return out


def hydra_secret_values(hydra_dir: str | os.PathLike) -> List[str]:
    """Credential values a Hydra output folder holds: values under secret-looking keys in ``config.yaml`` and
    values of secret-looking ``key=value`` items in ``overrides.yaml``."""
    from omegaconf import OmegaConf

    hydra_dir = Path(hydra_dir)
    values: List[str] = []
    for name, pick in ((CONFIG_FILE, lambda c: secret_values(c)),
                       ("overrides.yaml", lambda c: _override_secret_values(c or []))):
        path = hydra_dir / name
        if not path.is_file():
            continue
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:  # noqa: BLE001 - an unparsable file is still scrubbed by key patterns
            continue
        values.extend(pick(loaded))
    return sorted(set(v for v in values if v and v != REDACTED))


def scrub_file(path: str | os.PathLike, values: Iterable[str] = ()) -> bool:
    """Redact credentials in one text file in place (atomic; :func:`harness.config.secrets.redact_text`). Returns
    whether it changed."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _os_error(e, "read", path, path.parent) from None
    new = redact_text(text, values)
    if new == text:
        return False
    _write_atomic(path, new, path.parent)
    return True


def scrub_hydra_dir(hydra_dir: str | os.PathLike, extra_values: Iterable[str] = ()) -> List[Path]:
    """Redact credentials, in place, from every YAML file of a Hydra output folder (``.hydra/config.yaml``,
    ``overrides.yaml``, ``hydra.yaml``; also a sweep's ``multirun.yaml`` when given its folder): values under
    secret-looking keys, secret ``key=value`` overrides (also inside ``override_dirname`` and the output paths),
    and every occurrence of those values. Returns the files changed."""
    hydra_dir = Path(hydra_dir)
    values = [*hydra_secret_values(hydra_dir), *[str(v) for v in extra_values]]
    changed = []
    for path in sorted(hydra_dir.glob("*.yaml")):
        if scrub_file(path, values):
            changed.append(path)
    return changed


def save_hydra_files(run_dir: str | os.PathLike, task_cfg: Any, subdir: str = ".hydra") -> Path:
    """Write Hydra's three output files (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``, the same content
    Hydra writes) into ``run_dir/subdir``, credentials redacted. For an app run with ``hydra.output_subdir: null``:
    the harness then writes them itself once it owns the folder and knows it will run, so a skipped point's
    ``.hydra/`` stays untouched and no credential ever lands there. Call it inside the Hydra task function."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra_node = HydraConfig.get()
    out = Path(run_dir) / subdir
    overrides = [str(o) for o in hydra_node.overrides.task]
    values = [*secret_values(OmegaConf.to_container(task_cfg, resolve=False)), *_override_secret_values(overrides)]
    texts = {CONFIG_FILE: OmegaConf.to_yaml(task_cfg),
             "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": OmegaConf.to_container(hydra_node)})),
             "overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(overrides))}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _os_error(e, "create", out, Path(run_dir)) from None
    for name, text in texts.items():
        _write_atomic(out / name, redact_text(text, values), Path(run_dir))
    return out


def redacted_folder_name(path: str | os.PathLike, values: Iterable[str] = ()) -> Path:
    """``path`` with credentials redacted from its last component (Hydra's ``override_dirname``)."""
    path = Path(path)
    return path.with_name(redact_name(path.name, values))


def scrub_folder_name(path: str | os.PathLike, values: Iterable[str] = ()) -> Path:
    """Rename a run folder whose name holds a credential to its redacted name; returns the (new) path.

    Refuses (:class:`RunFolderError`) a folder owned by a live process, or a target that exists already.
    """
    path = Path(path)
    target = redacted_folder_name(path, values)
    if target == path or not path.exists():
        return path
    owner = read_lock(path)
    if owner and not owned_by_this_process(path) and isinstance(owner.get("pid"), int) and \
            (owner.get("host") != host_name() or pid_alive(owner["pid"], owner.get("pid_start"))):
        raise RunFolderError(f"cannot rename run folder {redact_name(str(path), values)}: in use by "
                             f"{describe_owner(owner)}", path, path)
    if target.exists():
        raise RunFolderError(f"cannot rename run folder to {target}: it exists already", target, path)
    try:
        os.replace(path, target)
    except OSError as e:
        raise _os_error(e, "rename", path, path) from None
    return target
