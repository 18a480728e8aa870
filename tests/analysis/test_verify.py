"""Issue 29, reproduction 10: a verifiable verdict. verdict.json carries the sha256 of each judged run's files and
of the criteria; ``gkd-analyze --verify REPORT_DIR`` recomputes the verdict from the run folders: exit 0 when
everything matches, 1 naming the first difference (an edited verdict, an edited run, other criteria).
One report is written per module (synthetic run folders, gkd_harness.bench.synthetic.write_run); each test edits a copy."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from gkd_harness.analysis.cli import main
from gkd_harness.bench.synthetic import write_run


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """A sweep (native and fp32, BF16 teacher) and its report, side by side under one folder."""
    root = tmp_path_factory.mktemp("verify")
    for prec, loss in (("native", "original"), ("fp32", "fp32")):
        write_run(
            root / "sweep" / f"loss={loss}",
            beta=0.5,
            beta_form="paper",
            precision=prec,
            seed=1,
            steps=6,
            spot_every=2,
            group="v",
        )
    assert main([str(root / "sweep"), "--report", str(root / "report")]) == 0
    return root


@pytest.fixture
def copy(written, tmp_path) -> Path:
    """A private copy; the report's recorded sweep path is moved to the copy's sweep."""
    shutil.copytree(written, tmp_path / "w")
    v = json.loads((tmp_path / "w" / "report" / "verdict.json").read_text())
    v["inputs"]["sweep"] = str(tmp_path / "w" / "sweep")
    (tmp_path / "w" / "report" / "verdict.json").write_text(json.dumps(v, indent=1))
    return tmp_path / "w"


def test_verdict_json_records_the_sha256_of_each_run_file_and_the_criteria(written):
    v = json.loads((written / "report" / "verdict.json").read_text())
    run = written / "sweep" / "loss=fp32"
    assert (
        v["run_files"]["loss=fp32"]["metrics.jsonl"] == hashlib.sha256((run / "metrics.jsonl").read_bytes()).hexdigest()
    )
    assert (
        v["run_files"]["loss=fp32"]["summary.json"] == hashlib.sha256((run / "summary.json").read_bytes()).hexdigest()
    )
    assert set(v["run_files"]["loss=fp32"]) == {"metrics.jsonl", "summary.json", "config.yaml"}
    assert v["inputs"]["criteria"]["file"] is None and len(v["inputs"]["criteria"]["sha256"]) == 64
    assert v["inputs"]["sweep"] == str(written / "sweep") and v["inputs"]["source"] == "local"


def test_verify_passes_on_a_fresh_report(copy, capsys):
    assert main(["--verify", str(copy / "report")]) == 0
    assert "matches: verdict PASS" in capsys.readouterr().out


def test_verify_fails_after_the_verdict_is_edited(copy, capsys):
    path = copy / "report" / "verdict.json"
    v = json.loads(path.read_text())
    v["verdict"], v["exit_code"] = "fail", 1
    path.write_text(json.dumps(v))
    assert main(["--verify", str(copy / "report")]) == 1
    out = capsys.readouterr().out
    assert 'DIFFERS: verdict.json: verdict is "fail", the runs give "pass"' in out


def test_verify_fails_after_a_criterion_status_is_edited(copy, capsys):
    path = copy / "report" / "verdict.json"
    v = json.loads(path.read_text())
    v["criteria"][0]["status"] = "not_applicable"
    path.write_text(json.dumps(v))
    assert main(["--verify", str(copy / "report")]) == 1
    assert "criterion no_negative_patched status" in capsys.readouterr().out


def test_verify_fails_after_a_judged_metrics_file_is_edited(copy, capsys):
    m = copy / "sweep" / "loss=fp32" / "metrics.jsonl"
    m.write_text(m.read_text().replace('"train/loss": 0.', '"train/loss": 1.', 1))
    assert main(["--verify", str(copy / "report")]) == 1
    assert "run loss=fp32: metrics.jsonl changed since the report" in capsys.readouterr().out


def test_verify_fails_with_other_criteria(copy, tmp_path, capsys):
    crit = tmp_path / "c.yaml"
    crit.write_text("spot_tolerance: {loss_rtol: 1.0e-3}\n")
    assert main(["--verify", str(copy / "report"), "--criteria", str(crit)]) == 1
    assert "different criteria" in capsys.readouterr().out


def test_verify_fails_when_report_md_says_another_verdict(copy, capsys):
    md = copy / "report" / "report.md"
    md.write_text(md.read_text().replace("**Verdict: PASS**", "**Verdict: FAIL**"))
    assert main(["--verify", str(copy / "report")]) == 1
    assert "report.md" in capsys.readouterr().out


def test_verify_of_a_folder_without_a_verdict_exits_2(tmp_path, capsys):
    assert main(["--verify", str(tmp_path)]) == 2
    assert "verdict.json: missing" in capsys.readouterr().err
