"""gkd_harness.analysis.signoff.document: verdict banner, table of contents with GitHub anchors, tables in scroll boxes, inlined images.

Layout in a real browser is checked by test_report_browser.py; these check the markup both renderings share.
"""

from __future__ import annotations

import base64
import re

import pandas as pd
import pytest

from gkd_harness.analysis.signoff.document import Document, slugify


@pytest.mark.parametrize(
    "text, anchor",
    [
        # anchors as GitHub renders them for these headings (punctuation dropped, spaces -> '-', case folded)
        ("Criteria", "criteria"),
        ("Original vs patched: loss and grad_norm", "original-vs-patched-loss-and-grad_norm"),
        ("β-curve: paper vs continuous form", "β-curve-paper-vs-continuous-form"),
        (
            "Replay of captures (native / FP32 / FP64 on the training inputs)",
            "replay-of-captures-native--fp32--fp64-on-the-training-inputs",
        ),
    ],
)
def test_slugify_github_anchors(text, anchor):
    assert slugify(text) == anchor


def _doc(verdict="pass") -> Document:
    d = Document("Sign-off <test>")
    d.banner(verdict, "3 of 4 criteria pass; `gkd-analyze` ran")
    d.toc()
    d.heading("Criteria")
    d.table(pd.DataFrame({"criterion": ["a", "b"], "status": ["pass", "fail"], "measured": ["x" * 80, "short"]}))
    d.heading("Details", 3)
    d.heading("Criteria")  # repeated title: GitHub numbers the second anchor
    d.para("**bold** and `code`")
    return d


def test_html_banner_toc_tables():
    h = _doc("fail").to_html()
    m = re.search(r"<div id='verdict-banner' class='banner fail' role='status'><span id='verdict'>(.*?)</span>", h)
    assert m and m.group(1) == "FAIL"
    assert "<code>gkd-analyze</code>" in h  # banner detail gets inline markup
    toc = re.search(r"<nav class='toc'.*?</nav>", h).group(0)
    assert re.findall(r"href='#([^']+)'", toc) == ["criteria", "criteria-1"]  # level-2 headings only
    assert "<h2 id='criteria'>" in h and "<h2 id='criteria-1'>" in h and "<h3 id='details'>" in h
    # the table is inside its own scroll box; status cells coloured; the long cell wraps in a bounded width
    assert re.search(r"<div class='table-wrap' tabindex='0' role='region' aria-label='table 1'><table>", h)
    assert "<td class='pass'>pass</td>" in h and "<td class='fail'>fail</td>" in h
    assert f"<td class='long'>{'x' * 80}</td>" in h
    assert "<title>Sign-off &lt;test&gt;</title>" in h
    assert ".table-wrap{display:block;width:fit-content;max-width:100%;overflow-x:auto" in h
    assert ".banner.pass{background:#1a7f37}" in h and ".banner.fail{background:#cf222e}" in h


def test_markdown_banner_and_toc():
    md = _doc().to_markdown()
    assert "> **Verdict: PASS** — 3 of 4 criteria pass; `gkd-analyze` ran" in md
    assert "1. [Criteria](#criteria)\n2. [Criteria](#criteria-1)" in md
    assert md.index("**Contents**") < md.index("## Criteria")


def test_banner_rejects_other_verdicts():
    with pytest.raises(ValueError, match="banner verdict must be 'pass' or 'fail'"):
        Document("t").banner("maybe")


def test_image_inlined_byte_for_byte(tmp_path):
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    d = Document("t")
    d.image(png, "caption 'quoted'")
    h = d.to_html()
    data = re.search(r"src='data:image/png;base64,([^']+)'", h).group(1)
    assert base64.b64decode(data) == png.read_bytes()
    assert "alt='caption &#x27;quoted&#x27;'" in h
    assert "![caption 'quoted'](plot.png)" in d.to_markdown()  # the Markdown links the PNG next to it
