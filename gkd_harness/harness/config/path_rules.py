"""Paths from the config checked before any model loads (torch-free; called from
:func:`gkd_harness.harness.config.validate.validate_config`, the dry run included).

* A path the OS cannot take (a name over 255 bytes, a path over 4,096) is refused naming its key: a
  5,000-character ``run.dataset`` was a traceback ("File name too long").
* ``run.output_dir`` is never a system folder (``/``, ``/etc``, ``/usr``, the home folder itself, ...: the dry run
  accepted ``/etc``, ``/`` and ``../../..``), and never a folder that holds a user's files: it must not exist, be
  empty, or be a folder the harness wrote (:func:`harness_wrote`). Before, a user's non-empty folder got 15 run
  files beside the user's, exit 0.
* A local dataset (``run.dataset``, ``monitor.eval.dataset``) is a regular file or a folder (a dataset folder
  ms-swift loads); ``/dev/zero``, a FIFO or a socket are refused (``/dev/zero`` passed validation and failed inside
  ms-swift).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Optional

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.contract import (
    ARCHIVE_DIR,
    CONFIG_FILE,
    HYDRA_DIR,
    LOCK_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    SWIFT_LOG,
    swift_node_log,
)

#: the longest file name most file systems take (bytes), and the longest path Linux takes
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
#: folders that are never a run folder, nor anything below them (the system's own)
SYSTEM_TREES = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot", "/dev", "/proc", "/sys")
#: folders that are never a run folder themselves (a run folder below them is fine)
SYSTEM_FOLDERS = ("/", "/home", "/root", "/tmp", "/var", "/opt", "/mnt", "/media", "/srv", "/run", "/snap")
#: what a folder the harness wrote holds (one of them is enough): a run folder, an archived attempt, the lock
#: of a run that never got further, Hydra's own subfolder of a sweep point
HARNESS_MARKS = (SUMMARY_FILE, LOCK_FILE, CONFIG_FILE, METRICS_FILE, SWIFT_LOG, ARCHIVE_DIR, HYDRA_DIR)


def path_length_problem(value: str) -> Optional[str]:
    """Why the OS cannot take ``value`` as a path (None: it can, as far as length goes)."""
    raw = os.fsencode(os.path.expanduser(value))
    if len(raw) > MAX_PATH_BYTES:
        return f"is not a usable path: {len(raw):,} bytes, more than the {MAX_PATH_BYTES:,} a path may have"
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        return f"is not a usable path: a name of {longest:,} bytes, more than the {MAX_NAME_BYTES} a file name may have"
    return None


def check_path_length(key: str, value: Optional[str]) -> None:
    why = path_length_problem(value) if isinstance(value, str) and value else None
    if why:
        raise ConfigError(key, why)


def _stat(path: Path) -> Optional[os.stat_result]:
    try:
        return path.stat()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def _system_folder(path: Path) -> Optional[str]:
    text = str(path)
    for tree in SYSTEM_TREES:
        if text == tree or text.startswith(tree + "/"):
            return tree
    if text in SYSTEM_FOLDERS or path == Path.home().resolve():
        return text
    return None


def harness_wrote(folder: Path) -> bool:
    """Whether ``folder`` is one the harness (or Hydra for it) wrote: it holds one of :data:`HARNESS_MARKS`, or
    every entry is a folder the harness wrote (a group's folder of run folders, ``outputs/runs/default``)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    if not entries or any(_is_mark(e.name) for e in entries):
        return True
    return all(e.is_dir() and not e.is_symlink() and _holds_mark(e) for e in entries)


def _is_mark(name: str) -> bool:
    """One of :data:`HARNESS_MARKS`, or another node's ms-swift log (a multi-node run's node > 0 writes it first)."""
    return name in HARNESS_MARKS or (name.startswith("swift.node") and name == swift_node_log(_node_of(name)))


def _node_of(name: str) -> int:
    digits = name[len("swift.node") : -len(".log")]
    return int(digits) if digits.isdigit() else -1


def _holds_mark(folder: Path) -> bool:
    try:
        return any(_is_mark(e.name) for e in folder.iterdir())
    except OSError:
        return False


def check_output_dir(value: str) -> None:
    """Raises :class:`ConfigError` for a ``run.output_dir`` the harness must not write into."""
    check_path_length("run.output_dir", value)
    path = Path(value).expanduser()
    try:
        path = path.resolve()
        st = _stat(path)
    except (OSError, RuntimeError) as e:
        raise ConfigError("run.output_dir", f"not a usable folder ({type(e).__name__})") from None
    system = _system_folder(path)
    if system:
        raise ConfigError("run.output_dir", f"{path} is a system folder ({system}): choose a folder of your own")
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError("run.output_dir", f"{path} exists and is not a folder")
    if not harness_wrote(path):
        raise ConfigError(
            "run.output_dir",
            f"{path} holds files the harness did not write: choose an empty or new folder (a run never writes "
            "beside a user's files)",
        )


_SAMPLE_SUFFIX = re.compile(r"#\d+$")


def check_local_dataset(key: str, value: Optional[str]) -> None:
    """A local dataset is a regular file or a folder (``#N`` sample suffix dropped); anything else (a device, a
    FIFO, a socket) is refused naming ``key``. A value that names nothing local is left to the hub checks."""
    if not value:
        return
    check_path_length(key, value)
    path = Path(_SAMPLE_SUFFIX.sub("", value)).expanduser()
    try:
        st = _stat(path)
    except OSError as e:
        raise ConfigError(key, f"{path} cannot be read ({e.strerror})") from None
    if st is None or stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return
    kind = (
        "a character device"
        if stat.S_ISCHR(st.st_mode)
        else "a block device"
        if stat.S_ISBLK(st.st_mode)
        else "a FIFO"
        if stat.S_ISFIFO(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "not a regular file"
    )
    raise ConfigError(
        key, f"{path} is {kind}: a dataset is a regular file (jsonl, json, csv, ...), a folder or a hub id"
    )


__all__ = [
    "check_output_dir",
    "check_local_dataset",
    "check_path_length",
    "path_length_problem",
    "harness_wrote",
    "HARNESS_MARKS",
    "SYSTEM_TREES",
    "SYSTEM_FOLDERS",
]
