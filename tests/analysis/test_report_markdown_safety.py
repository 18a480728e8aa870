"""report.md's cells and links made safe by ``gkd_harness.harness.config.text`` (issue 48, item 5).

Before: the provenance table kept raw ``<``, ``|``, ``<!--`` and a right-to-left override in link targets (a row
of 10 cells under an 8-cell header), and a ``javascript:`` link survived in the title. report.html was already
escaped right.
"""

from __future__ import annotations

import re

import pandas as pd

from gkd_harness.analysis.signoff.document import Document, Link

HOSTILE = "runs/a|b<!--c\u202egnp.html"


def _cells(line: str) -> int:
    return len(re.split(r"(?<!\\)\|", line.strip())) - 2


def test_a_hostile_link_target_keeps_the_row_its_cells():
    cols = [f"c{i}" for i in range(8)]
    row = {c: "x" for c in cols}
    row["c0"] = Link("run|1<!--", HOSTILE)
    d = Document("Sign-off")
    d.table(pd.DataFrame([row]), caption="provenance")
    md = d.to_markdown()
    header, _, body = [x for x in md.splitlines() if x.startswith("|")]
    assert _cells(header) == 8 and _cells(body) == 8, body
    assert "<!--" not in md and "\u202e" not in md and "<" not in body
    assert "(runs/a%7Cb%3C%21--c%E2%80%AEgnp.html)" in body or "(runs/a%7Cb%3C!--c%E2%80%AEgnp.html)" in body, body


def test_a_javascript_link_neither_in_the_title_nor_in_a_cell():
    d = Document("Sign-off: [click](javascript:alert(1)) <javascript:alert(2)>")
    d.table(pd.DataFrame([{"run": Link("r", "javascript:alert(3)")}]))
    md = d.to_markdown()
    assert not re.search(r"(?<!\\)\]\(", md) and "<javascript:" not in md, md  # no link: `\]` is text
    assert "| r |" in md
