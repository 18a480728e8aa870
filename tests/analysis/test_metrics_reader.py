"""The metrics reader (gkd_harness.analysis.sweep.metrics) and what the loaded tables make of it.

- evaluation records (``eval/*``, as gkd_harness.harness.rank.callbacks writes them at a training step) are counted apart from
  training steps: no duplicate-step problem for them, while a training step logged twice is still reported
  (issue 29, reproduction 3);
- typed records: a ``step`` that is not an integer, or a contract metric holding a string or a bool, is a tampered
  record; the run's outcome is ``tampered`` and ``no_failed_runs`` fails (issue 32, item 6);
- the columns equal an independent ``json.loads`` of every line, NaN/±Inf included.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gkd_harness.analysis.load import UnusableInput, load_sweep
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import (
    EVAL_FORWARD_KL,
    EVAL_JSD,
    EVAL_REVERSE_KL,
    EVAL_TOKENS,
    EVAL_TOP1_AGREEMENT,
    METRICS_FILE,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
)


def _eval_record(step: int, jsd: float) -> dict:
    """One held-out evaluation record as design_record writes it (the contract's eval/* names and the step)."""
    return {
        EVAL_JSD: jsd,
        EVAL_FORWARD_KL: 2 * jsd,
        EVAL_REVERSE_KL: 3 * jsd,
        EVAL_TOP1_AGREEMENT: 0.5,
        EVAL_TOKENS: 64.0,
        "step": step,
    }


def _with_evals(run, every: int) -> list:
    """Insert an evaluation record after every ``every``-th training line (same step), as experiment=outcome logs."""
    lines = (run / METRICS_FILE).read_text().splitlines()
    out, evals = [], []
    for line in lines:
        out.append(line)
        step = json.loads(line)["step"]
        if step % every == 0:
            evals.append(_eval_record(step, 0.01 * step))
            out.append(json.dumps(evals[-1]))
    (run / METRICS_FILE).write_text("\n".join(out) + "\n")
    return evals


def test_evaluation_records_are_counted_apart_from_training_steps(tmp_path):
    """Reproduction 3: eval records at steps 10 and 20 of a 20-step run are no duplicated steps."""
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=20, spot_every=5)
    evals = _with_evals(run, every=10)
    sw = load_sweep(tmp_path)
    row = sw.runs.iloc[0]
    assert "duplicate" not in row["problems"], row["problems"]
    assert row["outcome"] == "completed"
    assert (row["n_planned"], row["n_logged"], row["n_evals"]) == (20, 20, 2)
    # the evaluation table holds the records as written; the history keeps them at their step
    ev = sw.evals[sw.evals["run"] == "r"].set_index("step")
    assert ev.index.tolist() == [10, 20]
    for rec in evals:
        for k, v in rec.items():
            if k != "step":
                assert ev.loc[rec["step"], k] == v, k
    h = sw.run_history("r")
    assert h.index.tolist() == list(range(1, 21))
    assert h.loc[10, EVAL_JSD] == evals[0][EVAL_JSD] and math.isnan(h.loc[9, EVAL_JSD])
    train = [json.loads(x) for x in (run / METRICS_FILE).read_text().splitlines() if TRAIN_LOSS in x]
    assert h[TRAIN_LOSS].tolist() == [r[TRAIN_LOSS] for r in train]


def test_a_duplicated_training_step_is_still_reported(tmp_path):
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=20, spot_every=5)
    _with_evals(run, every=10)
    lines = (run / METRICS_FILE).read_text().splitlines()
    seventh = next(x for x in lines if json.loads(x)["step"] == 7 and TRAIN_LOSS in x)
    (run / METRICS_FILE).write_text("\n".join(lines + [seventh]) + "\n")
    row = load_sweep(tmp_path).runs.iloc[0]
    assert "duplicate logged steps" in row["problems"] and "step 7 x2" in row["problems"]
    assert "step 10" not in row["problems"] and "step 20" not in row["problems"]
    assert (row["n_logged"], row["n_evals"]) == (20, 2)


def test_an_evaluation_logged_twice_at_one_step_is_reported_as_such(tmp_path):
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=10, spot_every=5)
    _with_evals(run, every=10)
    with open(run / METRICS_FILE, "a") as f:
        f.write(json.dumps(_eval_record(10, 0.5)) + "\n")
    row = load_sweep(tmp_path).runs.iloc[0]
    assert "duplicate evaluation records: step 10 x2" in row["problems"]
    assert "duplicate logged steps" not in row["problems"]


def _tamper(tmp_path, line_no: int, **changes):
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=6, spot_every=3)
    write_run(tmp_path / "ok", beta=0.5, beta_form="paper", precision="fp32", seed=1, steps=6, spot_every=3)
    lines = (run / METRICS_FILE).read_text().splitlines()
    lines[line_no - 1] = json.dumps({**json.loads(lines[line_no - 1]), **changes})
    (run / METRICS_FILE).write_text("\n".join(lines) + "\n")
    return load_sweep(tmp_path)


