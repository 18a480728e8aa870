"""One live progress display for a run or a sweep: points done of total, the running point's step of its max,
elapsed time, ETA and failures so far.

On a terminal it is one line redrawn in place (rich); elsewhere (CI logs, pipes) it prints a line only when
something other than the step count changes, plus at most one step line per ``plain_every_s``, so a log stays
short. The caller feeds it snapshots (:class:`Snapshot`); it owns no thread and reads no files.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Optional, TextIO


@dataclass(frozen=True)
class Snapshot:
    """The state to show.

    Attributes:
        label: what runs (a sweep group or a run name).
        total / done / failed: points of the sweep (1 / 0 / 0 for a single run).
        running: the running point's name (None when none runs).
        step / max_steps: the running point's last logged step and its ``run.max_steps``.
    """

    label: str
    total: int
    done: int
    failed: int
    running: Optional[str] = None
    step: Optional[int] = None
    max_steps: Optional[int] = None


def _clock(seconds: Optional[float]) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def eta_seconds(snap: Snapshot, elapsed: float) -> Optional[float]:
    """Remaining time from the progress so far: finished points plus the running point's share of its steps."""
    frac_running = 0.0
    if snap.running is not None and snap.step and snap.max_steps:
        frac_running = min(1.0, snap.step / snap.max_steps)
    progress = snap.done + snap.failed + frac_running
    if progress <= 0 or snap.total <= 0:
        return None
    return elapsed / progress * (snap.total - progress)


def render(snap: Snapshot, elapsed: float) -> str:
    """``[sweep smoke] 1/3 points done, 0 failed | loss=fp32 step 7/20 | 01:12 elapsed, ETA 02:30``."""
    line = f"[{snap.label}] {snap.done}/{snap.total} points done, {snap.failed} failed"
    if snap.running is not None:
        line += f" | {snap.running or '(no overrides)'} step {snap.step or 0}/{snap.max_steps or '?'}"
    return line + f" | {_clock(elapsed)} elapsed, ETA {_clock(eta_seconds(snap, elapsed))}"


class ProgressDisplay:
    """Shows :class:`Snapshot` updates; ``close()`` leaves the last line on screen."""

    def __init__(self, stream: Optional[TextIO] = None, live: Optional[bool] = None, plain_every_s: float = 60.0):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.plain_every_s = plain_every_s
        self.started = time.monotonic()
        self._last_key: Optional[tuple] = None
        self._last_plain = 0.0
        self._console = None
        self._live = None

    def _ensure_live(self):
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.stream)
            self._live = Live("", console=self._console, refresh_per_second=4, transient=False)
            self._live.start()
        return self._live

    def update(self, snap: Snapshot) -> None:
        elapsed = time.monotonic() - self.started
        text = render(snap, elapsed)
        if self.live:
            self._ensure_live().update(text)
            return
        key = (snap.done, snap.failed, snap.running)
        now = time.monotonic()
        if key != self._last_key or now - self._last_plain >= self.plain_every_s:
            print(text, file=self.stream, flush=True)
            self._last_key, self._last_plain = key, now

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


__all__ = ["Snapshot", "ProgressDisplay", "render", "eta_seconds"]
