"""A small report document rendered twice: Markdown, and self-contained HTML (images inlined as base64).

Both renderings come from the same block list, so the HTML is the same report as the Markdown. The HTML:

* opens with a verdict banner (:meth:`Document.banner`: green for PASS, red for FAIL; the verdict word is in
  ``#verdict`` so a browser test can read it) and a table of contents (:meth:`Document.toc`) linking every
  level-2 heading;
* fits every table into the page column (1,152 px at a 1366 px window) without sideways scrolling: setting
  columns (dotted config keys such as ``gkd.beta``, ``run.seed``) that hold one value in every row move to one
  line above the table (:func:`constant_settings`); a table still wider than the column is split into parts,
  each repeating the first (identifying) column (:func:`column_parts`, widths estimated from the text); long text
  wraps. Each part sits in its own scroll box (``div.table-wrap``) as a fallback, so the page itself never
  scrolls sideways (both checked at 1366 px in a real browser by ``tests/analysis/test_report_browser.py``);
* embeds images as ``data:`` URIs and loads nothing from outside the file.

Heading anchors follow GitHub's rule (:func:`slugify`), so the Markdown table of contents links work on GitHub too.
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import numpy as np
import pandas as pd

from gkd_harness.harness.config.text import markdown_cell, markdown_link
from gkd_harness.harness.contract import CRITERION_STATUSES

__all__ = [
    "Document",
    "Link",
    "format_value",
    "slugify",
    "constant_settings",
    "column_parts",
    "neutralise_bidi",
    "STYLE",
]

#: Unicode's bidirectional controls (embeddings, overrides, isolates, marks): a group or run name holding one
#: (U+202E RIGHT-TO-LEFT OVERRIDE) would reverse the text after it in a browser, the title included.
_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def neutralise_bidi(text: str) -> str:
    """``text`` with every bidirectional control character shown as its code point (``<U+202E>``) instead of
    acting on the text around it."""
    return _BIDI_CONTROLS.sub(lambda m: f"<U+{ord(m.group()):04X}>", str(text))


#: CSS of the HTML rendering (inline; no external resources).
STYLE = """
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;max-width:1200px;
 margin:0 auto;padding:1em 1.5em;line-height:1.45;color:#1f2328}
