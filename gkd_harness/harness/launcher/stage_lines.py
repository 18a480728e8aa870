"""One progress line per stage (``gkd-analyze``, ``gkd-dashboard``) or per family (``gkd-certify``), on stderr (beside
gkd-train's own progress display, so that every command, whatever its layer, can use it; standard library only).

Shown only where a person watches: stdout is a terminal and ``--quiet`` was not given; a pipe, a file or CI gets
the command's own output alone. A stage's line is printed as it begins, with the time since the command began:

    gkd-analyze: [2/3] judging the runs (4.1 s)
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def shown(quiet: bool, stdout: Optional[TextIO] = None) -> bool:
    """Whether progress lines are printed: not ``--quiet``, and stdout is a terminal."""
    out = stdout or sys.stdout
    return not quiet and bool(getattr(out, "isatty", lambda: False)())


class Stages:
    """Numbered stages of one command: ``stages.begin("judging the runs")`` prints ``[k/N] judging the runs``.

    Args:
        prog: the command's name, the start of every line.
        total: how many stages the command has (the ``/N`` of ``[k/N]``; 0: no numbers).
        quiet: ``--quiet``; the lines are also left out where stdout is not a terminal (:func:`shown`).
        stream: where the lines go (default stderr, so stdout stays the command's result).
    """

    def __init__(self, prog: str, total: int = 0, quiet: bool = False, stream: Optional[TextIO] = None) -> None:
        self.prog, self.total, self.begun = prog, total, 0
        self.enabled = shown(quiet)
        self.stream = stream
        self.started = time.perf_counter()

    def line(self, text: str) -> None:
        """One line, when shown."""
        if self.enabled:
            print(f"{self.prog}: {text}", file=self.stream or sys.stderr, flush=True)

    def begin(self, what: str) -> None:
        """The next stage begins."""
        self.begun += 1
        number = f"[{self.begun}/{self.total}] " if self.total else ""
        self.line(f"{number}{what} ({time.perf_counter() - self.started:.1f} s)")


def family_line(stages: Stages):
    """``gkd-certify``'s ``on_family``: one line per family as it is done, with its verdict and the time so far."""

    def done(name: str, passed: bool) -> None:
        stages.begun += 1
        stages.line(
            f"family {stages.begun}: {'pass' if passed else 'FAIL'}  {name} ({time.perf_counter() - stages.started:.1f} s)"
        )

    return done
