"""``gkd-bench --only analysis``: the loading and sign-off figures against a plain json.loads pass, side by side.

The row arithmetic against hand computations, and a quick run of the group whose values (line counts, ratios of
the reported medians, the judged goals) are checked against what the test computes itself; no timing is asserted.
"""

from __future__ import annotations

import json
import statistics

import pytest

from gkd_harness.bench import cli as bench
from gkd_harness.harness.contract import METRICS_FILE


def test_analysis_rows_are_the_hand_computation():
    from gkd_harness.bench.analysis_time import analysis_rows

    res = {
        "variant_cpu_s": {"json_loads": [2.0, 4.0, 3.0], "load": [1.0, 2.0, 3.0], "report": [9.0, 12.0, 15.0]},
        "variant_wall_s": {"json_loads": [2.0, 4.0, 3.0], "load": [2.0, 2.0, 2.0], "report": [30.0, 30.0, 30.0]},
        "rss": {"json_loads": {"peak_mib": 200.0, "lines": 10}, "load": {"peak_mib": 500.0, "lines": 10}},
        "lines": 6,
        "runs": 2,
        "history_rows": 6,
        "steps": 3,
    }
    rows = {r["name"]: r for r in analysis_rows(res)}
    assert list(rows) == [
        "analysis/json_loads",
        "analysis/load",
        "analysis/report",
        "analysis_rss/json_loads",
        "analysis_rss/load",
    ]
    assert rows["analysis/json_loads"]["baseline"] is None and rows["analysis/json_loads"]["median_ms"] == 3000.0
    assert rows["analysis/load"]["time_ratio"] == 2.0 / 3.0
    # spread: inclusive q1-q3 of the per-repetition ratios (0.5, 0.5, 1.0): 0.5 and 0.5 + (1.0 - 0.5) / 2
    assert rows["analysis/load"]["time_ratio_range"] == (0.5, 0.75)
    assert rows["analysis/report"]["time_ratio"] == 12.0 / 3.0 and rows["analysis/report"]["wall_ratio"] == 10.0
    assert rows["analysis_rss/load"]["peak_mib"] == 500.0 and rows["analysis_rss/load"]["mem_ratio"] == 2.5
    goals = {(g["name"], g["metric"]): g for g in bench.judge(list(rows.values()))}
    assert goals[("analysis/load", "time_ratio")]["status"] == "met"
    assert goals[("analysis/report", "time_ratio")]["status"] == "met"  # 4.0 <= 4
    assert goals[("analysis_rss/load", "peak_mib")]["status"] == "met"


@pytest.mark.slow
def test_quick_analysis_group_reports_ratios_measured_side_by_side(tmp_path):
    js, work = tmp_path / "bench.json", tmp_path / "work"
    assert bench.main(["--quick", "--only", "analysis", "--json", str(js), "--work-dir", str(work)]) == 0
    out = json.loads(js.read_text())
    rows = {r["name"]: r for r in out["rows"]}
    assert set(rows) == {
        "analysis/json_loads",
        "analysis/load",
        "analysis/report",
        "analysis_rss/json_loads",
        "analysis_rss/load",
    }
    assert not any(r["errors"] for r in rows.values())
    res = out["pooled"]["analysis/all"]
    # the quick sweep: 40 runs x 50 steps, counted here from the files
    metrics = sorted((work / "sweep_quick" / "runs").glob(f"*/{METRICS_FILE}"))
    lines = sum(len(p.read_text().splitlines()) for p in metrics)
    assert (len(metrics), lines) == (40, 40 * 50)
    assert (res["runs"], res["lines"], res["history_rows"]) == (40, lines, lines)
    assert res["verdict_rc"] in (0, 1)
    long_lines = len((work / "long_10000" / "run" / METRICS_FILE).read_text().splitlines())
    assert long_lines == 10_000 == res["rss"]["load"]["lines"] == res["rss"]["json_loads"]["lines"]
    # every variant measured in the same worker, the same number of times; ratios are the medians' ratio
    cpu = res["variant_cpu_s"]
    assert len(cpu["json_loads"]) == len(cpu["load"]) == len(cpu["report"]) >= 1
    for v in ("load", "report"):
        assert rows[f"analysis/{v}"]["time_ratio"] == pytest.approx(
            statistics.median(cpu[v]) / statistics.median(cpu["json_loads"])
        )
        assert rows[f"analysis/{v}"]["baseline"] == "analysis/json_loads"
    peak = {v: res["rss"][v]["peak_mib"] for v in ("json_loads", "load")}
    assert peak["json_loads"] > 0 and rows["analysis_rss/load"]["mem_ratio"] == pytest.approx(
        peak["load"] / peak["json_loads"]
    )
    goals = {(g["name"], g["metric"]): g for g in out["goals"]}
    for key, value in (
        (("analysis/load", "time_ratio"), rows["analysis/load"]["time_ratio"]),
        (("analysis/report", "time_ratio"), rows["analysis/report"]["time_ratio"]),
        (("analysis_rss/load", "peak_mib"), peak["load"]),
    ):
        g = goals[key]
        assert g["value"] == pytest.approx(value)
        assert g["status"] == ("met" if value <= g["limit"] else "NOT met")
