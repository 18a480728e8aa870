"""PNG plots of the comparison tables (matplotlib, Agg backend; no display needed).

Each function takes the tables of :mod:`analysis.compare` / :mod:`analysis.betacurve`, writes one PNG and
returns its path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

__all__ = ["plot_curves", "plot_negatives", "plot_spot_errors", "plot_beta_curve"]

_COLORS = {"native": "tab:red", "fp32": "tab:blue", "fp64": "tab:green"}
_LOG_FLOOR = 1e-12


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_curves(sweep, metric: str, path: Path, max_panels: int = 16) -> Optional[Path]:
    """``metric`` against step, one panel per (β, β form), one line per run coloured by precision
    (original = native in red, patched = fp32 in blue)."""
    h = sweep.history
    if metric not in h.columns or h[metric].notna().sum() == 0:
        return None
    runs = sweep.runs.set_index("run")
    keys = runs[["gkd.beta", "loss.beta_form"]].drop_duplicates().sort_values(["gkd.beta", "loss.beta_form"])
    panels = list(keys.itertuples(index=False, name=None))[:max_panels]
    n = len(panels)
    cols = min(4, n)
    rows = int(np.ceil(n / cols))
    height = 2.4 * rows + 0.9
    fig, axes = plt.subplots(rows, cols, figsize=(max(3.6 * cols, 6.0), height), squeeze=False)
    data = h[["run", "step", metric]].dropna()
    by_run = {k: v for k, v in data.groupby("run", sort=False)}
    seen = {}
    for ax, (beta, form) in zip(axes.flat, panels):
        sel = runs[(runs["gkd.beta"] == beta) & (runs["loss.beta_form"] == form)]
        for prec, grp in sel.groupby("loss.precision"):
            segs = [np.column_stack([by_run[r]["step"].to_numpy(), by_run[r][metric].to_numpy()])
                    for r in grp.index if r in by_run]
            if segs:
                lc = LineCollection(segs, colors=_COLORS.get(prec, "gray"), linewidths=0.8, alpha=0.7)
                ax.add_collection(lc)
                seen.setdefault(prec, lc)
        ax.autoscale()
        ax.axhline(0.0, color="0.6", lw=0.5, zorder=0)
        ax.set_title(f"β={beta:g} {form} ({len(sel)} runs)", fontsize=8)
        ax.tick_params(labelsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(4, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(4))
    fig.legend(list(seen.values()), [f"{p}" for p in seen], loc="upper right", fontsize=7, ncol=len(seen))
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"{metric} per step (red: original/native, blue: patched/fp32)", fontsize=10, x=0.02,
                 ha="left")
    fig.subplots_adjust(left=0.08 if cols > 1 else 0.15, right=0.98, bottom=0.35 / height, top=1 - 0.75 / height,
                        wspace=0.35, hspace=0.45)
    return _save(fig, path)


def plot_negatives(neg: pd.DataFrame, path: Path) -> Optional[Path]:
    """Negative-loss calls (share of loss calls) and the max negative-token fraction, per (precision, β, form)."""
    if neg.empty or neg["neg_loss_calls"].isna().all():
        return None
    g = neg.groupby(["loss.precision", "gkd.beta", "loss.beta_form"], dropna=False).agg(
        neg=("neg_loss_calls", "sum"), calls=("loss_calls", "sum"), tok=("neg_token_frac_max", "max")).reset_index()
    labels = [f"{p}\nβ={b:g}\n{f[:4]}" for p, b, f in zip(g["loss.precision"], g["gkd.beta"], g["loss.beta_form"])]
    x = np.arange(len(g))
    fig, axes = plt.subplots(2, 1, figsize=(min(18, max(6, 0.5 * len(g))), 5.5))
    frac = (g["neg"] / g["calls"].replace(0, np.nan)).fillna(0)
    colors = [_COLORS.get(p, "gray") for p in g["loss.precision"]]
    axes[0].bar(x, frac, color=colors)
    axes[0].set_title("negative-loss calls / loss calls", fontsize=9)
    axes[1].bar(x, g["tok"].fillna(0), color=colors)
    axes[1].set_title("max share of positions with JSD < 0", fontsize=9)
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=6)
        ax.set_ylim(0, max(0.05, ax.get_ylim()[1]))
    fig.subplots_adjust(left=0.08, right=0.99, bottom=0.12, top=0.94, hspace=0.6)
    return _save(fig, path)


def plot_spot_errors(spots: pd.DataFrame, path: Path, grad_tol: float = 1e-3) -> Optional[Path]:
    """Spot-check errors on a log scale, per variant (precision, mixed dtypes): loss relative error,
    logit-gradient and parameter-gradient relative L2. Zeros are drawn at 1e-12."""
    if spots.empty:
        return None
    metrics = [m for m in ("rel_err", "grad_rel_l2", "param_grad_rel_l2") if spots[m].notna().any()]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.8 * len(metrics), 3.2), squeeze=False)
    groups = list(spots.groupby(["loss.precision", "mixed_dtypes"], dropna=False))
    for ax, m in zip(axes.flat, metrics):
        data, labels, colors = [], [], []
        for (prec, mixed), g in groups:
            v = g[m].dropna().to_numpy(dtype=float)
            if len(v):
                data.append(np.maximum(v, _LOG_FLOOR))
                labels.append(f"{prec}\n{'bf16 mix' if mixed else 'same'}")
                colors.append(_COLORS.get(prec, "gray"))
        if not data:
            ax.axis("off")
            continue
        bp = ax.boxplot(data, showfliers=True, patch_artist=True)
        for patch, c in zip(bp["boxes"], colors):
            patch.set_facecolor(c)
            patch.set_alpha(0.5)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_yscale("log")
        if m != "rel_err":
            ax.axhline(grad_tol, color="k", ls="--", lw=0.8, label=f"tolerance {grad_tol:g}")
            ax.legend(fontsize=6)
        ax.set_title({"rel_err": "|loss − FP64| / |FP64|", "grad_rel_l2": "d loss/d logits rel. L2",
                      "param_grad_rel_l2": "parameter grad rel. L2"}[m], fontsize=9)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.18, top=0.9, wspace=0.3)
    return _save(fig, path)


def plot_beta_curve(fp64_curve: pd.DataFrame, training: pd.DataFrame, path: Path,
                    metrics: Sequence[str] = ("train/loss", "train/grad_norm")) -> Path:
    """FP64 D(β) of both forms (endpoints marked), and the training loss / grad_norm of the first steps vs β."""
    panels = 1 + sum(1 for m in metrics if not training.empty and m in training.columns)
    fig, axes = plt.subplots(1, panels, figsize=(4.4 * panels, 3.4), squeeze=False)
    ax = axes[0, 0]
    styles = {"paper": dict(color="tab:orange", marker="o"), "continuous": dict(color="tab:purple", marker="s")}
    for form, g in fp64_curve.groupby("form", sort=False):
        inner = g[(g["beta"] > 0) & (g["beta"] < 1)]
        ax.plot(inner["beta"], inner["D"], ms=3, lw=1.2, label=f"{form} (0<β<1)", **styles.get(form, {}))
    ends = fp64_curve[fp64_curve["beta"].isin([0.0, 1.0])].drop_duplicates("beta")
    ax.scatter(ends["beta"], ends["D"], s=70, facecolors="none", edgecolors="k", zorder=5,
               label="endpoints: KL(T‖S), KL(S‖T)")
    ax.set_xlabel("β")
    ax.set_ylabel("D(β), mean per position (FP64)")
    src = fp64_curve["source"].iloc[0] if "source" in fp64_curve else ""
    ax.set_title(f"FP64 D(β) on {src} inputs", fontsize=9)
    ax.legend(fontsize=7)
    i = 1
    for m in metrics:
        if training.empty or m not in training.columns:
            continue
        ax = axes[0, i]
        i += 1
        for (form, prec), g in training.groupby(["loss.beta_form", "loss.precision"], dropna=False):
            g = g.sort_values("gkd.beta")
            st = dict(styles.get(form, {}))
            ax.plot(g["gkd.beta"], g[m], ms=4, lw=1, ls="-" if prec != "native" else ":",
                    label=f"{form} / {prec}", **st)
            e = g[g["gkd.beta"].isin([0.0, 1.0])]
            ax.scatter(e["gkd.beta"], e[m], s=70, facecolors="none", edgecolors="k", zorder=5)
        ax.set_xlabel("β")
        ax.set_title(f"{m}, mean of the first logged steps", fontsize=9)
        ax.legend(fontsize=6)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.15, top=0.9, wspace=0.25)
    return _save(fig, path)
