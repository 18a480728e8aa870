"""report.md shows raw HTML from run names and errors as text (issue 24, item 4): before the fix a run named
``<script>`` or an error holding ``<img onerror=...>`` reached report.md as markup, while the HTML report escaped
them."""

from __future__ import annotations

import pandas as pd

from gkd_harness.analysis.signoff.document import Document

XSS = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"


def test_markdown_escapes_html_everywhere_but_code():
    d = Document("Sign-off")
    d.banner("fail", f"point {XSS} failed", failing=[(XSS, f"error {IMG}")])
    d.toc()
    d.heading(f"Run {XSS}")
    d.para(f"error: {IMG}")
    d.bullets([XSS])
    d.table(pd.DataFrame({f"name {XSS}": [XSS], "error": [IMG]}), caption=IMG)
    d.code(XSS)
    md = d.to_markdown()
    assert md.count(XSS) == 1 and md.count("```\n" + XSS + "\n```") == 1  # only inside the code block
    assert IMG not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md and "&lt;img src=x onerror=alert(1)&gt;" in md
