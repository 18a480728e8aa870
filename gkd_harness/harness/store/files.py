"""Writing the run folder's files: the one error type (one line naming the file and run.output_dir), atomic and
in-place writes whose temporary files never survive, and the JSON form every file uses.

Every ``OSError`` of a write becomes a :class:`RunFolderError` whose ``exit_code`` says who must act: 2 where the
user must change a path (read-only file system, no permission, not a folder, a name too long), 1 where the run
itself failed (a full disk, a quota, an I/O error).
"""

from __future__ import annotations

import datetime as _dt
import errno as _errno
import json
import os
from pathlib import Path
from typing import Any, Optional

#: errno values that only a different path (or permissions) cures: the user must change the input (exit 2)
PATH_ERRNOS = frozenset(
    {_errno.EROFS, _errno.EACCES, _errno.EPERM, _errno.ENOTDIR, _errno.EISDIR, _errno.ENAMETOOLONG, _errno.ELOOP}
)


class RunFolderError(RuntimeError):
    """A run folder could not be created, written or owned. ``path``: the file or folder at fault;
    ``run_dir``: the run folder (``run.output_dir``). The message is one line naming both.
    ``exit_code``: 2 when the user must change a path (:data:`PATH_ERRNOS`), else 1."""

    def __init__(
        self, message: str, path: Optional[Path] = None, run_dir: Optional[Path] = None, errno: Optional[int] = None
    ):
        super().__init__(message)
        self.path, self.run_dir, self.errno = path, run_dir, errno

    @property
    def exit_code(self) -> int:
        return 2 if self.errno in PATH_ERRNOS else 1

    @property
    def path_error(self) -> bool:
        """Must the user change a path (read-only, no permission, not a folder, ...)?"""
        return self.errno in PATH_ERRNOS


def os_error(err: OSError, action: str, path: Path, run_dir: Path) -> RunFolderError:
    """One line for a failed file operation: ``cannot <action> <file> in run.output_dir <dir>: <cause> (<ERRNO>)``."""
    code = _errno.errorcode.get(err.errno or 0, "")
    reason = f"{err.strerror or err} ({code})" if code else str(err.strerror or err)
    try:
        where = Path(path).relative_to(run_dir)
        what = (
            f"{action} run.output_dir {run_dir}"
            if str(where) == "."
            else f"{action} {where} in run.output_dir {run_dir}"
        )
    except ValueError:
        what = f"{action} {path} (run.output_dir {run_dir})"
    return RunFolderError(f"cannot {what}: {reason}", Path(path), Path(run_dir), err.errno)


def os_error_line(err: OSError) -> str:
    """One line for an ``OSError`` raised outside the run folder's own writes: ``cannot use <path>: <cause>
    (<ERRNO>)``, or the cause alone when the error names no path."""
    code = _errno.errorcode.get(err.errno or 0, "")
    reason = f"{err.strerror or err} ({code})" if code else str(err.strerror or err)
    return f"cannot use {err.filename}: {reason}" if err.filename else reason


def os_exit_code(err: OSError) -> int:
    """2 where the user must change a path (:data:`PATH_ERRNOS`), 1 where the run failed (a full disk, ...)."""
    return 2 if err.errno in PATH_ERRNOS else 1


def unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: Path, text: str, run_dir: Path) -> None:
    """Write ``text`` to ``path`` through ``.<name>.<pid>.tmp`` + rename; the temporary file never survives."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise os_error(e, "write", path, run_dir) from None
    finally:
        if tmp.exists() or tmp.is_symlink():
            unlink_quietly(tmp)


def write_in_place(path: Path, text: str, run_dir: Path) -> None:
    """Overwrite an existing file's bytes (reuses its blocks: what still works on a full disk)."""
    try:
        with open(path, "r+") as f:
            f.seek(0)
            f.write(text)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise os_error(e, "write", path, run_dir) from None


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=1, default=str)


__all__ = [
    "RunFolderError",
    "PATH_ERRNOS",
    "os_error",
    "os_error_line",
    "os_exit_code",
    "unlink_quietly",
    "now_iso",
    "write_atomic",
    "write_in_place",
    "dump_json",
]
