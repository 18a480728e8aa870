"""One output flag and ``--verbose`` across the tools (issue 47, item 11). Before: ``--report DIR`` (gkd-analyze),
``--out`` elsewhere, and only gkd-analyze had ``--verbose``. ``gkd-train`` keeps Hydra's ``run.verbose=true``."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import entry_point


@pytest.mark.parametrize(
    "tool,out",
    [("gkd-analyze", True), ("gkd-dashboard", True), ("gkd-certify", True), ("gkd-replay", False)],
)
def test_every_tool_has_out_and_verbose(tool, out):
    text = subprocess.run([entry_point(tool), "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "--verbose" in text, tool
    assert ("--out" in text) == out, tool


def test_gkd_analyze_keeps_report_as_an_alias_of_out():
    text = subprocess.run([entry_point("gkd-analyze"), "--help"], capture_output=True, text=True, timeout=120).stdout
    assert "--out DIR, --report DIR" in text
