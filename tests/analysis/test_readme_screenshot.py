"""The README's screenshot shows the report as it is now (issue 40, item 12: it showed 9 sections and 7 criteria
where the report had 11 and 9).

``python -m tests.analysis.browser screenshot`` writes ``docs/img/report.json`` beside the PNG: the sections and
criteria of the report it photographed. The README's caption states the same counts, and a report built now
(a synthetic sweep: the sections and criteria do not depend on the sweep) has them too. A new section or
criterion fails this test until the screenshot is regenerated."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from gkd_harness.analysis.cli import main
from tests.analysis.browser import VIEWPORT, report_counts

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_screenshot_counts_match_the_report(synthetic_sweep_dir, tmp_path):
    readme = (REPO / "README.md").read_text()
    m = re.search(r"!\[[^\]]*contents \((\d+) sections\), criteria \((\d+)\)\]\((docs/img/[\w.]+\.png)\)", readme)
    assert m, "README: the screenshot's caption names its section and criterion counts"
    stated = {"sections": int(m.group(1)), "criteria": int(m.group(2))}
    png = REPO / m.group(3)
    shot = json.loads(png.with_suffix(".json").read_text())
    assert shot == {"image": png.name, **stated}
    width, _height = struct.unpack(">II", png.read_bytes()[16:24])
    assert width == VIEWPORT[0]
    main([str(synthetic_sweep_dir), "--report", str(tmp_path / "r")])
    assert report_counts((tmp_path / "r" / "report.html").read_text()) == stated
