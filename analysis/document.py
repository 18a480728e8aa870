"""A small report document rendered twice: Markdown, and self-contained HTML (images inlined as base64).

Both renderings come from the same block list, so the HTML is the same report as the Markdown.
"""
from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

__all__ = ["Document", "format_value"]


def format_value(v) -> str:
    """Table cell text: floats with 4 significant digits, None/NaN as an empty cell."""
    if v is None:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return ""
        if v == int(v) and abs(v) < 1e6:
            return f"{v:.0f}" if abs(v) >= 1 or v == 0 else f"{v:.4g}"
        return f"{v:.4g}"
    return str(v)


@dataclass
class Document:
    title: str
    blocks: list = field(default_factory=list)

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

    # -- Markdown -----------------------------------------------------------------------------------
    @staticmethod
    def _md_cell(v) -> str:
        return format_value(v).replace("|", "\\|").replace("\n", " ")

    def to_markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out += ["#" * b[1] + " " + b[2], ""]
            elif kind == "p":
                out += [b[1], ""]
            elif kind == "ul":
                out += [f"- {x}" for x in b[1]] + [""]
            elif kind == "code":
                out += ["```", b[1], "```", ""]
            elif kind == "table":
                df, max_rows, caption = b[1], b[2], b[3]
                if caption:
                    out += [f"*{caption}*", ""]
                if df.empty:
                    out += ["(no rows)", ""]
                    continue
                shown = df.head(max_rows)
                cols = [str(c) for c in shown.columns]
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |")
                out.append("|" + "---|" * len(cols))
                for row in shown.itertuples(index=False, name=None):
                    out.append("| " + " | ".join(self._md_cell(v) for v in row) + " |")
                if len(df) > max_rows:
                    out.append(f"\n({len(df) - max_rows} more rows not shown)")
                out.append("")
            elif kind == "img":
                out += [f"![{b[2]}]({b[1].name})", "", f"*{b[2]}*", ""]
        return "\n".join(out)

    # -- HTML ---------------------------------------------------------------------------------------
    def to_html(self) -> str:
        e = html.escape
        out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{e(self.title)}</title>",
               "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
               "table{border-collapse:collapse;font-size:12px;margin:0.5em 0}td,th{border:1px solid #ccc;"
               "padding:2px 6px;text-align:left}th{background:#f3f3f3}img{max-width:100%}"
               ".pass{color:#080;font-weight:bold}.fail,.not_measured{color:#b00;font-weight:bold}"
               "pre{background:#f6f6f6;padding:0.5em;overflow-x:auto}</style>",
               "</head><body>", f"<h1>{e(self.title)}</h1>"]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
            elif kind == "p":
                out.append(f"<p>{self._inline(b[1])}</p>")
            elif kind == "ul":
                out.append("<ul>" + "".join(f"<li>{self._inline(x)}</li>" for x in b[1]) + "</ul>")
            elif kind == "code":
                out.append(f"<pre>{e(b[1])}</pre>")
            elif kind == "table":
                df, max_rows, caption = b[1], b[2], b[3]
                if caption:
                    out.append(f"<p><em>{e(caption)}</em></p>")
                if df.empty:
                    out.append("<p>(no rows)</p>")
                    continue
                shown = df.head(max_rows)
                rows = ["<tr>" + "".join(f"<th>{e(str(c))}</th>" for c in shown.columns) + "</tr>"]
                for row in shown.itertuples(index=False, name=None):
                    cells = []
                    for v in row:
                        text = format_value(v)
                        cls = f" class='{text}'" if text in ("pass", "fail", "not_measured") else ""
                        cells.append(f"<td{cls}>{e(text)}</td>")
                    rows.append("<tr>" + "".join(cells) + "</tr>")
                out.append("<table>" + "".join(rows) + "</table>")
                if len(df) > max_rows:
                    out.append(f"<p>({len(df) - max_rows} more rows not shown)</p>")
            elif kind == "img":
                data = base64.b64encode(b[1].read_bytes()).decode("ascii")
                out.append(f"<figure><img alt='{e(b[2])}' src='data:image/png;base64,{data}'>"
                           f"<figcaption>{e(b[2])}</figcaption></figure>")
        out.append("</body></html>")
        return "\n".join(out)

    @staticmethod
    def _inline(text: str) -> str:
        """Escape, then render **bold** and `code` spans (the only inline Markdown the report uses)."""
        import re

        t = html.escape(text)
        t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
        t = re.sub(r"`(.+?)`", r"<code>\1</code>", t)
        return t
