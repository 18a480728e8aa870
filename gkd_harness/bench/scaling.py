"""The scaling table of ``gkd-bench``: time and peak memory of upstream and ``fp32`` against N (full vocabulary) and
k (top-k), with the measured exponent (least-squares slope of log(figure) against log(size)).

Inputs are the rows of :func:`gkd_harness.bench.cli.compute_rows` (each loss row carries its ``shape``); torch-free.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

#: (title, size key, groups in size order, the fixed size named in the title)
SERIES = (
    ("full vocabulary", "n", ("full", "full_n4", "full_n16"), "v"),
    ("top-k", "k", ("topk_k8", "topk", "topk_k512"), "n"),
)
VARIANTS = ("upstream", "fp32")


def exponent(xs: Sequence[float], ys: Sequence[Optional[float]]) -> Optional[float]:
    """Least-squares slope of ``log y`` against ``log x`` over the points where ``y`` is known (None if < 2)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y is not None and y > 0 and x > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx > 0 else None


def _fmt(x: Optional[float], f: str = "{:.0f}") -> str:
    return "–" if x is None else f.format(x)


def scaling_series(rows: List[Dict]) -> List[Dict]:
    """One dict per series with its points: ``{"title", "key", "fixed", "points": [{size, variant: {ms, mib,
    skipped}}], "exponents": {variant: {"time", "mem"}}}``; series without any measured row are left out."""
    by = {r["name"]: r for r in rows}
    out = []
    for title, key, groups, fixed_key in SERIES:
        points, fixed = [], None
        for g in groups:
            cells = {v: by.get(f"{g}/{v}") for v in VARIANTS}
            shape = next((c.get("shape") for c in cells.values() if c and c.get("shape")), None)
            if not shape:
                continue
            fixed = shape.get(fixed_key)
            points.append(
                {
                    "size": shape[key],
                    **{
                        v: (
                            {}
                            if c is None
                            else {
                                "ms": c.get("median_ms"),
                                "mib": c.get("peak_mib"),
                                "skipped": c.get("skipped"),
                                "name": c["name"],
                            }
                        )
                        for v, c in cells.items()
                    },
                }
            )
        if len(points) < 2:
            continue
        xs = [p["size"] for p in points]
        exps = {
            v: {
                "time": exponent(xs, [p[v].get("ms") for p in points]),
                "mem": exponent(xs, [p[v].get("mib") for p in points]),
            }
            for v in VARIANTS
        }
        out.append(
            {"title": title, "key": key, "fixed_key": fixed_key, "fixed": fixed, "points": points, "exponents": exps}
        )
    return out


def format_scaling(rows: List[Dict], tlabel: str = "time") -> str:
    """Markdown: one table per series, then the exponent row; empty when no scaling groups were measured."""
    parts = []
    for s in scaling_series(rows):
        fixed = f"{s['fixed_key'].upper()} = {s['fixed']:,}" if s["fixed"] else ""
        parts += [
            f"**{s['title']}** ({fixed}; {tlabel} ms of one forward+backward, peak MiB above the inputs)",
            "",
            f"| {s['key']} | upstream ms | fp32 ms | fp32 ÷ upstream | upstream peak MiB | fp32 peak MiB | "
            "mem ÷ upstream |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in s["points"]:
            up, fp = p["upstream"], p["fp32"]
            cells = []
            for c, f in ((up, "ms"), (fp, "ms")):
                cells.append("not run" if c.get("skipped") else _fmt(c.get(f), "{:.1f}"))
            tr = (fp["ms"] / up["ms"]) if up.get("ms") and fp.get("ms") else None
            mems = ["not run" if c.get("skipped") else _fmt(c.get("mib")) for c in (up, fp)]
            mr = (fp["mib"] / up["mib"]) if up.get("mib") and fp.get("mib") else None
            parts.append(
                f"| {p['size']:,} | {cells[0]} | {cells[1]} | {_fmt(tr, '{:.3f}')} | {mems[0]} | {mems[1]} | "
                f"{_fmt(mr, '{:.3f}')} |"
            )
        e = s["exponents"]
        parts.append(
            f"| exponent (time, memory ∝ {s['key']}^e) | {_fmt(e['upstream']['time'], '{:.2f}')} | "
            f"{_fmt(e['fp32']['time'], '{:.2f}')} |  | {_fmt(e['upstream']['mem'], '{:.2f}')} | "
            f"{_fmt(e['fp32']['mem'], '{:.2f}')} |  |"
        )
        skipped = [
            f"`{p[v]['name']}` ({s['key']} = {p['size']:,}): {p[v]['skipped']}"
            for p in s["points"]
            for v in VARIANTS
            if p[v].get("skipped")
        ]
        parts += [""] + [f"- {v}" for v in skipped] + ([""] if skipped else [])
    return "\n".join(parts).rstrip()
