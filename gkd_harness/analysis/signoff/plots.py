"""PNG plots of the comparison tables (matplotlib, Agg backend; no display needed).

Each ``plot_*`` function takes the tables of :mod:`gkd_harness.analysis.signoff.compare` / :mod:`gkd_harness.analysis.signoff.betacurve`, writes one
PNG at :data:`DPI` dots per inch and returns its path (``None`` when there is nothing to draw).

Conventions shared by every figure:

* a *variant* is ``(loss.precision, loss.beta_form)``; :func:`variant_style` gives each one its own colour,
  marker and line style, the same in every figure (native = filled markers, fp32/fp64 = hollow, larger
  markers, so curves that coincide stay visible as concentric marks);
* axes carry labels with units; each figure has exactly one legend (a figure legend below the axes).
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import matplotlib

from gkd_harness.harness.contract import (
    BUILTIN_PRECISIONS,
    CONTINUOUS,
    FP32,
    FP64,
    JSD_LOSS,
    NATIVE,
    PAPER,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator  # noqa: E402

__all__ = [
    "DPI",
    "METRIC_UNITS",
    "envelope",
    "variant_style",
    "variant_label",
    "plot_curves",
    "plot_negatives",
    "plot_spot_errors",
    "plot_beta_curve",
]

#: Resolution of every PNG.
DPI = 150
#: Axis label (with unit) of the logged metrics.
METRIC_UNITS = {
    TRAIN_LOSS: "train/loss\n(nats per position)",
    JSD_LOSS: "gkd/jsd_loss\n(nats per position)",
    TRAIN_GRAD_NORM: "train/grad_norm\n(global L2 norm, before clipping)",
}
_DIFF_UNITS = {TRAIN_LOSS: "nats per position", JSD_LOSS: "nats per position", TRAIN_GRAD_NORM: "L2 norm"}
_LOG_FLOOR = 1e-12
#: Most points drawn per line: longer lines are drawn through their min/max envelope (:func:`envelope`).
_MAX_DRAWN_POINTS = 4000
_MAX_MARKED_RUNS = 3  # runs of one variant in a panel drawn individually with markers; more: median + min-max band
_RC: Dict[Any, Any] = {  # matplotlib types the keys as the Literal of every rc name
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "figure.titlesize": 11,
}
#: zlib level of the PNGs (lossless at any level; see :func:`_save`).
_PNG_COMPRESS_LEVEL = 3
_MAX_WIDTH_IN = 11.0  # 1650 px at 150 dpi: shown at ~1150 px in the HTML, text stays >= 9 px

# Known variants: native in warm colours with filled markers, fp32 in blue/purple, fp64 in green/brown,
# hollow markers for the patched precisions so that a curve drawn over an identical one stays visible.
_KNOWN = {
    (NATIVE, PAPER): dict(color="#d62728", marker="o", ls="-", mfc="fill", ms=5),
    (NATIVE, CONTINUOUS): dict(color="#ff7f0e", marker="s", ls="-", mfc="fill", ms=7.5),
    (FP32, PAPER): dict(color="#1f77b4", marker="^", ls="--", mfc="none", ms=9),
    (FP32, CONTINUOUS): dict(color="#9467bd", marker="D", ls="--", mfc="none", ms=8),
    (FP64, PAPER): dict(color="#2ca02c", marker="v", ls=":", mfc="none", ms=10),
    (FP64, CONTINUOUS): dict(color="#8c564b", marker="P", ls=":", mfc="none", ms=10),
}
# Difference curves (native − fp32) are not variants: dark greys, one marker per β form.
_DIFF_STYLES = {
    PAPER: dict(color="#222222", marker="o", markerfacecolor="none", markersize=6),
    CONTINUOUS: dict(color="#777777", marker="s", markerfacecolor="none", markersize=8.5),
}
_SPARE = [("#e377c2", "X"), ("#17becf", "h"), ("#bcbd22", "*"), ("#7f7f7f", "p"), ("#393b79", "<"), ("#637939", ">")]


def variant_label(precision, form) -> str:
    """Legend text of a variant, e.g. ``"native · paper"``."""
    return f"{precision} · {form}"


def variant_style(precision, form) -> dict:
    """Matplotlib line keywords (color, marker, linestyle, markerfacecolor, markersize) of a variant.

    Variants outside the six known ones get a spare colour/marker chosen from a stable hash of the name.
    """
    key = (str(precision), str(form))
    if key in _KNOWN:
        s = dict(_KNOWN[key])
    else:
        h = sum(ord(c) * (i + 1) for i, c in enumerate("|".join(key))) % len(_SPARE)
        color, marker = _SPARE[h]
        s = dict(color=color, marker=marker, ls="-.", mfc="none", ms=8)
    mfc = s.pop("mfc")
    return {
        "color": s["color"],
        "marker": s["marker"],
        "linestyle": s["ls"],
        "markersize": s["ms"],
        "markerfacecolor": s["color"] if mfc == "fill" else "none",
        "markeredgecolor": s["color"],
    }


def _variants(df: pd.DataFrame) -> list:
    """Sorted distinct (precision, form) pairs of a table with ``loss.precision`` and ``loss.beta_form``."""
    order: Dict[str, int] = {p: i for i, p in enumerate(BUILTIN_PRECISIONS)}
    pairs = df[["loss.precision", "loss.beta_form"]].drop_duplicates().astype(str).itertuples(index=False, name=None)
    return sorted(pairs, key=lambda p: (order.get(p[0], 9), p[0], p[1]))


def _save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at :data:`DPI` and close it.

    The constrained layout is computed once, here, at the PNG's resolution, and then switched off: ``savefig``
    with a layout engine would draw the whole figure twice (a layout pass with rendering disabled, then the
    PNG). The pixels are the same either way. The PNG is deflated at zlib level :data:`_PNG_COMPRESS_LEVEL`
    (lossless; PIL's default 6 took ~40% longer to encode these mostly white figures for files ~13% smaller)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.set_dpi(DPI)
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
        fig.set_layout_engine(None)
    fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": _PNG_COMPRESS_LEVEL})
    plt.close(fig)
    return path


def _legend(fig, handles: Sequence, labels: Sequence[str]) -> None:
    """The figure's single legend, below the axes (constrained layout makes room for it)."""
    if handles:
        longest = max(len(x) for x in labels)
        fits = max(1, int(fig.get_figwidth() / (0.09 * longest + 0.6)))  # ~0.09 in per 9-pt character
        fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(handles), fits), frameon=False)


