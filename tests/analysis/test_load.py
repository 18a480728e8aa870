"""Loading run folders into the runs/history tables; bad input is UnusableInput naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gkd_harness.analysis.load import CONFIG_COLUMNS, UnusableInput, load_run_folder, load_sweep
from gkd_harness.analysis.sweep.metrics import read_metrics_file
from gkd_harness.bench.synthetic import write_run


def test_runs_table_has_config_columns_and_one_row_per_run(synthetic_sweep_dir):
    sw = load_sweep(synthetic_sweep_dir)
    assert len(sw.runs) == 16 and sw.runs["run"].is_unique
    for col in CONFIG_COLUMNS + ("dtype.student", "dtype.teacher", "outcome", "status", "variant"):
        assert col in sw.runs.columns, col
    assert set(sw.runs["loss.precision"]) == {"native", "fp32"}
    assert set(sw.runs["loss.beta_form"]) == {"paper", "continuous"}
    assert sw.runs["mixed_dtypes"].all()  # FP32 student, BF16 teacher
    assert (sw.runs["outcome"] == "completed").all()
    assert len(sw.history) == 16 * 12
    # values round-trip exactly from the files
    run = sw.runs["run"].iloc[0]
    lines = [json.loads(x) for x in (synthetic_sweep_dir / run / "metrics.jsonl").read_text().splitlines()]
    h = sw.run_history(run)
    assert [r["train/loss"] for r in lines] == h["train/loss"].tolist()
    spot = [r.get("spot/grad_rel_l2", np.nan) for r in lines]
    np.testing.assert_array_equal(np.array(spot, dtype=float), h["spot/grad_rel_l2"].to_numpy())


def test_typed_and_fallback_paths_agree(synthetic_sweep_dir, tmp_path):
    """A line the typed decoder refuses (here: a NaN token on every line) takes the json.loads path; both give the
    same columns."""
    path = next(synthetic_sweep_dir.glob("*/metrics.jsonl"))
    typed = read_metrics_file(path, completed=True)
    slow_path = tmp_path / "metrics.jsonl"
    slow_path.write_text(
        "".join(json.dumps({**json.loads(x), "x": float("nan")}) + "\n" for x in path.read_text().splitlines())
    )
    slow = read_metrics_file(slow_path, completed=True)
    assert typed.unusable is None and slow.unusable is None and not typed.tampered and not slow.tampered
    assert typed.nonfinite == [] and [(s, m) for s, m, _ in slow.nonfinite] == [(s, "x") for s in typed.steps]
    np.testing.assert_array_equal(typed.steps, slow.steps)
    assert sorted(slow.columns) == sorted([*typed.columns, "x"])
    for k, col in typed.columns.items():
        np.testing.assert_array_equal(col, slow.columns[k], err_msg=k)


def test_nonfinite_values_are_listed_and_missing_keys_are_not(tmp_path):
    """A NaN/Inf logged by Python (``NaN``, ``Infinity`` tokens) is listed, a missing key is not; the tables keep
    both as NaN in the history and list the logged ones in ``nonfinite``."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "a": 1.0, "b": float("nan")}, {"step": 2, "a": float("inf")}, {"step": 3, "b": -float("inf")}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = read_metrics_file(path, completed=True)
    df = t.frame()
    assert np.isnan(df.loc[0, "b"]) and np.isinf(df.loc[1, "a"]) and np.isnan(df.loc[1, "b"])
    expected = [(1, "b", "nan"), (2, "a", "inf"), (3, "b", "-inf")]
    assert sorted((s, m, repr(v)) for s, m, v in t.nonfinite) == expected
    from gkd_harness.analysis.sweep.records import RunRecord, tabulate

    for history, listed in ((t, []), (df, t.nonfinite), (rows, [])):
        sw = tabulate([RunRecord("r", "completed", {}, history, nonfinite=listed)], "t")
        assert (
            sorted((s, m, repr(v)) for s, m, v in sw.nonfinite[["step", "metric", "value"]].itertuples(index=False))
            == expected
        )


