"""The report's PNGs: resolution, axis labels with units, one legend per figure, a colour and marker per variant,
the native − fp32 difference panel, labelled bars with 0 and "not logged" told apart, β panels only with 2+ β.

Figures are inspected as matplotlib objects (``plots._save`` is wrapped to keep them) and values are checked
against numbers read straight from the run folders' ``metrics.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D
from PIL import Image

from gkd_harness.analysis.load import load_sweep
from gkd_harness.analysis.signoff import plots
from gkd_harness.analysis.signoff.betacurve import beta_defect_inputs, fp64_beta_curve, training_beta_curve
from gkd_harness.analysis.signoff.compare import negatives_table, spot_table
from gkd_harness.analysis.signoff.criteria_file import load_criteria
from gkd_harness.bench.synthetic import write_run

VARIANTS = [("native", "paper"), ("native", "continuous"), ("fp32", "paper"), ("fp32", "continuous")]


@pytest.fixture(scope="module")
def smoke_like(tmp_path_factory) -> Path:
    """The smoke sweep's shape: β = 0.5, native·paper, fp32·paper, fp32·continuous, 20 steps. The fp32 runs'
    streams are identical (β = 0.5 is the same for both forms), and native is made to sit within 1e-6 of fp32,
    as in the real smoke sweep where the curves cannot be told apart by eye."""
    root = tmp_path_factory.mktemp("smoke_like")
    for prec, form in (("native", "paper"), ("fp32", "paper"), ("fp32", "continuous")):
        write_run(
            root / f"{prec}_{form}",
            beta=0.5,
            beta_form=form,
            precision=prec,
            seed=42,
            steps=20,
            spot_every=1,
            topk=None,
        )
    ref = _metrics(root / "fp32_paper")
    rows = _metrics(root / "native_paper")
    for r, q in zip(rows, ref):
        r["train/loss"] = q["train/loss"] - 2e-6 * (1 + r["step"] % 3)
        r["train/grad_norm"] = q["train/grad_norm"] + 1e-6 * r["step"]
    (root / "native_paper" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


def _metrics(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _legends(fig) -> list:
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def _legend_entries(fig) -> dict:
    (leg,) = _legends(fig)
    return {t.get_text(): h for t, h in zip(leg.get_texts(), leg.legend_handles)}


def _check_common(fig, png: Path) -> None:
    """≥ 150 dpi, exactly one legend, x labels everywhere data is drawn, a y label with a unit per row."""
    with Image.open(png) as im:
        dpi = im.info["dpi"]
        assert min(dpi) >= 149.9, dpi  # PNG stores dots per metre: 150 dpi reads back as 149.9994
        w, h = im.size
    fw, fh = fig.get_size_inches()
    assert (w, h) == (round(fw * plots.DPI), round(fh * plots.DPI))
    assert len(_legends(fig)) == 1
    for ax in fig.axes:
        if not ax.get_visible() or not ax.has_data():
            continue
        shared = [o for o in ax.get_shared_x_axes().get_siblings(ax) if o is not ax]
        assert ax.get_xlabel() or any(o.get_xlabel() for o in shared), ax.get_title()
        if ax.get_subplotspec().is_first_col():
            assert "(" in ax.get_ylabel() and ")" in ax.get_ylabel(), f"no unit in y label {ax.get_ylabel()!r}"


def test_variant_styles_distinct():
    styles = [plots.variant_style(p, f) for p in ("native", "fp32", "fp64") for f in ("paper", "continuous")]
    assert len({s["color"] for s in styles}) == 6 and len({s["marker"] for s in styles}) == 6
    assert plots.variant_style("bf16", "paper")["marker"] not in {s["marker"] for s in styles}


def test_curves_smoke_shape_difference_panel(smoke_like, tmp_path, figs):
    sweep = load_sweep(smoke_like)
    png = plots.plot_curves(sweep, "train/grad_norm", tmp_path / "grad_norm_curves.png")
    fig = figs[png.name]
    _check_common(fig, png)
    entries = _legend_entries(fig)
    variants = {plots.variant_label(p, f) for p, f in (("native", "paper"), ("fp32", "paper"), ("fp32", "continuous"))}
    assert variants <= set(entries)
    assert len({(entries[v].get_color(), entries[v].get_marker()) for v in variants}) == 3
    # the difference panel holds native − fp32 step by step, computed here from the run folders
    (dax,) = [ax for ax in fig.axes if ax.get_ylabel().startswith("native − fp32")]
    line = [ln for ln in dax.get_lines() if len(ln.get_xdata()) > 2][0]
    n, f = _metrics(smoke_like / "native_paper"), _metrics(smoke_like / "fp32_paper")
    expected = np.array([a["train/grad_norm"] - b["train/grad_norm"] for a, b in zip(n, f)])
    np.testing.assert_array_equal(line.get_xdata(), [r["step"] for r in n])
    np.testing.assert_allclose(line.get_ydata(), expected, rtol=1e-9, atol=0)
    assert np.ptp(expected) > 0 and np.max(np.abs(expected)) < 1e-4  # invisible on the curve axes, not here


def test_curves_one_panel_per_beta_no_pairs(synthetic_sweep_dir, tmp_path, figs):
    sweep = load_sweep(synthetic_sweep_dir)
    fp32_only = sweep.runs[sweep.runs["loss.precision"] == "fp32"]
    from gkd_harness.analysis.sweep.records import Sweep

    sub = Sweep(
        source=sweep.source,
        runs=fp32_only.reset_index(drop=True),
        history=sweep.history[sweep.history["run"].isin(fp32_only["run"])].reset_index(drop=True),
        nonfinite=sweep.nonfinite.iloc[0:0],
    )
    png = plots.plot_curves(sub, "train/loss", tmp_path / "loss.png")
    fig = figs[png.name]
    _check_common(fig, png)
    titles = sorted(ax.get_title() for ax in fig.axes if ax.get_title())
    assert titles == ["β = 0 (2 runs)", "β = 0.5 (2 runs)", "β = 0.9 (2 runs)", "β = 1 (2 runs)"]
    assert not any(ax.get_ylabel().startswith("native − fp32") for ax in fig.axes)  # no pairs, no panel


def _bar_texts(ax) -> list:
    """(x, text) of the value labels on a bar axes, left to right."""
    return sorted((t.get_position()[0], t.get_text()) for t in ax.texts)


def test_negatives_labels_zero_and_missing(synthetic_sweep_dir, tmp_path, figs):
    sweep = load_sweep(synthetic_sweep_dir)
    neg = negatives_table(sweep)
    # one variant at β = 0.9 has nothing logged: it must read "n/a", not 0
    gap = (neg["gkd.beta"] == 0.9) & (neg["loss.precision"] == "fp32") & (neg["loss.beta_form"] == "paper")
    neg.loc[gap, ["neg_loss_calls", "loss_calls", "neg_token_frac_max"]] = np.nan
    png = plots.plot_negatives(neg, tmp_path / "negatives.png")
    fig = figs[png.name]
    _check_common(fig, png)
    top = fig.axes[0]
    assert [t.get_text() for t in top.get_xticklabels()] == ["β = 0", "β = 0.5", "β = 0.9", "β = 1"]
    # expected top-panel labels, from metrics.jsonl: negative calls / loss calls summed per (β, variant)
    order = sorted(VARIANTS, key=lambda v: ({"native": 0, "fp32": 1}[v[0]], v[1]))
    expected = []
    for beta in (0.0, 0.5, 0.9, 1.0):
        for prec, form in order:
            if beta == 0.9 and (prec, form) == ("fp32", "paper"):
                expected.append("n/a")
                continue
            loss = {"native": "original", "fp32": "fp32"}[prec]
            rows = _metrics(synthetic_sweep_dir / f"b{beta}_{form}_{loss}_T0.9_s0")
            negs, calls = rows[-1]["gkd/neg_loss_calls_total"], rows[-1]["gkd/loss_calls_total"]
            expected.append("0" if negs == 0 else f"{negs / calls:.2g}")
    assert [t for _, t in _bar_texts(top)] == expected
    assert expected.count("0") == 7 and expected.count("n/a") == 1
    # 0 is a hollow mark with a visible height; "n/a" a hatched bar; every other bar is filled
    bars = [p for p in top.patches if p.get_width() < 0.5]
    zero = [p for p in bars if p.get_facecolor()[:3] == (1.0, 1.0, 1.0)]
    hatched = [p for p in bars if p.get_hatch()]
    assert len(zero) == 7 and all(p.get_height() > 0 for p in zero)
    assert len(hatched) == 1
    assert set(_legend_entries(fig)) >= {plots.variant_label(*v) for v in VARIANTS} | {
        "0 (hollow mark)",
        "not logged (n/a)",
    }


def test_spot_errors_figure(synthetic_sweep_dir, tmp_path, figs):
    st = load_criteria().spot_tolerance
    spots = spot_table(load_sweep(synthetic_sweep_dir), st.loss_rtol, st.loss_atol)
    png = plots.plot_spot_errors(spots, tmp_path / "spot.png", st.grad_rel_l2_max)
    fig = figs[png.name]
    _check_common(fig, png)
    entries = _legend_entries(fig)
    marks = {
        (entries[plots.variant_label(*v)].get_color(), entries[plots.variant_label(*v)].get_marker()) for v in VARIANTS
    }
    assert len(marks) == 4 and "tolerance 0.001" in entries


def test_beta_curve_panels_need_two_betas(synthetic_sweep_dir, smoke_like, tmp_path, figs):
    s, t = beta_defect_inputs()
    curve = fp64_beta_curve(s, t, (0.0, 0.01, 0.5, 0.99, 1.0))
    # one trained β (the smoke sweep): the FP64 panel only
    one = training_beta_curve(load_sweep(smoke_like), 3)
    png = plots.plot_beta_curve(curve, one, tmp_path / "beta1.png")
    assert len([ax for ax in figs[png.name].axes if ax.has_data()]) == 1
    _check_common(figs[png.name], png)
    # four trained β: two training panels, one series per variant with its own colour and marker
    four = training_beta_curve(load_sweep(synthetic_sweep_dir), 3)
    png = plots.plot_beta_curve(curve, four, tmp_path / "beta4.png")
    fig = figs[png.name]
    _check_common(fig, png)
    assert len(fig.axes) == 3
    for ax in fig.axes[1:]:
        series = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 4]
        assert len(series) == 4
        assert len({(ln.get_color(), ln.get_marker()) for ln in series}) == 4
        # values: the mean of the first 3 logged steps, from the run folder
        ln = next(x for x in series if x.get_color() == plots.variant_style("fp32", "paper")["color"])
        metric = "train/loss" if "loss" in ax.get_ylabel() else "train/grad_norm"
        want = [
            np.mean([r[metric] for r in _metrics(synthetic_sweep_dir / f"b{b}_paper_fp32_T0.9_s0")[:3]])
            for b in (0.0, 0.5, 0.9, 1.0)
        ]
        np.testing.assert_allclose(ln.get_ydata(), want, rtol=1e-12)
    entries = _legend_entries(fig)
    assert all(isinstance(entries[plots.variant_label(*v)], Line2D) for v in VARIANTS)


def test_nothing_to_plot_returns_none(tmp_path):
    assert plots.plot_negatives(pd.DataFrame(columns=["neg_loss_calls"]), tmp_path / "n.png") is None
    assert plots.plot_spot_errors(pd.DataFrame(), tmp_path / "s.png", 1e-3) is None
    assert not (tmp_path / "n.png").exists() and not (tmp_path / "s.png").exists()


def test_curves_many_seeds_band_and_marked_median(tmp_path, figs):
    """More than 3 runs of a variant in a panel: one band from the runs' smallest to their largest value at each
    step (values read from the run folders), plus the per-step median with markers; no line per run."""
    root = tmp_path / "sweep"
    for seed in range(5):
        write_run(root / f"s{seed}", beta=0.5, beta_form="paper", precision="fp32", seed=seed, steps=10, spot_every=0)
    png = plots.plot_curves(load_sweep(root), "train/loss", tmp_path / "loss.png")
    fig = figs[png.name]
    _check_common(fig, png)
    (ax,) = [a for a in fig.axes if a.has_data()]
    marked = [ln for ln in ax.get_lines() if ln.get_marker() not in ("None", None, "")]
    assert len(marked) == 1 and len(ax.get_lines()) == 1
    values = np.array([[r["train/loss"] for r in _metrics(root / f"s{seed}")] for seed in range(5)])
    np.testing.assert_allclose(marked[0].get_ydata(), np.median(values, axis=0), rtol=1e-12)
    (band,) = ax.collections
    verts = band.get_paths()[0].vertices
    steps = np.arange(1, 11)
    for step, lo, hi in zip(steps, values.min(axis=0), values.max(axis=0)):
        at = verts[np.isclose(verts[:, 0], step), 1]
        assert at.min() == pytest.approx(lo, rel=1e-12) and at.max() == pytest.approx(hi, rel=1e-12)
    assert "band = runs' min–max, marked line = median" in fig.get_suptitle()


def test_long_band_keeps_each_runs_extreme(tmp_path, figs):
    """A band over 5 runs of 20,000 steps is drawn through its envelope, and one run's single negative value
    still sets the band's lower edge at its own step."""
    root = tmp_path / "sweep"
    for seed in range(5):
        write_run(
            root / f"s{seed}", beta=0.5, beta_form="paper", precision="fp32", seed=seed, steps=20_000, spot_every=0
        )
    rows = _metrics(root / "s3")
    rows[12_345]["train/loss"] = -0.5
    (root / "s3" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    png = plots.plot_curves(load_sweep(root), "train/loss", tmp_path / "loss.png")
    (ax,) = [a for a in figs[png.name].axes if a.has_data()]
    verts = ax.collections[0].get_paths()[0].vertices
    assert len(verts) < 2 * 20_000
    at = verts[verts[:, 0] == rows[12_345]["step"], 1]
    assert at.min() == -0.5