def _series_by_run(h: pd.DataFrame, metric: str) -> dict:
    """``{run: (steps [n], values [n])}`` of ``metric``'s logged (non-NaN) values, each run sorted by step.

    One sort of the whole column, then a split at the run boundaries: no per-run DataFrame."""
    data = h[["run", "step", metric]]
    values = data[metric].to_numpy(dtype=float)
    keep = ~np.isnan(values) & data["run"].notna().to_numpy() & data["step"].notna().to_numpy()
    codes, names = pd.factorize(data["run"].to_numpy()[keep])
    steps, values = data["step"].to_numpy()[keep], values[keep]
    order = np.lexsort((steps, codes))
    codes, steps, values = codes[order], steps[order], values[order]
    cuts = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(codes)]))
    return {names[codes[a]]: (steps[a:b], values[a:b]) for a, b in zip(starts, ends) if b > a}


def _paired_difference(sweep, runs: pd.DataFrame, metric: str, by_run: Optional[dict] = None) -> list:
    """Native − fp32 of ``metric`` on common steps for runs equal in every other config key.

    ``by_run``: :func:`_series_by_run` of the sweep's history, when the caller has it already.
    Returns ``[(beta, form, steps [n], diff [n])]``.
    """
    from gkd_harness.analysis.signoff.compare import paired_runs

    pairs = paired_runs(runs, "loss.precision", "native", "fp32", getattr(sweep, "plan", None))
    if not pairs:
        return []
    if by_run is None:
        by_run = _series_by_run(sweep.history, metric)
    row_of: dict = {}
    for i, name in enumerate(runs["run"]):
        row_of.setdefault(name, i)  # the first row of a run, as a boolean selection's .iloc[0]
    out = []
    for native, fp32 in pairs:
        if native not in by_run or fp32 not in by_run:
            continue
        (sa, va), (sb, vb) = by_run[native], by_run[fp32]
        # history holds one row per (run, step): steps are unique per run, so this is the inner join on step
        common, ia, ib = np.intersect1d(sa, sb, assume_unique=True, return_indices=True)
        if not len(common):
            continue
        r = runs.iloc[row_of[native]]
        out.append((r["gkd.beta"], str(r["loss.beta_form"]), common, va[ia] - vb[ib]))
    return out


