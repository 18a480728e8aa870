"""Bounded reads of files a user points at (issue 48, item 6). Torch-free, stdlib and PyYAML only.

* Regular files only: a FIFO (``gkd-analyze --criteria FIFO`` blocked forever), a device (``/dev/zero``) or a
  folder is refused before a byte is read; the file is opened non-blocking, so opening a FIFO never waits.
* A size limit: a file larger than the caller's limit is refused by its size, never read whole.
* YAML without alias expansion: an alias (``*a``) is refused from the parser's events, before anything is
  built (a "billion laughs" alias bomb ran at full CPU for 13 minutes).
* Errors name the file and the line, never its content (``--criteria /etc/passwd`` echoed its first line).
* Lines read with a bound (:func:`bounded_lines`): a line longer than the bound is skipped in chunks and reported
  by its number, never held in memory (a 1 GB line of ``metrics.jsonl`` was read whole, 3.2 GB).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Tuple, Union

#: the default size limit of a small user file (criteria, a config file): 16 MiB
MAX_SMALL_FILE = 16 * 1024 * 1024
#: the default longest line of a line-oriented file (metrics.jsonl, a dataset row): 16 MiB
MAX_LINE = 16 * 1024 * 1024
_CHUNK = 1 << 20


class UserFileError(ValueError):
    """A user's file that cannot be used; the message names the file and why, never its content."""

    def __init__(self, path: Union[str, Path], reason: str):
        from gkd_harness.harness.config.text import console_safe

        self.path, self.reason = str(path), reason
        super().__init__(f"{console_safe(path, limit=300)}: {reason}")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: Union[str, Path], limit: Optional[int] = MAX_SMALL_FILE) -> BinaryIO:
    """``path`` opened for reading in binary, after checking it is a regular file of at most ``limit`` bytes.

    Raises:
        FileNotFoundError: it does not exist (callers have their own line for that).
        UserFileError: not a regular file, too large, or unreadable.
    """
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO without a writer, opened non-blocking for writing; a socket
            raise UserFileError(path, "is not a regular file") from None
        raise UserFileError(path, f"cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(path, f"is {_kind(st.st_mode)}, not a regular file")
        if limit is not None and st.st_size > limit:
            raise UserFileError(path, f"is {st.st_size:,} bytes, more than the {limit:,} allowed")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Union[str, Path], limit: int = MAX_SMALL_FILE) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (a file that grows past it while read is refused)."""
    with open_regular(path, limit) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UserFileError(path, f"is more than the {limit:,} bytes allowed")
    return data


def read_text(path: Union[str, Path], limit: int = MAX_SMALL_FILE) -> str:
    """:func:`read_bytes` decoded as UTF-8; a file that is not names the byte offset, not the bytes."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(path, f"is not UTF-8 text (byte offset {e.start:,})") from None


def check_yaml(text: str, src: Union[str, Path]) -> None:
    """Refuses YAML that is not well formed or that holds an alias (``*name``), from the parser's events alone:
    nothing is built, so an alias bomb costs the length of its text. The error gives the line and column, never a
    snippet of the text."""
    import yaml

    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark
                where = f" (line {mark.line + 1})" if mark is not None else ""
                raise UserFileError(src, f"YAML aliases (*name) are not allowed{where}")
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        raise UserFileError(src, f"not valid YAML ({where})") from None
    except yaml.YAMLError:
        raise UserFileError(src, "not valid YAML") from None


def load_yaml(path: Union[str, Path], limit: int = MAX_SMALL_FILE) -> object:
    """A small YAML file of a user's: regular, bounded, alias-free (:func:`check_yaml`), safely loaded."""
    import yaml

    text = read_text(path, limit)
    check_yaml(text, path)
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def bounded_lines(f: BinaryIO, max_line: int = MAX_LINE) -> Iterator[Tuple[int, Optional[bytes]]]:
    """``(line number, line)`` of a binary file, 1-based; a line longer than ``max_line`` bytes (its newline
    counted) yields ``(n, None)`` and is skipped in chunks, never held whole. A line keeps its newline."""
    n = 0
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        n += 1
        if len(line) <= max_line:
            yield n, line
            continue
        while not line.endswith(b"\n"):  # the rest of the long line, in chunks
            line = f.readline(_CHUNK)
            if not line:
                break
        yield n, None


__all__ = [
    "UserFileError",
    "open_regular",
    "read_bytes",
    "read_text",
    "check_yaml",
    "load_yaml",
    "bounded_lines",
    "MAX_SMALL_FILE",
    "MAX_LINE",
]