h1{font-size:1.6em;margin:0.4em 0}
h2{border-bottom:1px solid #d0d7de;padding-bottom:0.2em;margin-top:1.6em}
p,li,figcaption,h1,h2,h3{overflow-wrap:anywhere}
.banner{display:flex;flex-wrap:wrap;align-items:baseline;gap:0.4em 1em;padding:0.8em 1.1em;margin:1em 0;
 border-radius:6px;color:#fff}
.banner.pass{background:#1a7f37}
.banner.fail{background:#cf222e}
#verdict{font-size:1.6em;font-weight:700;letter-spacing:0.05em}
.banner-detail{flex:1 1 30em;min-width:0;overflow-wrap:anywhere}
nav.toc{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:0.5em 1em;margin:1em 0}
nav.toc ol{margin:0.3em 0;padding-left:1.5em;columns:2 22em}
.table-wrap{display:block;width:fit-content;max-width:100%;overflow-x:auto;margin:0.5em 0 1em;border:1px solid #d0d7de;
 background:linear-gradient(to right,#fff 30%,rgba(255,255,255,0)) left/40px 100% no-repeat local,
 linear-gradient(to left,#fff 30%,rgba(255,255,255,0)) right/40px 100% no-repeat local,
 radial-gradient(farthest-side at 0 50%,rgba(0,0,0,.25),rgba(0,0,0,0)) left/14px 100% no-repeat scroll,
 radial-gradient(farthest-side at 100% 50%,rgba(0,0,0,.25),rgba(0,0,0,0)) right/14px 100% no-repeat scroll}
.table-wrap:focus{outline:2px solid #0969da}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #d8dee4;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3;white-space:nowrap}
td.long{min-width:18em;max-width:40em;overflow-wrap:anywhere}
td.pass{color:#1a7f37;font-weight:bold}
td.fail,td.not_measured{color:#cf222e;font-weight:bold}
td.skipped,td.disabled,td.not_applicable{color:#6e7781}
.banner-failing{flex:1 1 100%;margin:0.2em 0 0;padding-left:1.3em}
figure{margin:1em 0;overflow-x:auto}
img{max-width:100%;height:auto;display:block}
figcaption{font-size:0.9em;color:#57606a}
pre{background:#f6f8fa;padding:0.6em;overflow-x:auto;max-width:100%}
p.table-constants,p.table-part{font-size:0.9em;margin:0.6em 0 0.2em;color:#57606a}
code{background:#f0f2f4;padding:0 0.2em;border-radius:3px;overflow-wrap:anywhere}
""".strip()

_STATUS = CRITERION_STATUSES
#: The narrowest a plot is shown, as a share of its pixel width: the plots' smallest text (8 pt at 150 dpi, 16.7
#: px in the PNG) stays >= 9 CSS px. On a narrow screen (a 390 px phone) the plot scrolls sideways inside its
#: figure instead of shrinking to unreadable text; the page itself does not scroll.
MIN_PLOT_SCALE = 0.55
_LONG_CELL = 60  # characters: cells longer than this wrap inside a bounded width
#: A setting column: a dotted config key (``gkd.beta``, ``run.seed``, ``dtype.student``).
_SETTING_COLUMN = re.compile(r"^[A-Za-z_]+(\.[A-Za-z_]+)+$")
#: Width a table part is packed into: the page column is 1,152 px (``max-width:1200px`` less 2 x 1.5em
#: padding), less a margin for the estimate below.
TABLE_BUDGET_PX = 1080
_CHAR_PX = 7.8  # widest average advance at 12px (DejaVu Sans Bold ~0.65em); an over-estimate for most fonts
_CELL_PAD_PX = 14  # 2 x 6px padding + border
_LONG_PX = 18 * 12  # td.long's min-width (18em at 12px): a long cell wraps down to this


def constant_settings(df: pd.DataFrame) -> list:
    """-> [(column, shown value)] of the setting columns (:data:`_SETTING_COLUMN`) that hold one value in
    every row of ``df`` (2 rows or more): said once above the table instead of in each row (a null value is
    shown as ``null``, never as an empty value)."""
    if len(df) < 2:
        return []
    out = []
    for c in df.columns:
        if _SETTING_COLUMN.match(str(c)):
            shown = {format_value(v) for v in df[c]}
            if len(shown) == 1:
                out.append((str(c), shown.pop() or "null"))
    return out


def _column_px(df: pd.DataFrame, col) -> float:
    """Estimated narrowest width the browser can give one column (its min-content width): the header (never
    wrapped) or the longest word of any cell (cells wrap at spaces; a long cell wraps down to ``td.long``'s
    min-width), whichever is wider."""
    cells = [format_value(v) for v in df[col]]
    widest = max(
        [_LONG_PX if len(t) > _LONG_CELL else max(map(len, t.split() or [""])) * _CHAR_PX for t in cells] or [0.0]
    )
    return max(len(str(col)) * _CHAR_PX, widest) + _CELL_PAD_PX


def column_parts(df: pd.DataFrame, budget_px: float = TABLE_BUDGET_PX) -> list:
    """-> lists of column positions, one per table part: all columns when they fit ``budget_px``; else the
    first column followed by as many of the next as fit, part after part (a column wider than the budget on
    its own gets a part of its own)."""
    n = len(df.columns)
    widths = [_column_px(df, df.columns[i]) for i in range(n)]
    if n <= 2 or sum(widths) <= budget_px:
        return [list(range(n))]
    parts: List[List[int]] = []
    cur: List[int] = []
    used = widths[0]
    for i in range(1, n):
        if cur and used + widths[i] > budget_px:
            parts.append([0] + cur)
            cur, used = [], widths[0]
        cur.append(i)
        used += widths[i]
    parts.append([0] + cur)
    return parts


def format_value(v) -> str:
    """Table cell text: floats with 4 significant digits, None/NaN as an empty cell."""
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return ""
        if math.isinf(v):  # a logged Inf (e.g. a grad_norm): shown as itself
            return "inf" if v > 0 else "-inf"
        if v == int(v) and abs(v) < 1e6:
            return f"{v:.0f}" if abs(v) >= 1 or v == 0 else f"{v:.4g}"
        return f"{v:.4g}"
    return str(v)


@dataclass(frozen=True)
class Link:
    """A table cell that links somewhere: ``text`` shown, ``href`` followed (a run folder, relative to the
    report). Markdown: ``[text](href)``; HTML: ``<a href>``; anywhere else (widths, constants) its text."""

    text: str
    href: str

    def __str__(self) -> str:
        return self.text


def _png_width(data: bytes) -> Optional[int]:
    """A PNG's width in pixels (its IHDR chunk), None for anything else."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big")


def _escape(text, quote: bool = True) -> str:
    """HTML-escaped text with bidirectional controls neutralised (:func:`neutralise_bidi`)."""
    return html.escape(neutralise_bidi(str(text)), quote=quote)


def slugify(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (letters of any script kept), spaces -> '-'.

    >>> slugify("β-curve: paper vs continuous form")
    'β-curve-paper-vs-continuous-form'
    """
    t = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return t.replace(" ", "-")


@dataclass
class Document:
    """Report blocks in order; render with :meth:`to_markdown` / :meth:`to_html`."""

    title: str
    blocks: list = field(default_factory=list)

    def banner(self, verdict: str, detail: str = "", failing=()) -> None:
        """The verdict banner: ``verdict`` is "pass" or "fail" (shown upper-case), ``detail`` one sentence,
        ``failing`` the ``(criterion, one-line reason)`` pairs listed under it (the first screen says which
        criterion failed and why)."""
        v = str(verdict).lower()
        if v not in ("pass", "fail"):
            raise ValueError(f"banner verdict must be 'pass' or 'fail', got {verdict!r}")
        self.blocks.append(("banner", v, detail, [(str(a), str(b)) for a, b in failing]))

    def toc(self) -> None:
        """A table of contents of the level-2 headings, rendered where this is called."""
        self.blocks.append(("toc",))

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", level, text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items) -> None:
        self.blocks.append(("ul", list(items)))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def table(self, df: pd.DataFrame, max_rows: int = 60, caption: Optional[str] = None) -> None:
        self.blocks.append(("table", df, max_rows, caption))

    def image(self, path: Optional[Path], caption: str) -> None:
        if path is not None:
            self.blocks.append(("img", Path(path), caption))

    # -- anchors ------------------------------------------------------------------------------------
    def _anchors(self) -> dict:
        """Block index of each heading -> unique anchor (GitHub numbering of repeats: x, x-1, x-2)."""
        seen: dict = {}
        out = {}
        for i, b in enumerate(self.blocks):
            if b[0] != "h":
                continue
            base = slugify(b[2]) or "section"
            n = seen.get(base, 0)
            seen[base] = n + 1
            out[i] = base if n == 0 else f"{base}-{n}"
        return out

    def _toc_entries(self, anchors: dict) -> list:
        return [(self.blocks[i][2], a) for i, a in anchors.items() if self.blocks[i][1] == 2]

    # -- Markdown -----------------------------------------------------------------------------------
    @staticmethod
    def _md_text(text) -> str:
        """Raw HTML in names and errors shown as text, not markup (``<script>`` in a run name); bidirectional
        controls shown as code points (:func:`neutralise_bidi`)."""
        return html.escape(neutralise_bidi(str(text)), quote=False)

    @classmethod
    def _md_cell(cls, v) -> str:
        """One cell, whatever a user's name, path or link holds (gkd_harness.harness.config.text, issue 48 item 5)."""
        if isinstance(v, Link):
            return markdown_link(format_value(v), v.href)
        return markdown_cell(format_value(v))

    def to_markdown(self) -> str:
        anchors = self._anchors()
        out = [f"# {markdown_cell(self.title)}", ""]
        for _i, b in enumerate(self.blocks):
            kind = b[0]
            if kind == "banner":
                out += [f"> **Verdict: {b[1].upper()}**" + (f" — {self._md_text(b[2])}" if b[2] else "")]
                out += (
                    [">"] * bool(b[3])
                    + [f"> - **{self._md_text(name)}**: {self._md_text(why)}" for name, why in b[3]]
                    + [""]
                )
            elif kind == "toc":
                entries = self._toc_entries(anchors)
                if entries:
                    out += ["**Contents**", ""] + [
                        f"{n}. [{self._md_text(t)}](#{a})" for n, (t, a) in enumerate(entries, 1)
                    ]
                    out.append("")
            elif kind == "h":
                out += ["#" * b[1] + " " + self._md_text(b[2]), ""]
            elif kind == "p":
                out += [self._md_text(b[1]), ""]
            elif kind == "ul":
                out += [f"- {self._md_text(x)}" for x in b[1]] + [""]
            elif kind == "code":
                fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", b[1])), default=0))
                out += [fence, neutralise_bidi(b[1]), fence, ""]
            elif kind == "table":
                df, max_rows, caption = b[1], b[2], b[3]
                if df.empty:  # one line, naming the table when it has a caption
                    out += [f"*{self._md_text(caption)}*: no rows" if caption else "(no rows)", ""]
                    continue
                if caption:
                    out += [f"*{self._md_text(caption)}*", ""]
                shown = df.head(max_rows)
                cols = [str(c) for c in shown.columns]
                out.append("| " + " | ".join(markdown_cell(c) for c in cols) + " |")
                out.append("|" + "---|" * len(cols))
                for row in shown.itertuples(index=False, name=None):
                    out.append("| " + " | ".join(self._md_cell(v) for v in row) + " |")
                if len(df) > max_rows:
                    out.append(f"\n({len(df) - max_rows} more rows not shown)")
                out.append("")
            elif kind == "img":
                out += [f"![{self._md_text(b[2])}]({b[1].name})", "", f"*{self._md_text(b[2])}*", ""]
        return "\n".join(out)

    # -- HTML ---------------------------------------------------------------------------------------
    def to_html(self) -> str:
        e = _escape
        anchors = self._anchors()
        out = [
            "<!DOCTYPE html>",
            "<html lang='en'><head><meta charset='utf-8'>",
            "<meta name='viewport' content='width=device-width, initial-scale=1'>",
            f"<title>{e(self.title)}</title>",
            f"<style>{STYLE}</style>",
            "</head><body>",
            f"<h1>{e(self.title)}</h1>",
        ]
        n_tables = 0
        for i, b in enumerate(self.blocks):
            kind = b[0]
            if kind == "banner":
                detail = f"<span class='banner-detail'>{self._inline(b[2])}</span>" if b[2] else ""
                failing = (
                    (
                        "<ul class='banner-failing'>"
                        + "".join(f"<li><b>{e(name)}</b>: {self._inline(why)}</li>" for name, why in b[3])
                        + "</ul>"
                    )
                    if b[3]
                    else ""
                )
                out.append(
                    f"<div id='verdict-banner' class='banner {b[1]}' role='status'>"
                    f"<span id='verdict'>{b[1].upper()}</span>{detail}{failing}</div>"
                )
            elif kind == "toc":
                entries = self._toc_entries(anchors)
                if entries:
                    items = "".join(f"<li><a href='#{e(a)}'>{e(t)}</a></li>" for t, a in entries)
                    out.append(
                        f"<nav class='toc' aria-label='Contents'><strong>Contents</strong><ol>{items}</ol></nav>"
                    )
            elif kind == "h":
                out.append(f"<h{b[1]} id='{e(anchors[i])}'>{e(b[2])}</h{b[1]}>")
            elif kind == "p":
                out.append(f"<p>{self._inline(b[1])}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{self._inline(x)}</li>" for x in b[1]) + "</ul>")
            elif kind == "code":
                out.append(f"<pre>{e(b[1])}</pre>")
            elif kind == "table":
                df, max_rows, caption = b[1], b[2], b[3]
                if df.empty:
                    out.append(f"<p><em>{e(caption)}</em>: no rows</p>" if caption else "<p>(no rows)</p>")
                    continue
                if caption:
                    out.append(f"<p><em>{e(caption)}</em></p>")
                n_tables += 1
                label = caption or f"table {n_tables}"
                shown = df.head(max_rows)
                constants = constant_settings(df)
                if constants:
                    out.append(
                        "<p class='table-constants'>Every row: "
                        + ", ".join(f"<code>{e(c)}</code> = {e(v)}" for c, v in constants)
                        + "</p>"
                    )
                    shown = shown.drop(columns=[c for c, _ in constants])
                parts = column_parts(shown)
                for k, cols in enumerate(parts, 1):
                    part = shown.iloc[:, cols]
                    if len(parts) > 1:
                        out.append(
                            f"<p class='table-part'>Part {k} of {len(parts)}: columns "
                            f"{e(', '.join(str(c) for c in part.columns[1:]))}</p>"
                        )
                        out.append(self._html_table(part, f"{label} (part {k} of {len(parts)})"))
                    else:
                        out.append(self._html_table(part, label))
                if len(df) > max_rows:
                    out.append(f"<p>({len(df) - max_rows} more rows not shown)</p>")
            elif kind == "img":
                raw = b[1].read_bytes()
                data = base64.b64encode(raw).decode("ascii")
                width = _png_width(raw)
                least = f" style='min-width:{math.ceil(width * MIN_PLOT_SCALE)}px'" if width else ""
                out.append(
                    f"<figure><img alt='{e(b[2])}'{least} src='data:image/png;base64,{data}'>"
                    f"<figcaption>{e(b[2])}</figcaption></figure>"
                )
        out.append("</body></html>")
        return "\n".join(out)

    @staticmethod
    def _html_table(df: pd.DataFrame, label: str) -> str:
        """One table inside its own scroll box (keyboard-focusable, labelled for screen readers)."""
        e = _escape
        rows = ["<tr>" + "".join(f"<th>{e(str(c))}</th>" for c in df.columns) + "</tr>"]
        for row in df.itertuples(index=False, name=None):
            cells = []
            for v in row:
                text = format_value(v)
                cls = text if text in _STATUS else ("long" if len(text) > _LONG_CELL else "")
                shown = f"<a href='{e(v.href)}'>{e(text)}</a>" if isinstance(v, Link) else e(text)
                cells.append(f"<td class='{cls}'>{shown}</td>" if cls else f"<td>{shown}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        return (
            f"<div class='table-wrap' tabindex='0' role='region' aria-label='{e(label)}'>"
            f"<table>{''.join(rows)}</table></div>"
        )

    @staticmethod
    def _inline(text: str) -> str:
        """Escape, then render **bold** and `code` spans (the only inline Markdown the report uses)."""
        t = _escape(text)
        t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
        t = re.sub(r"`(.+?)`", r"<code>\1</code>", t)
        return t