def envelope(x: np.ndarray, y: np.ndarray, max_points: Optional[int] = None) -> tuple:
    """The points of the line ``(x, y)`` that drawing needs, at most about ``max_points`` of them.

    A line of ``n <= max_points`` points is returned unchanged. A longer one (``x`` ascending) is cut into
    ``max_points // 4`` bins of equal width in ``x`` (more bins than a panel has pixel columns at :data:`DPI`),
    and each bin keeps its first and last point and the points of its minimum and maximum, in ``x`` order: the
    min/max envelope of the line per bin. Every extreme survives (a single negative value among 10⁶ points
    is still drawn, at its own step and value), and every non-finite point (NaN, ±Inf) is kept as well.
    """
    x, y = np.asarray(x), np.asarray(y, dtype=float)
    keep = _envelope_index(x, y, max_points)
    return (x, y) if keep is None else (x[keep], y[keep])


def _envelope_index(x: np.ndarray, y: np.ndarray, max_points: Optional[int] = None) -> Optional[np.ndarray]:
    """The sorted indices :func:`envelope` keeps of ``(x, y)``; None when the line is kept whole."""
    max_points = _MAX_DRAWN_POINTS if max_points is None else int(max_points)
    n = len(x)
    if n <= max(max_points, 8):
        return None
    bins = max(2, max_points // 4)
    xf = x.astype(float)
    span = xf[-1] - xf[0]
    if not span > 0:
        b = np.zeros(n, dtype=np.int64)
    else:
        b = np.minimum(((xf - xf[0]) * (bins / span)).astype(np.int64), bins - 1)
    finite = np.isfinite(y)
    yk = np.where(finite, y, 0.0)  # non-finite points are kept below; they must not be a bin's min or max
    order = np.lexsort((yk, b))  # by bin, then by value: each bin's first entry is its minimum, last its maximum
    sb = b[order]
    first_of = np.flatnonzero(np.r_[True, sb[1:] != sb[:-1]])
    last_of = np.r_[first_of[1:] - 1, n - 1]
    # the first/last point of each bin (x is ascending, so bins are contiguous runs of indices)
    edges = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    keep = np.concatenate(
        (order[first_of], order[last_of], edges, np.r_[edges[1:] - 1, n - 1], np.flatnonzero(~finite))
    )
    return np.unique(keep)


def _spread(series: list) -> tuple:
    """Per step over the runs ``[(steps [n], values [n])]``: ``(steps [m], min [m], max [m], median [m])``, steps
    ascending. min/max over the finite values (NaN where a step has none); the median over the non-NaN values."""
    x0 = series[0][0]
    if all(len(x) == len(x0) and np.array_equal(x, x0) for x, _ in series[1:]):  # the usual case: same steps
        mx, table = np.asarray(x0), np.vstack([np.asarray(y, dtype=float) for _, y in series])
        if not np.all(np.diff(mx) > 0):
            o = np.argsort(mx, kind="stable")
            mx, table = mx[o], table[:, o]
    else:
        frame = pd.concat([pd.Series(np.asarray(y, dtype=float), index=x) for x, y in series], axis=1).sort_index()
        mx, table = frame.index.to_numpy(), frame.to_numpy().T
    finite = np.where(np.isfinite(table), table, np.nan)
    with warnings.catch_warnings():  # a step no run logged a finite value at: NaN, a gap in the band
        warnings.simplefilter("ignore", RuntimeWarning)
        return mx, np.nanmin(finite, axis=0), np.nanmax(finite, axis=0), np.nanmedian(table, axis=0)


def _draw_series(ax, series: list, style: dict):
    """Draw ``[(steps [n], values [n])]`` of one variant on ``ax``; returns the line for the legend (or None).

    Up to :data:`_MAX_MARKED_RUNS` series: each with the variant's markers. More: a shaded band from the
    smallest to the largest value of the series at each step (finite values), plus the median over the series
    per step with markers, so that many seeds stay readable (one polygon instead of a line per run). Long lines
    and bands are drawn through their min/max :func:`envelope` (every extreme kept)."""
    if not series:
        return None
    marked = dict(style)
    if len(series) <= _MAX_MARKED_RUNS:
        ln = None
        for x, y in series:
            x, y = envelope(x, y)
            (ln,) = ax.plot(x, y, lw=1.0, alpha=0.9, markevery=max(1, len(x) // 10), **marked)
        return ln
    mx, lo, hi, my = _spread(series)
    bx, keep = mx, _envelope_index(mx, lo)
    keep_hi = _envelope_index(mx, hi)
    if keep is not None and keep_hi is not None:  # a long band: each bin's extremes of both edges (same length)
        keep = np.union1d(keep, keep_hi)
        bx, lo, hi = mx[keep], lo[keep], hi[keep]
    ax.fill_between(bx, lo, hi, color=style["color"], alpha=0.2, lw=0)
    mx, my = envelope(mx, my)
    (ln,) = ax.plot(mx, my, lw=1.6, markevery=max(1, len(mx) // 10), **marked)
    return ln


def plot_curves(sweep, metric: str, path: Path, max_panels: int = 16) -> Optional[Path]:
    """``metric`` against the optimizer step: one panel per β, one line per run in its variant's style
    (a variant with more than 3 runs in a panel: the band of its runs, min to max per step, and their median
    with markers).

    Where the sweep has native/fp32 pairs (runs equal in every other config key), a panel under each β
    shows native − fp32 step by step: the two curves often coincide to the eye, the difference does not.
    At most ``max_panels`` β values are drawn (the title says when some were left out).
    """
    h = sweep.history
    if metric not in h.columns or h[metric].notna().sum() == 0:
        return None
    runs = sweep.runs
    betas = sorted(runs["gkd.beta"].dropna().unique().tolist())
    shown = betas[:max_panels]
    by_run = _series_by_run(h, metric)
    diffs = [d for d in _paired_difference(sweep, runs, metric, by_run) if d[0] in shown]
    n = len(shown)
    cols = min(3, n)
    grid_rows = int(np.ceil(n / cols))
    per_row = 2 if diffs else 1
    ratios = ([3, 1.3] if diffs else [1]) * grid_rows
    width = min(_MAX_WIDTH_IN, max(6.5, 3.7 * cols))
    height = sum(ratios) * (1.0 if diffs else 3.0) + 1.4
    with plt.rc_context(_RC):
        fig = plt.figure(figsize=(width, height), layout="constrained")
        gs = fig.add_gridspec(grid_rows * per_row, cols, height_ratios=ratios)
        handles: Dict[str, Any] = {}
        for i, beta in enumerate(shown):
            row, col = divmod(i, cols)
            ax = fig.add_subplot(gs[row * per_row, col])
            sel = runs[runs["gkd.beta"] == beta]
            for prec, form in _variants(sel):
                st = variant_style(prec, form)
                grp = sel[(sel["loss.precision"].astype(str) == prec) & (sel["loss.beta_form"].astype(str) == form)]
                series = [by_run[r] for r in grp["run"] if r in by_run]
                ln = _draw_series(ax, series, st)
                if ln is not None:
                    handles.setdefault(variant_label(prec, form), ln)
            ax.set_title(f"β = {beta:g} ({len(sel)} runs)")
            ax.set_ylabel(METRIC_UNITS.get(metric, metric) if col == 0 else "")
            ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
            ax.grid(alpha=0.3)
            if not diffs:
                ax.set_xlabel("optimizer step")
                continue
            ax.tick_params(labelbottom=False)
            dax = fig.add_subplot(gs[row * per_row + 1, col], sharex=ax)
            dax.axhline(0.0, color="0.3", lw=0.8)
            here = [d for d in diffs if d[0] == beta]
            for form in sorted({d[1] for d in here}):
                ln = _draw_series(
                    dax,
                    [(st_, df_) for _, f, st_, df_ in here if f == form],
                    _DIFF_STYLES.get(form, _DIFF_STYLES[PAPER]),
                )
                handles.setdefault(f"native − fp32 · {form}", ln)
            if not here:
                dax.text(
                    0.5, 0.5, "no native/fp32 pair", transform=dax.transAxes, ha="center", va="center", color="0.4"
                )
            dax.set_xlabel("optimizer step")
            dax.set_ylabel(f"native − fp32\n({_DIFF_UNITS.get(metric, 'same unit')})" if col == 0 else "")
            dax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
            dax.grid(alpha=0.3)
        more = f"; first {len(shown)} of {len(betas)} β values" if len(shown) < len(betas) else ""
        many = " (more than 3 runs of a variant: band = runs' min–max, marked line = median)"
        busiest = runs.groupby(["gkd.beta", "loss.precision", "loss.beta_form"], dropna=False).size().max()
        fig.suptitle(f"{metric} per optimizer step{more}" + (many if busiest > _MAX_MARKED_RUNS else ""))
        _legend(fig, list(handles.values()), list(handles.keys()))
        return _save(fig, path)


def _bar_values(g: pd.DataFrame) -> tuple:
    """Negative-call fraction and max negative-token fraction of one group; NaN where nothing was logged."""
    calls = g["loss_calls"].sum(min_count=1)
    neg = g["neg_loss_calls"].sum(min_count=1)
    frac = neg / calls if pd.notna(calls) and calls > 0 and pd.notna(neg) else np.nan
    tok = g["neg_token_frac_max"].max() if g["neg_token_frac_max"].notna().any() else np.nan
    return frac, tok


def _fmt_bar(v: float) -> str:
    return "0" if v == 0 else f"{v:.2g}"


def plot_negatives(neg: pd.DataFrame, path: Path) -> Optional[Path]:
    """Grouped bars per β, one bar per variant: negative-loss calls / loss calls (top) and the max share of
    positions with JSD < 0 (bottom). Every bar carries its value; 0 is a hollow mark in the variant's colour
    labelled "0", and a value that was not logged is a hatched grey bar labelled "n/a"."""
    if neg.empty or neg["neg_loss_calls"].isna().all():
        return None
    variants = _variants(neg)
    betas = sorted(neg["gkd.beta"].dropna().unique().tolist())
    nb, nv = len(betas), len(variants)
    width = 0.8 / nv
    many = nb * nv > 8  # vertical value labels so neighbours cannot run into each other
    with plt.rc_context(_RC):
        fig, axes = plt.subplots(
            2, 1, figsize=(min(_MAX_WIDTH_IN, max(6.5, 0.45 * nb * nv + 2)), 7.0), layout="constrained"
        )
        handles: Dict[str, Any] = {}
        for ax, which, ylabel in (
            (axes[0], 0, "negative-loss calls / loss calls\n(fraction of calls)"),
            (axes[1], 1, "max share of positions\nwith JSD < 0 (fraction)"),
        ):
            vals = []
            for i, beta in enumerate(betas):
                for j, (prec, form) in enumerate(variants):
                    g = neg[
                        (neg["gkd.beta"] == beta)
                        & (neg["loss.precision"].astype(str) == prec)
                        & (neg["loss.beta_form"].astype(str) == form)
                    ]
                    if g.empty:
                        continue
                    v = _bar_values(g)[which]
                    vals.append((i - 0.4 + width * (j + 0.5), v, prec, form))
            top = max([v for _, v, _, _ in vals if pd.notna(v)] + [0.0])
            ymax = max(0.05, top * (1.5 if many else 1.3))
            zero_h = ymax * 0.025  # height of the hollow mark drawn for 0
            min_h = ymax * 0.006  # smallest drawn height of a non-zero bar
            for x, v, prec, form in vals:
                st = variant_style(prec, form)
                if pd.isna(v):
                    ax.bar(x, ymax * 0.06, width * 0.9, color="none", edgecolor="0.5", hatch="///", lw=0.8)
                    ax.text(
                        x,
                        ymax * 0.07,
                        "n/a",
                        ha="center",
                        va="bottom",
                        fontsize=8,
                        color="0.35",
                        rotation=90 if many else 0,
                    )
                    continue
                if v == 0:  # zero: a hollow mark in the variant's colour, labelled "0"
                    ax.bar(x, zero_h, width * 0.9, color="white", edgecolor=st["color"], lw=1.2)
                else:  # filled bar; a tiny value keeps a visible height, its label gives the value
                    b = ax.bar(x, max(v, min_h), width * 0.9, color=st["color"], edgecolor=st["color"])
                    handles.setdefault(variant_label(prec, form), b.patches[0])
                ax.text(
                    x,
                    max(v, zero_h if v == 0 else min_h) + ymax * 0.01,
                    _fmt_bar(v),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    rotation=90 if many else 0,
                )
            ax.axhline(0.0, color="k", lw=0.9)
            ax.set_ylim(0, ymax)
            ax.set_xticks(range(nb), [f"β = {b:g}" for b in betas], rotation=45 if nb > 8 else 0)
            ax.set_xlim(-0.6, nb - 0.4)
            ax.set_ylabel(ylabel)
            ax.set_xlabel("β (bars: variants, summed over runs)")
            ax.grid(axis="y", alpha=0.3)
        for prec, form in variants:  # a variant whose values are all 0 still gets its legend entry
            st = variant_style(prec, form)
            handles.setdefault(variant_label(prec, form), Patch(facecolor=st["color"], edgecolor=st["color"]))
        handles["0 (hollow mark)"] = Patch(facecolor="white", edgecolor="0.2")
        handles["not logged (n/a)"] = Patch(facecolor="none", edgecolor="0.5", hatch="///")
        fig.suptitle("Negative-loss calls and negative-token share per β and variant")
        _legend(fig, list(handles.values()), list(handles.keys()))
        return _save(fig, path)


_SPOT_TITLES = {
    "rel_err": "loss: |loss − FP64| / |FP64|",
    "grad_rel_l2": "d loss / d logits: relative L2",
    "param_grad_rel_l2": "parameter gradient: relative L2",
}


def _wide_log_axis_without_minor_ticks(ax, max_decades: float = 4.0) -> None:
    """On a log y axis spanning more than ``max_decades`` decades, no minor ticks: at that span they are eight
    unlabelled marks per decade that crowd each other, and each is a matplotlib tick to lay out (the spot-check
    errors span ~10 decades: 240 ticks, half the figure's layout time). The major ticks keep their labels."""
    lo, hi = ax.dataLim.intervaly
    if lo > 0 and hi > 0 and np.log10(hi / lo) > max_decades:
        ax.yaxis.set_minor_locator(NullLocator())


def plot_spot_errors(
    spots: pd.DataFrame,
    path: Path,
    grad_tol: float,
    loss_rtol: Optional[float] = None,
    param_grad_tol: Optional[float] = None,
) -> Optional[Path]:
    """Spot-check errors on a log scale, per variant and dtype mix: loss relative error, logit-gradient and
    parameter-gradient relative L2 (dimensionless). Boxes show the spread, points every check; zeros are
    drawn at 1e-12.

    Each panel carries its sign-off tolerance as a dashed line: ``grad_tol`` on the logit-gradient panel,
    ``param_grad_tol`` on the parameter-gradient panel (None: report only, no line), ``loss_rtol`` on the loss
    panel: ``|loss - FP64| <= rtol*|FP64| + atol`` is ``rel_err <= rtol + atol/|FP64|``, so the line at ``rtol``
    is the tolerance's floor (each check's own allowance lies above it by ``atol/|FP64|``)."""
    if spots.empty:
        return None
    metrics = [m for m in ("rel_err", "grad_rel_l2", "param_grad_rel_l2") if spots[m].notna().any()]
    if not metrics:
        return None
    keys = ["loss.precision", "loss.beta_form", "mixed_dtypes"]
    groups = [(k, g) for k, g in spots.groupby(keys, dropna=False)]
    order: Dict[str, int] = {p: i for i, p in enumerate(BUILTIN_PRECISIONS)}
    groups.sort(key=lambda kg: (order.get(str(kg[0][0]), 9), str(kg[0][1]), bool(kg[0][2])))
    rng = np.random.default_rng(0)
    with plt.rc_context(_RC):
        fig, axes = plt.subplots(
            1,
            len(metrics),
            figsize=(min(_MAX_WIDTH_IN, 3.7 * len(metrics) + 0.6), 4.6),
            squeeze=False,
            layout="constrained",
        )
        handles: Dict[str, Any] = {}
        for ax, m in zip(axes.flat, metrics):
            pos, labels = 0, []
            for (prec, form, mixed), g in groups:
                v = g[m].dropna().to_numpy(dtype=float)
                if not len(v):
                    continue
                pos += 1
                st = variant_style(prec, form)
                v = np.maximum(v, _LOG_FLOOR)
                bp = ax.boxplot([v], positions=[pos], widths=0.6, showfliers=False, patch_artist=True)
                bp["boxes"][0].set(facecolor=st["color"], alpha=0.25, edgecolor=st["color"])
                for k in ("medians", "whiskers", "caps"):
                    for artist in bp[k]:
                        artist.set(color=st["color"])
                ln = ax.plot(
                    pos + rng.uniform(-0.15, 0.15, len(v)),
                    v,
                    ls="none",
                    **{k: st[k] for k in ("marker", "color", "markerfacecolor", "markeredgecolor")},
                    markersize=5,
                    alpha=0.8,
                )[0]
                handles.setdefault(variant_label(prec, form), ln)
                labels.append(f"{prec}\n{form}\n{'mixed' if bool(mixed) else 'same'}")
            ax.set_xticks(range(1, pos + 1), labels)
            ax.set_xlim(0.4, pos + 0.6)
            ax.set_yscale("log")
            _wide_log_axis_without_minor_ticks(ax)
            tol = {"rel_err": loss_rtol, "grad_rel_l2": grad_tol, "param_grad_rel_l2": param_grad_tol}[m]
            if tol is not None:
                label = f"loss tolerance: rtol {tol:g} (+ atol/|FP64|)" if m == "rel_err" else f"tolerance {tol:g}"
                line = ax.axhline(tol, color="k", ls="--" if m != "rel_err" else ":", lw=0.9, label=label)
                handles.setdefault(label, line)
            ax.set_title(_SPOT_TITLES[m])
            ax.set_xlabel("variant; dtypes at the loss:\nmixed = BF16/FP16 on one side only")
            ax.grid(axis="y", alpha=0.3)
        axes[0, 0].set_ylabel("relative error vs FP64 (dimensionless, log)")
        fig.suptitle("FP64 spot checks: errors per variant")
        _legend(fig, list(handles.values()), list(handles.keys()))
        return _save(fig, path)


def plot_beta_curve(
    fp64_curve: pd.DataFrame,
    training: pd.DataFrame,
    path: Path,
    metrics: Sequence[str] = (TRAIN_LOSS, TRAIN_GRAD_NORM),
    first_steps: Optional[int] = None,
) -> Path:
    """FP64 D(β) of both forms (endpoints circled); next to it, only when the sweep trained at two or more
    β values, the training loss / grad_norm of the first logged steps against β, one series per variant."""
    show = [m for m in metrics if not training.empty and m in training.columns and training["gkd.beta"].nunique() >= 2]
    panels = 1 + len(show)
    endpoint = Line2D(
        [],
        [],
        ls="none",
        marker="o",
        markersize=11,
        markerfacecolor="none",
        markeredgecolor="k",
        label="β ∈ {0, 1}: KL(T‖S), KL(S‖T)",
    )
    with plt.rc_context(_RC):
        fig, axes = plt.subplots(
            1,
            panels,
            figsize=(min(_MAX_WIDTH_IN, max(6.5, 4.4 * panels + 0.4)), 4.6),
            squeeze=False,
            layout="constrained",
        )
        handles: Dict[str, Any] = {}
        ax = axes[0, 0]
        for form, g in fp64_curve.groupby("form", sort=False):
            inner = g[(g["beta"] > 0) & (g["beta"] < 1)]
            st = variant_style("fp64", form)
            (ln,) = ax.plot(inner["beta"], inner["D"], lw=1.3, **{**st, "markersize": 6, "linestyle": "-"})
            handles.setdefault(f"FP64 D(β) · {form} (0 < β < 1)", ln)
        ends = fp64_curve[fp64_curve["beta"].isin([0.0, 1.0])].drop_duplicates("beta")
        ax.plot(
            ends["beta"],
            ends["D"],
            ls="none",
            marker="o",
            markersize=11,
            markerfacecolor="none",
            markeredgecolor="k",
            zorder=5,
        )
        handles[str(endpoint.get_label())] = endpoint
        ax.set_xlabel("β")
        ax.set_ylabel("D(β), mean per position (nats, FP64)")
        src = fp64_curve["source"].iloc[0] if "source" in fp64_curve else ""
        per_line = int(fig.get_figwidth() / panels * 11)  # ~11 characters of 10-pt text per inch
        ax.set_title(textwrap.fill(f"FP64 D(β) on {src} inputs", per_line, break_long_words=True))
        ax.grid(alpha=0.3)
        for ax, m in zip(axes.flat[1:], show):
            for prec, form in _variants(training):
                g = training[
                    (training["loss.precision"].astype(str) == prec) & (training["loss.beta_form"].astype(str) == form)
                ].sort_values("gkd.beta")
                (ln,) = ax.plot(g["gkd.beta"], g[m], lw=1.1, **variant_style(prec, form))
                handles.setdefault(variant_label(prec, form), ln)
                e = g[g["gkd.beta"].isin([0.0, 1.0])]
                ax.plot(
                    e["gkd.beta"],
                    e[m],
                    ls="none",
                    marker="o",
                    markersize=11,
                    markerfacecolor="none",
                    markeredgecolor="k",
                    zorder=5,
                )
            ax.set_xlabel("β")
            ax.set_ylabel(METRIC_UNITS.get(m, m))
            steps = f"first {first_steps} steps" if first_steps else "first steps"
            ax.set_title(f"{m.split('/')[-1]}, mean of the {steps}")
            ax.grid(alpha=0.3)
        _legend(fig, list(handles.values()), list(handles.keys()))
        return _save(fig, path)
