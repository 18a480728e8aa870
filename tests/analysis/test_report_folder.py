"""Issue 38 item 1: ``--report`` never deletes or writes into a folder it does not own."""

from __future__ import annotations

import json
from pathlib import Path

from gkd_harness.analysis.cli import main
from gkd_harness.bench.synthetic import write_run


def _sweep(root: Path) -> Path:
    for precision in ("native", "fp32"):
        write_run(
            root / f"loss={precision}",
            beta=0.5,
            beta_form="paper",
            precision=precision,
            seed=1,
            steps=4,
            spot_every=2,
            group="smoke",
        )
    return root


def test_report_into_a_folder_holding_the_sweep_and_notes_is_refused(tmp_path, capsys):
    p = tmp_path / "P"
    sweep = _sweep(p / "smoke")
    (p / "report.md").write_text("an old report")
    (p / "notes").mkdir()
    (p / "notes" / "important.txt").write_text("keep me")
    before = sorted(str(x.relative_to(p)) for x in p.rglob("*"))
    assert main([str(sweep), "--report", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(p) in err[0] and "notes" in err[0] and "smoke" in err[0]
    assert sorted(str(x.relative_to(p)) for x in p.rglob("*")) == before
    assert (p / "notes" / "important.txt").read_text() == "keep me"


def test_report_into_the_sweep_folder_itself_is_refused(tmp_path, capsys):
    sweep = _sweep(tmp_path / "SW")
    (sweep / "report.md").write_text("x")
    assert main([str(sweep), "--report", str(sweep)]) == 2
    assert "loss=fp32" in capsys.readouterr().err
    assert (sweep / "loss=native" / "metrics.jsonl").exists()


def test_an_earlier_report_is_replaced_but_a_file_added_to_it_refuses(tmp_path, capsys):
    sweep = _sweep(tmp_path / "SW")
    rep = tmp_path / "rep"
    assert main([str(sweep), "--report", str(rep)]) == 0
    listed = json.loads((rep / "verdict.json").read_text())["files"]
    assert (rep / listed["markdown"]).exists()
    assert main([str(sweep), "--report", str(rep)]) == 0  # its own report: replaced
    (rep / "mine.txt").write_text("x")
    capsys.readouterr()
    assert main([str(sweep), "--report", str(rep)]) == 2
    assert "mine.txt" in capsys.readouterr().err
    assert (rep / "mine.txt").exists()
