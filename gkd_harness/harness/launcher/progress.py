"""One live progress display for a run or a sweep: points done of total, every running point's step of its max,
elapsed time, ETA and failures so far.

On a terminal it is redrawn in place (rich): one line, plus one line per running point when several run at once
(``hydra/launcher=submitit_local`` starts every point together). Elsewhere (CI logs, pipes) it prints when the
points done, failed or running change, and otherwise at most once per ``plain_every_s`` (a minute), so a log
stays short. The caller feeds it snapshots (:class:`Snapshot`); it owns no thread and reads no files.

**The ETA counts training steps only** (:class:`EtaClock`). A point's pace is measured from the moment its first
training step is seen, never from its start: model loading, a fixture build or ms-swift's start-up would otherwise
be extrapolated over every step (a 5 min start-up made step 1/20 read ``ETA 5:17:38``). Until a point has logged
two different steps its own remaining time is unknown (``ETA --:--``), unless points of the same sweep finished
while watched: their measured wall time (start-up included) is then the estimate. Points not started yet cost one
such wall time each, scheduled over as many slots as points were seen running at once (1 for Hydra's basic
launcher, all of them for ``submitit_local``), so parallel points are not counted one after another.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, TextIO, Tuple

if TYPE_CHECKING:  # rich is imported when a live display starts
    from rich.live import Live


@dataclass(frozen=True)
class Running:
    """One running point: its name (a sweep point's overrides, a run's name), its last logged step and its
    ``run.max_steps`` (None: unknown yet)."""

    name: str
    step: Optional[int] = None
    max_steps: Optional[int] = None


@dataclass(frozen=True)
class Snapshot:
    """The state to show.

    Attributes:
        label: what runs (a sweep group or a run name).
        total / done / failed: points of the sweep (1 / 0 / 0 for a single run).
        running: every running point, in launch order (empty when none runs).
    """

    label: str
    total: int
    done: int
    failed: int
    running: Tuple[Running, ...] = field(default_factory=tuple)


def _clock(seconds: Optional[float]) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


@dataclass
class _Seen:
    started: float  # when the point was first seen running
    first_at: Optional[float] = None  # when its first training step (>= 1) was seen
    first_step: int = 0
    step: int = 0
    max_steps: Optional[int] = None

    def pace(self, now: float) -> Optional[float]:
        """Seconds per step since the first step was seen (None: fewer than two different steps seen)."""
        if self.first_at is None or self.step <= self.first_step or now <= self.first_at:
            return None
        return (now - self.first_at) / (self.step - self.first_step)

    def remaining(self, now: float) -> Optional[float]:
        pace = self.pace(now)
        if pace is None or not self.max_steps:
            return None
        return max(0, self.max_steps - self.step) * pace

    def duration(self, now: float) -> Optional[float]:
        """Its whole wall time, estimated: start-up (to the first step seen) + the other steps at its pace."""
        pace = self.pace(now)
        if pace is None or not self.max_steps or self.first_at is None:
            return None
        return (self.first_at - self.started) + max(0, self.max_steps - self.first_step) * pace


class EtaClock:
    """Remaining time of a run or a sweep from the snapshots seen so far (see the module docstring).

    ``observe(snapshot, now)`` returns the ETA in seconds, or None while unknown.
    """

    def __init__(self) -> None:
        self._seen: Dict[str, _Seen] = {}
        self._walls: List[float] = []  # wall times of points watched from start to end
        self._slots = 1  # the most points seen running at once
        self._done = 0

    def observe(self, snap: Snapshot, now: float) -> Optional[float]:
        running = {p.name: p for p in snap.running}
        for name in [n for n in self._seen if n not in running]:  # ended (done or failed) or gone
            seen = self._seen.pop(name)
            if snap.done > self._done:  # it completed: its whole wall time is a measured estimate
                self._walls.append(now - seen.started)
        self._done = snap.done
        for p in snap.running:
            seen = self._seen.setdefault(p.name, _Seen(started=now))
            seen.max_steps = p.max_steps
            step = p.step or 0
            if step >= 1 and seen.first_at is None:
                seen.first_at, seen.first_step = now, step
            seen.step = max(seen.step, step)
        self._slots = max(self._slots, len(snap.running))
        return self._eta(snap, now)

    def _eta(self, snap: Snapshot, now: float) -> Optional[float]:
        estimates = [s.duration(now) for s in self._seen.values()]
        walls = self._walls or [d for d in estimates if d is not None]
        per_point = sum(walls) / len(walls) if walls else None
        busy = []
        for seen in self._seen.values():
            left = seen.remaining(now)
            if left is None and self._walls and per_point is not None:  # per_point is the walls' mean
                left = max(0.0, per_point - (now - seen.started))
            if left is None:
                return None
            busy.append(left)
        queued = max(0, snap.total - snap.done - snap.failed - len(self._seen))
        slots = sorted(busy + [0.0] * max(0, self._slots - len(busy)))
        if queued:
            if per_point is None:
                return None
            for _ in range(queued):  # each queued point takes the slot that frees first
                slots[0] += per_point
                slots.sort()
        return max(slots) if slots else 0.0


def render(snap: Snapshot, elapsed: float, eta: Optional[float]) -> str:
    """``[sweep smoke] 1/3 points done, 0 failed | loss=fp32 step 7/20 | 01:12 elapsed, ETA 02:30``; with several
    points running, ``| 3 running |`` and then one indented line per point."""
    line = f"[{snap.label}] {snap.done}/{snap.total} points done, {snap.failed} failed"
    if len(snap.running) == 1:
        line += f" | {_point(snap.running[0])}"
    elif snap.running:
        line += f" | {len(snap.running)} running"
    line += f" | {_clock(elapsed)} elapsed, ETA {_clock(eta)}"
    if len(snap.running) > 1:
        line += "".join(f"\n    {_point(p)}" for p in snap.running)
    return line


def _point(p: Running) -> str:
    return f"{p.name or '(no overrides)'} step {p.step or 0}/{p.max_steps or '?'}"


class ProgressDisplay:
    """Shows :class:`Snapshot` updates; ``close()`` leaves the last lines on screen.

    Args:
        stream: where to draw (stderr).
        live: redraw in place (default: when ``stream`` is a terminal).
        plain_every_s: without ``live``, the most seconds between two lines when nothing but steps changed.
        clock: the monotonic clock (tests pin it).
    """

    def __init__(
        self,
        stream: Optional[TextIO] = None,
        live: Optional[bool] = None,
        plain_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.plain_every_s = plain_every_s
        self.clock = clock
        self.started = clock()
        self.eta = EtaClock()
        self._last_key: Optional[tuple] = None
        self._last_plain = 0.0
        self._live: Optional[Live] = None

    def _ensure_live(self) -> Live:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            live = Live("", console=Console(file=self.stream), refresh_per_second=4, transient=False)
            live.start()
            self._live = live
        return self._live

    def text(self, snap: Snapshot) -> str:
        """What :meth:`update` shows for ``snap`` now (the ETA clock takes the snapshot in)."""
        now = self.clock()
        return render(snap, now - self.started, self.eta.observe(snap, now))

    def update(self, snap: Snapshot) -> None:
        text = self.text(snap)
        if self.live:
            from rich.text import Text

            self._ensure_live().update(Text(text))
            return
        key = (snap.done, snap.failed, tuple(p.name for p in snap.running))
        now = self.clock()
        if key != self._last_key or now - self._last_plain >= self.plain_every_s:
            print(text, file=self.stream, flush=True)
            self._last_key, self._last_plain = key, now

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


__all__ = ["Running", "Snapshot", "EtaClock", "ProgressDisplay", "render"]
