"""The progress display: what it says, an ETA from training steps only that knows about parallel points, and that a
log (not a terminal) stays short. Every ETA below is worked out by hand from the pinned clock."""

import io

from gkd_harness.harness.launcher.progress import EtaClock, ProgressDisplay, Running, Snapshot, render


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def one(step, max_steps=20, name="loss=fp32", total=1, done=0, failed=0, label="run x"):
    return Snapshot(label=label, total=total, done=done, failed=failed, running=(Running(name, step, max_steps),))


def test_render_names_points_step_elapsed_and_eta():
    snap = Snapshot(label="sweep smoke", total=3, done=1, failed=0, running=(Running("loss=fp32", 10, 20),))
    assert render(snap, 90.0, 90.0) == (
        "[sweep smoke] 1/3 points done, 0 failed | loss=fp32 step 10/20 | 01:30 elapsed, ETA 01:30"
    )
    assert "ETA --:--" in render(snap, 10.0, None)


def test_eta_starts_from_the_first_training_step():
    """A 300 s start-up (model loading) is not extrapolated over the steps: before, step 1/20 after 300 s read
    300 / (1/20) * (19/20) = 5700 s (1:35:00); now the ETA is unknown until a second step is seen, then it is the
    remaining steps at the pace measured since the first one: (20 - 2) steps x 10 s = 180 s."""
    eta = EtaClock()
    assert eta.observe(one(0), 0.0) is None
    assert eta.observe(one(0), 290.0) is None
    assert eta.observe(one(1), 300.0) is None
    assert eta.observe(one(2), 310.0) == 180.0
    assert eta.observe(one(5), 340.0) == 150.0


def test_parallel_points_are_each_shown():
    """submitit_local starts every point at once; before, only the first running point was shown."""
    names = [f"loss=fp32,run.seed={s}" for s in range(1, 7)]
    snap = Snapshot(
        label="sweep outcome",
        total=6,
        done=0,
        failed=0,
        running=tuple(Running(n, 3 + i, 200) for i, n in enumerate(names)),
    )
    lines = render(snap, 300.0, 640.0).splitlines()
    assert lines[0] == "[sweep outcome] 0/6 points done, 0 failed | 6 running | 05:00 elapsed, ETA 10:40"
    assert lines[1:] == [f"    {n} step {3 + i}/200" for i, n in enumerate(names)]


def test_eta_of_parallel_points_is_not_their_sum():
    """6 points running at once, each at 10 s/step: the sweep ends when the slowest does (before: the ETA assumed
    the points run one after another, 3:47:02 for a sweep that finished in 10:40)."""
    eta = EtaClock()
    names = [f"p{i}" for i in range(6)]

    def snap(steps):
        return Snapshot(
            label="s", total=6, done=0, failed=0, running=tuple(Running(n, s, 20) for n, s in zip(names, steps))
        )

    assert eta.observe(snap([0] * 6), 0.0) is None
    assert eta.observe(snap([1] * 6), 60.0) is None
    assert eta.observe(snap([2, 2, 2, 2, 2, 3]), 70.0) == 180.0  # p0..p4: 18 steps x 10 s; p5: 17 x 5 s


def test_queued_points_are_scheduled_over_the_slots_seen():
    """2 slots, 4 points: 2 running at 10 s/step after a 50 s start-up, 2 queued. Each queued point costs the
    running points' estimated wall time, 50 s + 19 steps x 10 s = 240 s, after a slot frees (at step 10: 100 s)."""
    eta = EtaClock()

    def snap(step):
        return Snapshot(label="s", total=4, done=0, failed=0, running=(Running("a", step, 20), Running("b", step, 20)))

    eta.observe(snap(0), 0.0)
    eta.observe(snap(1), 50.0)
    assert eta.observe(snap(10), 140.0) == 100.0 + 240.0


def test_one_slot_runs_the_queued_points_one_after_another():
    """Hydra's basic launcher: one point at a time; the two queued points take 240 s each after the running one."""
    eta = EtaClock()
    eta.observe(one(0, total=3), 0.0)
    eta.observe(one(1, total=3), 50.0)
    assert eta.observe(one(10, total=3), 140.0) == 100.0 + 2 * 240.0


def test_a_finished_point_gives_the_next_ones_their_estimate():
    """Once a point was watched from start to end (300 s), a new point's ETA is that wall time minus its age,
    before it has logged any step of its own."""
    eta = EtaClock()
    eta.observe(one(0, name="a", total=2), 0.0)
    eta.observe(one(1, name="a", total=2), 100.0)
    eta.observe(one(10, name="a", total=2), 190.0)
    assert eta.observe(Snapshot(label="s", total=2, done=1, failed=0, running=(Running("b", 0, 20),)), 300.0) == 300.0
    assert eta.observe(Snapshot(label="s", total=2, done=1, failed=0, running=(Running("b", 0, 20),)), 360.0) == 240.0


def test_display_uses_the_step_clock():
    out, clock = io.StringIO(), Clock()
    display = ProgressDisplay(stream=out, live=False, plain_every_s=0, clock=clock)
    for t, step in ((0, 0), (300, 1), (310, 2)):
        clock.t = t
        display.update(one(step))
    lines = out.getvalue().splitlines()
    assert lines == [
        "[run x] 0/1 points done, 0 failed | loss=fp32 step 0/20 | 00:00 elapsed, ETA --:--",
        "[run x] 0/1 points done, 0 failed | loss=fp32 step 1/20 | 05:00 elapsed, ETA --:--",
        "[run x] 0/1 points done, 0 failed | loss=fp32 step 2/20 | 05:10 elapsed, ETA 03:00",
    ]


def test_plain_stream_prints_only_on_changes():
    out = io.StringIO()
    display = ProgressDisplay(stream=out, live=False, plain_every_s=3600)
    for step in range(1, 21):
        display.update(one(step, name="a", total=2, label="s"))
    display.update(one(1, name="b", total=2, done=1, label="s"))
    display.update(Snapshot(label="s", total=2, done=1, failed=1))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[-1].startswith("[s] 1/2 points done, 1 failed |")


def test_live_display_redraws_in_place():
    out = io.StringIO()
    display = ProgressDisplay(stream=out, live=True)
    for step in range(5):
        display.update(one(step, max_steps=5, name="a", label="s"))
    display.close()
    assert "step 4/5" in out.getvalue() and "[s] 0/1 points done" in out.getvalue()
