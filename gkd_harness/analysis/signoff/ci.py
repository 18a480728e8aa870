"""The verdict for CI: a JUnit XML file and a Markdown step summary (``gkd-analyze --junit PATH --summary PATH``).

Both are written from the verdict dict :func:`gkd_harness.analysis.signoff.report.build_report` returns (the same
content as ``verdict.json``), so they say what the report says:

* :func:`junit_xml`: one ``<testsuite name="gkd-analyze">`` with one ``<testcase>`` per criterion: ``fail`` and
  ``not_measured`` are ``<failure>`` (its message: what was measured and the first offending item), a criterion
  that does not apply, was skipped or turned off is ``<skipped>``; the verdict, sweep and report folder are
  ``<properties>``. CI systems (GitLab, Jenkins, GitHub test reporters) show each criterion as a test.
* :func:`step_summary`: Markdown for ``$GITHUB_STEP_SUMMARY`` (appended to, as GitHub expects: every step adds
  its part): the verdict, the headline, and the criteria table.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Mapping, Optional

from gkd_harness.harness.contract import FAILING_STATUSES

__all__ = ["junit_xml", "step_summary", "write_ci_files"]

_FAILED = FAILING_STATUSES
_SKIPPED = ("not_applicable", "skipped", "disabled")


def _reason(criterion: Mapping[str, Any]) -> str:
    """One line: what was measured, and for a failure the first offending item (as ``Result.reason``)."""
    measured = str(criterion.get("measured") or "")
    first = next((d for d in criterion.get("details") or () if not str(d).startswith("FP64 formula check")), None)
    return measured + (f" (first: {first})" if first and criterion.get("status") == "fail" else "")


def junit_xml(result: Mapping[str, Any], report_dir: Optional[Path] = None) -> str:
    """The verdict as JUnit XML: one testcase per criterion (see the module docstring)."""
    criteria = list(result.get("criteria") or [])
    failures = sum(c.get("status") in _FAILED for c in criteria)
    skipped = sum(c.get("status") in _SKIPPED for c in criteria)
    suite = ET.Element(
        "testsuite",
        name="gkd-analyze",
        tests=str(len(criteria)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
    )
    props = ET.SubElement(suite, "properties")
    shown = {"verdict": str(result.get("verdict", "")).upper(), "sweep": result.get("sweep"), "report": report_dir}
    for name, value in shown.items():
        if value is not None:
            ET.SubElement(props, "property", name=name, value=str(value))
    for c in criteria:
        case = ET.SubElement(suite, "testcase", classname="gkd_harness.signoff", name=str(c.get("name")))
        status = c.get("status")
        if status in _FAILED:
            failure = ET.SubElement(case, "failure", message=_reason(c), type=str(status))
            failure.text = "\n".join(
                [f"{c.get('title')}: {status}", f"threshold: {c.get('threshold')}", *map(str, c.get("details") or [])]
            )
        elif status in _SKIPPED:
            ET.SubElement(case, "skipped", message=f"{status}: {c.get('measured') or c.get('applies') or ''}")
        out = ET.SubElement(case, "system-out")
        out.text = f"{c.get('title')}: {status}; measured: {c.get('measured')}"
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def _md_cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def step_summary(result: Mapping[str, Any], report_dir: Optional[Path] = None) -> str:
    """The verdict as a Markdown step summary (see the module docstring)."""
    verdict = str(result.get("verdict", "")).upper()
    lines = [f"### gkd-analyze: {'✅' if verdict == 'PASS' else '❌'} {verdict}", ""]
    if result.get("headline"):
        lines += [str(result["headline"]), ""]
    n = result.get("counts") or {}
    lines += [
        f"{n.get('passed', 0)} passed, {n.get('failed', 0)} failed, {n.get('not_applicable', 0)} not applicable; "
        f"{result.get('n_runs', 0)} runs" + (f"; report: `{report_dir}`" if report_dir else ""),
        "",
        "| status | criterion | measured |",
        "|---|---|---|",
    ]
    for c in result.get("criteria") or []:
        lines.append(f"| {_md_cell(c.get('status'))} | {_md_cell(c.get('title'))} | {_md_cell(_reason(c))} |")
    return "\n".join(lines) + "\n\n"


def write_ci_files(
    result: Mapping[str, Any], junit: Optional[Path], summary: Optional[Path], report_dir: Optional[Path]
) -> None:
    """Write the JUnit file (replaced) and append the step summary, where asked."""
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(result, report_dir), encoding="utf-8")
    if summary is not None:
        summary.parent.mkdir(parents=True, exist_ok=True)
        with summary.open("a", encoding="utf-8") as f:
            f.write(step_summary(result, report_dir))
