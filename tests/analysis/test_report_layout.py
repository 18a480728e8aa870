"""Issue 29, the report's layout: each table is computed once per report (spot_table ran 3 times: twice in the
criteria, once in the report), the report is one function per section over one context, and the report's tables
come from the same evidence the criteria judged."""

from __future__ import annotations

import gkd_harness.analysis.signoff.compare as compare
from gkd_harness.analysis.signoff import report
from gkd_harness.analysis.signoff.judge import judge
from gkd_harness.analysis.sweep.runs import load_sweep


def test_spot_and_negatives_tables_are_computed_once_per_report(synthetic_sweep_dir, tmp_path, monkeypatch):
    calls = {"spot_table": 0, "negatives_table": 0}
    for name in calls:
        real = getattr(compare, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(compare, name, counted)
        for mod in ("gkd_harness.analysis.signoff.criteria", "gkd_harness.analysis.signoff.report"):
            import importlib

            m = importlib.import_module(mod)
            if hasattr(m, name):
                monkeypatch.setattr(m, name, counted)
    out = report.build_report(judge(load_sweep(synthetic_sweep_dir)), tmp_path / "r")
    assert out["verdict"] == "pass"
    assert calls == {"spot_table": 1, "negatives_table": 1}


def test_the_report_is_one_function_per_section():
    assert len(report.SECTIONS) >= 10 and all(callable(s) for s in report.SECTIONS)
    import inspect

    # The driver only computes the context, runs the sections and writes the files (was 185 lines).
    assert len(inspect.getsource(report._write_report).splitlines()) < 40
