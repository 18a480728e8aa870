"""metrics.jsonl: one JSON object per logging step, appended line by line, and read back.

Records are typed where the harness writes them: ``step`` is an integer (a bool, a float or a string is refused
with :class:`TypeError`). Readers count only lines whose ``step`` is an integer, so ``summary.json``'s
``last_step`` is the step of the last line actually in the file.
"""

from __future__ import annotations

import contextlib
import json
import os
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
        if record_step(record) is None:
            raise TypeError(
                f"a metrics.jsonl record needs an integer 'step', got {record.get('step')!r} "
                f"({type(record.get('step')).__name__})"
            )
        data = (json.dumps(dict(record), default=float, allow_nan=True) + "\n").encode()
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


__all__ = ["MetricsWriter", "read_metrics", "tail_step", "last_metrics_step", "record_step"]
