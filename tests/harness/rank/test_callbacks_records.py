"""The writer rank's records (issue 41 item 8): ``metrics.jsonl`` gets every logging step's line at once, fsync
and ``summary.json`` run on a clock or at status changes, not every step, and nothing logged is lost when the
run stops or its process dies."""

import json
import os
import signal
import subprocess
import sys
import types

import pytest
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.rank import callbacks, plugin
from gkd_harness.harness.rank.callbacks import _make_hf_callback
from tests.harness.rank.test_plugin import inputs, restore_swift, settings  # noqa: F401 - fixture


def _log(cb, step, **extra):
    state = types.SimpleNamespace(global_step=step, is_world_process_zero=True)
    cb.on_log(None, state, None, logs={"loss": 0.1 * step, "grad_norm": 1.0, "learning_rate": 1e-5, **extra})


@pytest.fixture
def counted_fsyncs(monkeypatch):
    calls = []
    real = os.fsync

    def counting(fd):
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_fifty_logging_steps_write_fifty_lines_but_sync_on_a_clock(tmp_path, restore_swift, counted_fsyncs):  # noqa: F811
    """Before: each logging step appended with an fsync and rewrote summary.json with another (100 fsyncs for
    50 steps). Now every line is in the file at once, and fsync / the summary wait for the clock or train end."""
    state = plugin.install(settings(tmp_path, monitor=False))
    s, t, labels = inputs()
    state.boundary(s, TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)  # the dtypes are seen
    cb = _make_hf_callback()(types.SimpleNamespace(), types.SimpleNamespace())
    summary_path = tmp_path / "summary.json"
    summary_before = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for step in range(1, 51):
        _log(cb, step)
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["step"] == step and len(lines) == step  # in the file at once
    assert len(counted_fsyncs) <= 2, counted_fsyncs  # 1: the first step's dtypes (a status change)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dtypes_seen"] and summary.get("last_step", 0) < 50  # dtypes at once, last step on the clock
    assert summary_before.get("dtypes_seen") != summary["dtypes_seen"]
    cb.on_train_end(None, types.SimpleNamespace(global_step=50, is_world_process_zero=True), None)
    assert json.loads((tmp_path / "summary.json").read_text())["last_step"] == 50
    assert counted_fsyncs  # train end synced


def test_the_clock_writes_the_summary_and_syncs(tmp_path, restore_swift, counted_fsyncs, monkeypatch):  # noqa: F811
    plugin.install(settings(tmp_path, monitor=False))
    cb = _make_hf_callback()(types.SimpleNamespace(), types.SimpleNamespace())
    _log(cb, 1)
    rec = callbacks.recorder()
    monkeypatch.setattr(rec, "interval_s", 0.0)
    monkeypatch.setattr(rec.metrics, "sync_interval_s", 0.0)
    _log(cb, 2)
    assert json.loads((tmp_path / "summary.json").read_text())["last_step"] == 2
    assert rec.metrics.syncs >= 1 and rec.summary_writes >= 1


def test_a_nonfinite_stop_writes_the_buffered_summary_first(tmp_path, restore_swift):  # noqa: F811
    from gkd_harness.harness.rank.instrument import NonFiniteError

    plugin.install(settings(tmp_path))
    cb = _make_hf_callback()(types.SimpleNamespace(), types.SimpleNamespace())
    for step in range(1, 4):
        _log(cb, step)
    with pytest.raises(NonFiniteError):
        _log(cb, 4, loss=float("nan"))
    assert json.loads((tmp_path / "summary.json").read_text())["last_step"] == 4


KILLED = r"""
import os, signal, sys, types
sys.path.insert(0, sys.argv[2])
from tests.harness.rank.test_plugin import settings
from pathlib import Path
from gkd_harness.harness.rank import plugin
from gkd_harness.harness.rank.callbacks import _make_hf_callback
plugin.install(settings(Path(sys.argv[1]), monitor=False))
cb = _make_hf_callback()(types.SimpleNamespace(), types.SimpleNamespace())
for step in range(1, 8):
    cb.on_log(None, types.SimpleNamespace(global_step=step, is_world_process_zero=True), None, logs={"loss": 0.5})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_killed_between_syncs_loses_no_logged_line(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), repo], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 8))