def test_failed_and_incomplete_runs_are_kept_and_marked(tmp_path):
    write_run(tmp_path / "ok", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=6, spot_every=2)
    write_run(tmp_path / "dead", beta=0.5, beta_form="paper", precision="fp32", seed=1, steps=6, status="failed")
    write_run(tmp_path / "running", beta=0.5, beta_form="paper", precision="fp32", seed=2, steps=6, status="running")
    # a run that says completed but stopped short of run.max_steps
    short = write_run(tmp_path / "short", beta=0.5, beta_form="paper", precision="fp32", seed=3, steps=6)
    s = json.loads((short / "summary.json").read_text())
    s["last_step"] = 3
    (short / "summary.json").write_text(json.dumps(s))
    runs = load_sweep(tmp_path).runs.set_index("run")
    assert runs.loc["ok", "outcome"] == "completed"
    assert runs.loc["dead", "outcome"] == "failed" and "synthetic failure" in runs.loc["dead", "error"]
    assert runs.loc["running", "outcome"] == "incomplete"
    assert runs.loc["short", "outcome"] == "incomplete" and "max_steps" in runs.loc["short", "problems"]


def test_truncated_last_line_tolerated_only_when_not_completed(tmp_path):
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=4, status="running")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "train/lo')  # what a killed writer leaves
    sw = load_sweep(tmp_path)
    assert sw.run_history("r").index.tolist() == [1, 2]
    assert "truncated" in sw.runs["problems"].iloc[0]
    s = json.loads((run / "summary.json").read_text())
    s["status"] = "completed"
    (run / "summary.json").write_text(json.dumps(s))
    with pytest.raises(UnusableInput, match=r"metrics.jsonl:3: not valid JSON"):
        load_run_folder(run)


def test_nan_written_by_python_is_read(tmp_path):
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "train/loss": float("nan"), "train/grad_norm": float("inf")}) + "\n")
    h = load_sweep(tmp_path).run_history("r")
    assert h.index.tolist() == [1, 2, 3]
    assert np.isnan(h.loc[3, "train/loss"]) and np.isinf(h.loc[3, "train/grad_norm"])


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no_summary", r"summary.json missing"),
        ("bad_summary", r"summary.json: not valid JSON"),
        ("bad_status", r"'status' must be running\|completed\|failed"),
        ("bad_line", r"metrics.jsonl:2: not valid JSON"),
        ("no_step", r"metrics.jsonl:1: metrics line has no 'step'"),
        ("no_metrics_completed", r"metrics.jsonl missing although summary.json says completed"),
    ],
)
def test_corrupt_run_folder_is_unusable(sweep_copy, damage, message):
    run = sorted(p for p in sweep_copy.iterdir())[3]
    m, s = run / "metrics.jsonl", run / "summary.json"
    lines = m.read_text().splitlines()
    if damage == "no_summary":
        s.unlink()
    elif damage == "bad_summary":
        s.write_text("{not json")
    elif damage == "bad_status":
        s.write_text(json.dumps(dict(json.loads(s.read_text()), status="done")))
    elif damage == "bad_line":
        m.write_text("\n".join([lines[0], "{oops", *lines[2:]]) + "\n")
    elif damage == "no_step":
        first = json.loads(lines[0])
        del first["step"]
        m.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    elif damage == "no_metrics_completed":
        m.unlink()
    with pytest.raises(UnusableInput, match=message) as e:
        load_sweep(sweep_copy)
    assert run.name in str(e.value)


def test_missing_or_empty_sweep_is_unusable(tmp_path):
    with pytest.raises(UnusableInput, match="does not exist"):
        load_sweep(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnusableInput, match="no run folders"):
        load_sweep(tmp_path / "empty")


def test_point_that_failed_before_summary_counts_as_failed(tmp_path):
    """gkd_harness.launch.sweep's Hydra callback leaves .hydra/job_return.json for a point that died at start-up."""
    write_run(tmp_path / "ok", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=3)
    bad = tmp_path / "gkd.beta=2"
    (bad / ".hydra").mkdir(parents=True)
    (bad / ".hydra" / "job_return.json").write_text(
        json.dumps({"status": "FAILED", "error": "ValueError: gkd.beta must lie in [0, 1]"})
    )
    runs = load_sweep(tmp_path).runs.set_index("run")
    assert runs.loc["gkd.beta=2", "outcome"] == "failed"
    assert "gkd.beta" in runs.loc["gkd.beta=2", "error"]
