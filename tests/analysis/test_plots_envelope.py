"""Long curves are drawn through their min/max envelope (``plots.envelope``): at most a few thousand points per
line, and every extreme kept, so a single negative loss among 10⁶ points is still drawn at its step and value.

References are computed here from the raw arrays (a loop over the bins), not by the function under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gkd_harness.analysis.load import load_sweep
from gkd_harness.analysis.signoff import plots
from gkd_harness.bench.synthetic import write_run


def _bin_extremes(x: np.ndarray, y: np.ndarray, edges: np.ndarray) -> list:
    """(min, max) of ``y`` in each half-open x bin ``[edges[i], edges[i+1])`` (the last bin closed)."""
    out = []
    for i in range(len(edges) - 1):
        hi = x <= edges[i + 1] if i == len(edges) - 2 else x < edges[i + 1]
        sel = y[(x >= edges[i]) & hi]
        out.append((sel.min(), sel.max()) if sel.size else None)
    return out


def test_single_negative_spike_in_a_million_points_is_drawn():
    n = 1_000_000
    x = np.arange(1, n + 1, dtype=np.int64)
    rng = np.random.default_rng(0)
    y = 0.05 * np.exp(-x / 2e5) + 1e-4 * rng.random(n)  # positive everywhere
    spike_at, spike = 654_321, -3.5e-4
    y[spike_at] = spike
    ex, ey = plots.envelope(x, y)
    assert len(ex) <= plots._MAX_DRAWN_POINTS  # a few thousand points, not 10⁶
    assert np.all(np.diff(ex) > 0)  # in step order, each point once
    # the one negative value is drawn, at its own step, with its exact value
    assert np.count_nonzero(ey < 0) == 1
    assert ey.min() == spike and ex[np.argmin(ey)] == x[spike_at]
    # every kept point is a point of the line, unchanged
    np.testing.assert_array_equal(ey, y[ex - 1])
    # first and last points are kept, the global maximum too
    assert (ex[0], ex[-1]) == (1, n) and ey.max() == y.max()


@pytest.mark.parametrize("bins", [1000, 500, 10])
def test_envelope_keeps_each_bins_min_and_max(bins):
    """Over any grouping of the envelope's bins into coarser pixel columns, the drawn min and max equal the full
    line's: checked at the envelope's own bin width (1000 bins at 4,000 points) and at coarser ones."""
    n = 250_003
    x = np.arange(n, dtype=np.int64) * 3 + 7
    rng = np.random.default_rng(1)
    y = np.cumsum(rng.standard_normal(n))
    y[rng.integers(0, n, 20)] *= -50.0  # spikes both ways
    ex, ey = plots.envelope(x, y, max_points=4000)
    edges = np.linspace(x[0], x[-1], bins + 1)
    assert _bin_extremes(ex.astype(float), ey, edges) == _bin_extremes(x.astype(float), y, edges)


def test_short_lines_and_non_finite_points():
    x = np.arange(50)
    y = np.linspace(1.0, -1.0, 50)
    ex, ey = plots.envelope(x, y)
    assert ex is x or np.array_equal(ex, x)
    np.testing.assert_array_equal(ey, y)  # below the limit: unchanged
    n = 100_000
    x = np.arange(n)
    y = np.ones(n)
    y[[10, 20_000, 99_998]] = [np.nan, np.inf, -np.inf]
    ex, ey = plots.envelope(x, y, max_points=400)
    assert len(ex) <= 400 + 3
    kept = {int(a): b for a, b in zip(ex, ey)}
    assert np.isnan(kept[10]) and kept[20_000] == np.inf and kept[99_998] == -np.inf


def test_long_run_curve_draws_its_negative_step(tmp_path, figs):
    """A 20,000-step native/fp32 pair: each drawn line stays at a few thousand points, the curve keeps the one
    negative train/loss at its step, and the difference panel its native − fp32 value there (from the files)."""
    steps, bad_step, bad = 20_000, 13_579, -2.5e-3
    root = tmp_path / "sweep"
    for prec in ("native", "fp32"):
        write_run(
            root / prec,
            beta=0.5,
            beta_form="paper",
            precision=prec,
            seed=0,
            steps=steps,
            spot_every=0,
            teacher_dtype="float32",
        )
    path = root / "native" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    (hit,) = [r for r in rows if r.get("step") == bad_step and "train/loss" in r]
    hit["train/loss"] = bad
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fp32 = {
        r["step"]: r["train/loss"]
        for r in map(json.loads, (root / "fp32" / "metrics.jsonl").read_text().splitlines())
        if "train/loss" in r
    }
    png = plots.plot_curves(load_sweep(root), "train/loss", tmp_path / "loss.png")
    fig = figs[png.name]
    (ax,) = [a for a in fig.axes if a.get_title().startswith("β = 0.5")]
    (dax,) = [a for a in fig.axes if a.get_ylabel().startswith("native − fp32")]
    lines = [ln for a in (ax, dax) for ln in a.get_lines() if len(ln.get_xdata()) > 2]
    assert len(lines) == 3 and all(len(ln.get_xdata()) <= plots._MAX_DRAWN_POINTS for ln in lines)
    native = next(ln for ln in ax.get_lines() if ln.get_color() == plots.variant_style("native", "paper")["color"])
    x, y = np.asarray(native.get_xdata()), np.asarray(native.get_ydata())
    assert np.count_nonzero(y < 0) == 1 and y.min() == bad and x[np.argmin(y)] == bad_step
    (diff,) = [ln for ln in dax.get_lines() if len(ln.get_xdata()) > 2]
    dx, dy = np.asarray(diff.get_xdata()), np.asarray(diff.get_ydata())
    assert dy.min() == bad - fp32[bad_step] and dx[np.argmin(dy)] == bad_step
