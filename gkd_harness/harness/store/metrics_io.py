"""metrics.jsonl: one JSON object per logging step, appended line by line, and read back.

:class:`MetricsWriter` appends and fsyncs one record (the launcher's occasional writes); :class:`MetricsAppender`
is the rank's stream: every line written at once, fsynced on a clock and when its owner closes it.

Records are typed where the harness writes them: ``step`` is an integer (a bool, a float or a string is refused
with :class:`TypeError`). Readers count only lines whose ``step`` is an integer, so ``summary.json``'s
``last_step`` is the step of the last line actually in the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from gkd_harness.harness.store.files import os_error as _os_error


def record_step(record: Mapping[str, Any]) -> Optional[int]:
    """The record's ``step`` when it is an integer (not a bool), else None."""
    step = record.get("step") if isinstance(record, Mapping) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


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
        """Append ``record`` (its ``step`` an integer: :class:`TypeError` otherwise, before anything is written)."""
        data = _encode(record)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise _os_error(e, "append to", self.path, self.path.parent) from None
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)  # no torn line left behind
            raise _os_error(e, "append to", self.path, self.path.parent) from None
        finally:
            os.close(fd)


#: Seconds between two fsyncs of an open metrics stream (:class:`MetricsAppender`); every line is written to the
#: file (the kernel's page cache) as it comes, so a process that dies loses none, only a machine crash can.
SYNC_INTERVAL_S = 10.0


class MetricsAppender:
    """The rank's ``metrics.jsonl`` stream: one line per logging step, written at once, fsynced on a clock.

    Each record is handed to the kernel by one ``write`` on a descriptor kept open (``O_APPEND``), so it is in the
    file for every reader (``gkd-train``'s progress, ``tail_step``) and survives the death of this process,
    SIGKILL included. ``fsync`` (which waits for the disk: milliseconds, more on NFS or Lustre) runs at most every
    ``sync_interval_s`` seconds, and in :meth:`sync` / :meth:`close`, which the owner calls at train end and on
    its failure and exit paths. A write that fails (full disk) is rolled back to the previous end of the file, so
    no torn line is left, and raises :class:`RunFolderError`.
    """

    def __init__(self, path: str | os.PathLike, sync_interval_s: float = SYNC_INTERVAL_S):
        self.path = Path(path)
        self.sync_interval_s = float(sync_interval_s)
        self.syncs = 0
        self._fd: Optional[int] = None
        self._dirty = False
        self._synced_at = time.monotonic()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _os_error(e, "create", self.path.parent, self.path.parent) from None

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as e:
                raise _os_error(e, "append to", self.path, self.path.parent) from None
        return self._fd

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` (its ``step`` an integer: :class:`TypeError` otherwise, before anything is written);
        fsync when the last one is ``sync_interval_s`` old."""
        data = _encode(record)
        fd = self._open()
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)  # no torn line left behind
            raise _os_error(e, "append to", self.path, self.path.parent) from None
        self._dirty = True
        if time.monotonic() - self._synced_at >= self.sync_interval_s:
            self.sync()

    def sync(self) -> None:
        """fsync what was written since the last one (nothing to do when nothing was)."""
        if self._fd is not None and self._dirty:
            try:
                os.fsync(self._fd)
            except OSError as e:
                raise _os_error(e, "sync", self.path, self.path.parent) from None
            self.syncs += 1
            self._dirty = False
        self._synced_at = time.monotonic()

    def close(self) -> None:
        """fsync and close (idempotent; a later :meth:`write` opens the file again)."""
        try:
            self.sync()
        finally:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None


def _encode(record: Mapping[str, Any]) -> bytes:
    if record_step(record) is None:
        raise TypeError(
            f"a metrics.jsonl record needs an integer 'step', got {record.get('step')!r} "
            f"({type(record.get('step')).__name__})"
        )
    return (json.dumps(dict(record), default=float, allow_nan=True) + "\n").encode()


def read_metrics(path: str | os.PathLike) -> List[Dict[str, Any]]:
    """All complete lines of a metrics stream (a torn line is skipped)."""
    from gkd_harness.harness.config.user_files import bounded_lines

    out = []
    try:
        with open(path, "rb") as f:
            for _, line in bounded_lines(f):  # a line past the bound is skipped, never read whole (issue 48, 6)
                if line is None:
                    continue
                try:
                    out.append(json.loads(line))
                except (json.JSONDecodeError, UnicodeDecodeError):
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
            step = record_step(json.loads(line))
        except ValueError:
            continue
        if step is not None:
            return step
    return None


def last_metrics_step(path: str | os.PathLike) -> int:
    """The step of the last line of ``path`` whose ``step`` is an integer (0: none): what summary.json's
    ``last_step`` says."""
    steps = [s for s in map(record_step, read_metrics(path)) if s is not None]
    return steps[-1] if steps else 0


__all__ = [
    "MetricsWriter",
    "MetricsAppender",
    "SYNC_INTERVAL_S",
    "read_metrics",
    "tail_step",
    "last_metrics_step",
    "record_step",
]
