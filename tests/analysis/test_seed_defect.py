"""The seed defect table (native / fp32 / fp64 on the seed report's synthetic input) is in every sign-off report,
captures or not, and its numbers are ``gkd-replay synthetic``'s, checked against the independent FP64 reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gkd_harness.analysis.cli import main as analyze
from gkd_harness.analysis.replay.cli import main as replay
from gkd_harness.analysis.replay.variants import synthetic_inputs
from gkd_harness.analysis.signoff.seed_defect import seed_defect_table
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import GRAD_REL_L2_FP32_STUDENT

SEED_FP64 = 7.975079402659209e-05  # report 000's FP64 value for its recipe (CUDA; FP64 agrees across devices)


def _rows(records, student="float32", teacher="bfloat16") -> dict:
    return {r["variant"]: r for r in records if r["student_dtype"] == student and r["teacher_dtype"] == teacher}


def _reference_loss(student_dtype: str, teacher_dtype: str) -> float:
    s, t, labels = synthetic_inputs(student_dtype=student_dtype, teacher_dtype=teacher_dtype)
    total, n, _ = reference_gkd(s, labels, 0.5, 0.9, "paper", teacher_full=t.full_logits)
    return total / n


def _set_dtypes(run: Path, student: str, teacher: str) -> None:
    p = run / "summary.json"
    summary = json.loads(p.read_text())
    summary["dtypes_seen"] = {"student": student, "teacher": teacher}
    p.write_text(json.dumps(summary))


def test_report_without_captures_has_the_seed_table(sweep_copy, tmp_path, capsys):
    assert not list(sweep_copy.rglob("*.safetensors"))  # the synthetic sweep has no captures
    run = sorted(p for p in sweep_copy.iterdir() if (p / "summary.json").exists())[0]
    _set_dtypes(run, "bfloat16", "bfloat16")  # one run saw BF16/BF16 at the loss: its own rows follow
    report = tmp_path / "report"
    analyze([str(sweep_copy), "--report", str(report)])
    capsys.readouterr()
    v = json.loads((report / "verdict.json").read_text())
    assert v["replay"] is None
    seed = _rows(v["seed_defect"])
    assert set(seed) == {"native", "fp32", "fp64"}
    assert seed["fp64"]["loss"] == pytest.approx(SEED_FP64, rel=1e-9)
    assert seed["fp64"]["loss"] == pytest.approx(_reference_loss("float32", "bfloat16"), rel=1e-9)
    assert seed["native"]["loss"] < 0 and seed["native"]["negative"]
    assert seed["native"]["grad_rel_l2"] > 0.05  # the seed's 20-30 % gradient error
    assert seed["fp32"]["loss"] > 0 and seed["fp32"]["grad_rel_l2"] <= GRAD_REL_L2_FP32_STUDENT
    bf16 = _rows(v["seed_defect"], "bfloat16", "bfloat16")
    assert set(bf16) == {"native", "fp32", "fp64"}
    assert bf16["fp64"]["loss"] == pytest.approx(_reference_loss("bfloat16", "bfloat16"), rel=1e-9)
    assert bf16["native"]["loss"] < 0
    assert bf16["native"]["command"] == "gkd-replay synthetic --student-dtype bfloat16 --teacher-dtype bfloat16"
    md, html = (report / "report.md").read_text(), (report / "report.html").read_text()
    for text in (md, html):
        assert "Seed defect table" in text and "gkd-replay synthetic" in text
    section = md.split("Seed defect table", 2)[2].split("\n## ", 1)[0]  # past the contents entry
    assert "native" in section and "fp64" in section and "No captures" not in section


@pytest.mark.parametrize("pair", [("float32", "bfloat16"), ("bfloat16", "bfloat16")])
def test_table_equals_gkd_replay_synthetic(pair, capsys):
    table = seed_defect_table([pair])
    rows = table[(table["student_dtype"] == pair[0]) & (table["teacher_dtype"] == pair[1])]
    argv = rows["command"].iloc[0].split()[1:]
    assert replay(argv) == 0
    printed = {}
    for line in capsys.readouterr().out.splitlines():
        parts = line.split()
        if parts and parts[0] in ("native", "fp32", "fp64"):
            printed[parts[0]] = (float(parts[1]), float(parts[2]))
    assert set(printed) == set(rows["variant"])
    for r in rows.itertuples():
        assert r.loss == pytest.approx(printed[r.variant][0], rel=1e-12)
        assert r.grad_rel_l2 == pytest.approx(printed[r.variant][1], rel=2e-3, abs=1e-12)  # printed to 4 digits
