"""metrics.jsonl as the harness writes and reads it (issue 32): ``step`` is an integer on the way in, and only
lines whose ``step`` is an integer count on the way out. Before the fix ``{"step": "2"}`` was written as given, and
``last_metrics_step`` / ``tail_step`` read a string step as a number."""

from __future__ import annotations

import json

import pytest

from gkd_harness.harness.store.metrics_io import MetricsWriter, last_metrics_step, read_metrics, record_step, tail_step


@pytest.mark.parametrize("step", ["2", 2.0, True, None])
def test_a_record_whose_step_is_not_an_integer_is_refused_before_anything_is_written(tmp_path, step):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    writer.write({"step": 1, "train/loss": 1.0})
    with pytest.raises(TypeError, match="integer 'step'"):
        writer.write({"step": step, "train/loss": 0.5})
    assert path.read_text() == json.dumps({"step": 1, "train/loss": 1.0}) + "\n"


def test_readers_count_only_integer_steps(tmp_path):
    """A hand-edited or foreign line (``"step": "7"``) is not a step: last_step is the last integer line's."""
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"step": 3, "train/loss": 1.0})
    with path.open("a") as f:
        f.write(json.dumps({"step": "7", "train/loss": 0.5}) + "\n")
        f.write(json.dumps({"step": 8.0}) + "\n")
        f.write('{"step": 9, "train/lo')  # a torn tail
    assert last_metrics_step(path) == 3 and tail_step(path) == 3
    assert [r["step"] for r in read_metrics(path)] == [3, "7", 8.0]  # read as stored; judged by the readers
    assert [record_step(r) for r in read_metrics(path)] == [3, None, None]
    assert last_metrics_step(tmp_path / "absent.jsonl") == 0


def test_metrics_stream_is_line_per_step_and_survives_a_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"step": 1, "gkd/neg_loss_calls": 0.0})
    with open(path, "a") as f:
        f.write('{"step": 2, "gkd/neg')  # what a SIGKILL mid-write could leave
    assert read_metrics(path) == [{"step": 1, "gkd/neg_loss_calls": 0.0}]


def test_metrics_keep_nan_and_inf_as_themselves(tmp_path):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"step": 1, "train/grad_norm": float("nan"), "spot/loss": float("inf")})
    [row] = read_metrics(path)
    assert row["train/grad_norm"] != row["train/grad_norm"] and row["spot/loss"] == float("inf")
