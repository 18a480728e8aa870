"""The progress display: what it says, and that a log (not a terminal) stays short."""
import io

from harness.launcher.progress import ProgressDisplay, Snapshot, eta_seconds, render


def test_render_names_points_step_elapsed_and_eta():
    snap = Snapshot(label="sweep smoke", total=3, done=1, failed=0, running="loss=fp32", step=10, max_steps=20)
    # 1.5 of 3 points took 90 s -> 90 s to go
    assert eta_seconds(snap, 90.0) == 90.0
    assert render(snap, 90.0) == ("[sweep smoke] 1/3 points done, 0 failed | loss=fp32 step 10/20 | "
                                  "01:30 elapsed, ETA 01:30")


def test_eta_unknown_before_any_progress():
    snap = Snapshot(label="x", total=2, done=0, failed=0, running="a", step=0, max_steps=5)
    assert eta_seconds(snap, 10.0) is None and "ETA --:--" in render(snap, 10.0)


def test_plain_stream_prints_only_on_changes():
    out = io.StringIO()
    display = ProgressDisplay(stream=out, live=False, plain_every_s=3600)
    for step in range(1, 21):
        display.update(Snapshot(label="s", total=2, done=0, failed=0, running="a", step=step, max_steps=20))
    display.update(Snapshot(label="s", total=2, done=1, failed=0, running="b", step=1, max_steps=20))
    display.update(Snapshot(label="s", total=2, done=1, failed=1, running=None))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[-1].startswith("[s] 1/2 points done, 1 failed |")


def test_live_display_redraws_one_line():
    out = io.StringIO()
    display = ProgressDisplay(stream=out, live=True)
    for step in range(5):
        display.update(Snapshot(label="s", total=1, done=0, failed=0, running="a", step=step, max_steps=5))
    display.close()
    assert "step 4/5" in out.getvalue()
