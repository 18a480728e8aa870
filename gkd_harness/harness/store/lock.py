"""One owner at a time: the run folder's ``.lock`` and the liveness of its owner.

``.lock`` = {"pid", "host", "started_at", "pid_start", "token", "slurm_job_id", "slurm_restart_count"}, present
while a run lives. :class:`RunLock` is held for a run's whole life. A second owner gets :class:`RunFolderBusy` at
once; a lock left by a dead process on this host, or by this same SLURM job before it was requeued (any host), is
taken over, with a note. Only the owner may archive (move) files, so nothing ever moves a live run's files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional

from gkd_harness.harness.contract import LOCK_FILE
from gkd_harness.harness.store.files import RunFolderError, now_iso
from gkd_harness.harness.store.files import os_error as _os_error
from gkd_harness.harness.store.files import unlink_quietly as _unlink_quietly

log = logging.getLogger("gkd_harness.run_folder")


#: The owner refreshes the lock's mtime this often; a lock of another host older than STALE_AFTER_S is stale.
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0


class RunFolderBusy(RunFolderError):
    """Another live process owns the run folder (``owner``: the lock's content)."""

    def __init__(self, message: str, run_dir: Path, owner: Mapping[str, Any]):
        super().__init__(message, run_dir / LOCK_FILE, run_dir)
        self.owner = dict(owner)


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
    return (
        f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')} since {owner.get('started_at', '?')}"
        if owner
        else "an unreadable lock"
    )


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
    return bool(owner) and owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == host_name()


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

    def __init__(
        self, run_dir: str | os.PathLike, heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S
    ):
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
        return bool(lock) and lock is not None and self.owner is not None and lock.get("token") == self.owner["token"]

    def _busy(self, owner: Mapping[str, Any], why: str) -> RunFolderBusy:
        return RunFolderBusy(
            f"run.output_dir {self.run_dir} is in use by {describe_owner(owner)} ({why}; lock "
            f"{self.path}): wait for that run to end, or choose another run.output_dir",
            self.run_dir,
            owner,
        )

    def acquire(self) -> Optional[str]:
        """Take ownership; returns the takeover note (None when the folder was free). Raises
        :class:`RunFolderBusy` (owned) or :class:`RunFolderError` (cannot create / write)."""
        if self.owner is not None and self.held:
            return self.note
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _os_error(e, "create", self.run_dir, self.run_dir) from None
        me = {
            "pid": os.getpid(),
            "host": host_name(),
            "started_at": now_iso(),
            "pid_start": _proc_start(os.getpid()),
            "token": uuid.uuid4().hex,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
        }
        tmp = self.run_dir / f"{LOCK_FILE}.{os.getpid()}.tmp"
        try:
            with _guard(self.run_dir):
                owner = read_lock(self.run_dir)
                note = None
                if owner is not None:
                    why_stale = "that process is gone"
                    if _requeued_self(owner, me):
                        why_stale = f"SLURM job {me['slurm_job_id']} was requeued: the lock was its own earlier run's"
                    elif owner.get("host") and owner.get("host") != me["host"]:
                        age = self._age()
                        if age is not None and age < self.stale_after_s:
                            raise self._busy(
                                owner,
                                f"another host, lock refreshed {age:.0f} s ago; if that process "
                                f"is gone, delete the lock or wait {self.stale_after_s:.0f} s",
                            )
                        why_stale = f"its heartbeat stopped {age or 0:.0f} s ago"
                    elif (
                        owner and isinstance(owner.get("pid"), int) and pid_alive(owner["pid"], owner.get("pid_start"))
                    ):
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


__all__ = [
    "HEARTBEAT_S",
    "STALE_AFTER_S",
    "RunFolderBusy",
    "RunLock",
    "pid_alive",
    "read_lock",
    "describe_owner",
    "host_name",
    "owned_by_this_process",
]