@pytest.mark.parametrize(
    "changes, why",
    [
        ({"step": "2"}, "line 2: 'step' must be an integer, got '2' (str)"),
        ({"step": 2.0}, "line 2: 'step' must be an integer, got 2.0 (float)"),
        ({"step": 1.5}, "line 2: 'step' must be an integer, got 1.5 (float)"),
        ({"step": True}, "line 2: 'step' must be an integer, got True (bool)"),
        ({TRAIN_LOSS: "0.5"}, "line 2: 'train/loss' must be a number, got '0.5' (str)"),
        ({TRAIN_GRAD_NORM: False}, "line 2: 'train/grad_norm' must be a number, got False (bool)"),
        ({EVAL_JSD: [0.1]}, "line 2: 'eval/jsd' must be a number, got [0.1] (list)"),
    ],
)
def test_a_record_of_the_wrong_type_is_a_tampered_record(tmp_path, changes, why):
    """Issue 32 item 6: the run is ``tampered`` (never completed) and the sign-off's no_failed_runs fails."""
    from gkd_harness.analysis.signoff.criteria import evaluate
    from gkd_harness.analysis.signoff.criteria_file import load_criteria

    sw = _tamper(tmp_path, 2, **changes)
    runs = sw.runs.set_index("run")
    assert runs.loc["r", "outcome"] == "tampered"
    assert f"tampered records in metrics.jsonl (left out): {why}" in runs.loc["r", "problems"]
    assert runs.loc["ok", "outcome"] == "completed"
    # the tampered line is left out; the others are read
    assert sw.run_history("r").index.tolist() == [1, 3, 4, 5, 6]
    _, results = evaluate(sw, load_criteria())
    nfr = next(r for r in results if r.name == "no_failed_runs")
    assert nfr.status == "fail"
    assert any(d.startswith("r: tampered") for d in nfr.details), nfr.details


def test_a_key_outside_the_contract_with_a_string_is_dropped_not_tampered(tmp_path):
    sw = _tamper(tmp_path, 2, note="hello")
    row = sw.runs.set_index("run").loc["r"]
    assert row["outcome"] == "completed"
    assert "keys outside the contract ignored: note (str)" in row["problems"]
    assert "note" not in sw.history.columns


def test_columns_equal_json_loads_of_every_line(tmp_path):
    """An independent reference: json.loads per line, NaN/Inf written by Python's json included."""
    from gkd_harness.analysis.sweep.metrics import read_metrics_file

    run = write_run(tmp_path / "r", beta=0.9, beta_form="paper", precision="native", seed=3, steps=40, spot_every=7)
    with open(run / METRICS_FILE, "a") as f:
        f.write(json.dumps({"step": 41, TRAIN_LOSS: float("nan"), TRAIN_GRAD_NORM: float("inf")}) + "\n")
        f.write(json.dumps(_eval_record(41, 0.25)) + "\n")
    ref = [json.loads(x) for x in (run / METRICS_FILE).read_text().splitlines()]
    t = read_metrics_file(run / METRICS_FILE, completed=True)
    assert t.unusable is None and not t.tampered and not t.problems
    assert t.steps.tolist() == [r["step"] for r in ref]
    assert t.evaluation.tolist() == [EVAL_JSD in r for r in ref]
    keys = sorted({k for r in ref for k in r} - {"step"})
    assert sorted(t.columns) == keys
    for k in keys:
        expect = np.array([r.get(k, np.nan) for r in ref], dtype=float)
        np.testing.assert_array_equal(t.columns[k], expect, err_msg=k)
    assert t.nonfinite == [(41, TRAIN_LOSS, t.nonfinite[0][2]), (41, TRAIN_GRAD_NORM, math.inf)]
    assert math.isnan(t.nonfinite[0][2])


def test_unreadable_lines_still_make_the_folder_unusable(tmp_path):
    run = write_run(tmp_path / "r", beta=0.5, beta_form="paper", precision="fp32", seed=0, steps=4)
    lines = (run / METRICS_FILE).read_text().splitlines()
    (run / METRICS_FILE).write_text("\n".join([lines[0], "[1, 2]", *lines[2:]]) + "\n")
    with pytest.raises(UnusableInput, match=r"metrics.jsonl:2: expected a JSON object per line, got list"):
        load_sweep(tmp_path)


def test_wandb_rows_keep_evaluation_apart_too():
    """A wandb history (HF's integration writes ``eval/loss`` with ``train/global_step`` and ``train/epoch``) gives
    the same counts as a run folder: the evaluation at step 2 is no duplicate of training step 2."""
    from gkd_harness.analysis.sweep.records import RunRecord, tabulate

    rows = [
        {"step": 1, TRAIN_LOSS: 0.5},
        {"step": 2, TRAIN_LOSS: 0.4},
        {"step": 2, EVAL_JSD: 0.1, "eval/loss": 0.3, "train/global_step": 2, "train/epoch": 0.5},
    ]
    sw = tabulate([RunRecord("w", "completed", {"run.max_steps": 2}, rows)], "t")
    row = sw.runs.iloc[0]
    assert "duplicate" not in row["problems"] and row["outcome"] == "completed"
    assert (row["n_planned"], row["n_logged"], row["n_evals"]) == (2, 2, 1)
    assert sw.evals[["step", EVAL_JSD]].values.tolist() == [[2, 0.1]]
    assert sw.run_history("w").loc[2, [TRAIN_LOSS, EVAL_JSD]].tolist() == [0.4, 0.1]
