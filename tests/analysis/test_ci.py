"""``gkd-analyze --junit PATH --summary PATH`` (issue 40, item 15): CI gates on more than the exit code. The JUnit
file has one test case per criterion (failures for fail / not_measured, skipped for not_applicable), the step
summary says the verdict, the headline and every criterion; both agree with verdict.json. Before, neither flag
existed (argparse refused them: exit 2)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from gkd_harness.analysis.cli import main


def _run(sweep, tmp_path, name="r"):
    junit, summary = tmp_path / "ci" / "junit.xml", tmp_path / "ci" / "summary.md"
    rc = main([str(sweep), "--report", str(tmp_path / name), "--junit", str(junit), "--summary", str(summary)])
    verdict = json.loads((tmp_path / name / "verdict.json").read_text())
    return rc, ET.parse(junit).getroot(), summary.read_text(), verdict


def test_a_passing_sweep_gives_one_passing_case_per_criterion(synthetic_sweep_dir, tmp_path):
    rc, suite, summary, verdict = _run(synthetic_sweep_dir, tmp_path)
    assert rc == 0 and verdict["verdict"] == "pass"
    cases = suite.findall("testcase")
    by_name = {c.get("name"): c for c in cases}
    assert list(by_name) == [c["name"] for c in verdict["criteria"]]
    assert suite.get("tests") == str(len(cases)) and suite.get("failures") == "0" and suite.get("errors") == "0"
    skipped = [c["name"] for c in verdict["criteria"] if c["status"] == "not_applicable"]
    assert sorted(n for n, c in by_name.items() if c.find("skipped") is not None) == sorted(skipped)
    assert suite.get("skipped") == str(len(skipped)) and not suite.findall("testcase/failure")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict"] == "PASS"
    lines = summary.splitlines()
    assert lines[0] == "### gkd-analyze: ✅ PASS" and lines[2] == verdict["headline"]
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| status")]
    assert [r.split(" | ")[1] for r in rows] == [c["title"].replace("|", "\\|") for c in verdict["criteria"]]


def test_a_failing_sweep_gives_a_failure_naming_the_first_offender(sweep_copy, tmp_path):
    run = sweep_copy / "b0.9_paper_fp32_T0.9_s0"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows[6]["gkd/neg_loss_calls"] = 1
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc, suite, summary, verdict = _run(sweep_copy, tmp_path)
    assert rc == 1 and verdict["failed_criteria"] == ["no_negative_patched"]
    failures = {c.get("name"): c.find("failure") for c in suite.findall("testcase") if c.find("failure") is not None}
    assert list(failures) == ["no_negative_patched"] and suite.get("failures") == "1"
    assert failures["no_negative_patched"].get("message") == verdict["failed_reasons"]["no_negative_patched"]
    assert summary.startswith("### gkd-analyze: ❌ FAIL\n")
    # a second run appends its own part, as $GITHUB_STEP_SUMMARY expects of each step
    rc2, _, summary2, _ = _run(sweep_copy, tmp_path, name="r2")
    assert rc2 == 1 and summary2.count("### gkd-analyze: ") == 2
