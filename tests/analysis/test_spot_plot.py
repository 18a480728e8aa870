"""spot_errors.png as gkd-analyze draws it: every error panel carries its sign-off tolerance as a horizontal line
at the value of the criteria file (loss: loss_rtol, the floor of rtol*|FP64| + atol in relative terms; logit
gradient: grad_rel_l2_max; parameter gradient: param_grad_rel_l2_max)."""

from __future__ import annotations

import contextlib
import io

import numpy as np

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.signoff import plots
from gkd_harness.analysis.signoff.criteria import load_criteria


def _horizontal_levels(ax) -> set:
    """y of every horizontal line drawn across the panel (axhline: x in axes coordinates 0..1, y constant)."""
    out = set()
    for ln in ax.get_lines():
        x, y = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
        if len(y) == 2 and y[0] == y[1] and list(x) == [0.0, 1.0]:
            out.add(float(y[0]))
    return out


def test_every_spot_error_panel_has_its_tolerance_line(synthetic_sweep_dir, tmp_path, figs):
    with contextlib.redirect_stdout(io.StringIO()):
        main([str(synthetic_sweep_dir), "--report", str(tmp_path / "r")])
    fig = figs["spot_errors.png"]
    crit = load_criteria().spot_tolerance
    want = {
        plots._SPOT_TITLES["rel_err"]: crit.loss_rtol,
        plots._SPOT_TITLES["grad_rel_l2"]: crit.grad_rel_l2_max,
        plots._SPOT_TITLES["param_grad_rel_l2"]: crit.param_grad_rel_l2_max,
    }
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title() in want}
    assert set(panels) == set(want)  # the synthetic sweep logs all three errors
    for title, ax in panels.items():
        assert want[title] in _horizontal_levels(ax), (title, _horizontal_levels(ax))
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert f"loss tolerance: rtol {crit.loss_rtol:g} (+ atol/|FP64|)" in labels


def test_minor_ticks_only_on_log_panels_of_a_few_decades(tmp_path, figs):
    """A panel whose errors span more than 4 decades has no minor ticks (eight unlabelled marks per decade); one
    spanning 2 decades keeps them. The major ticks stay labelled on both."""
    import pandas as pd
    from matplotlib.ticker import NullLocator

    rows = [
        {
            "run": "r",
            "loss.precision": "fp32",
            "loss.beta_form": "paper",
            "mixed_dtypes": True,
            "rel_err": v,
            "grad_rel_l2": w,
            "param_grad_rel_l2": np.nan,
        }
        for v, w in zip(np.logspace(-10, -1, 20), np.logspace(-6, -4, 20))
    ]
    png = plots.plot_spot_errors(pd.DataFrame(rows), tmp_path / "s.png", 1e-3, 1e-4)
    panels = {ax.get_title(): ax for ax in figs[png.name].axes}
    wide, narrow = panels[plots._SPOT_TITLES["rel_err"]], panels[plots._SPOT_TITLES["grad_rel_l2"]]
    assert isinstance(wide.yaxis.get_minor_locator(), NullLocator)
    assert not isinstance(narrow.yaxis.get_minor_locator(), NullLocator)
    assert len(narrow.yaxis.get_minorticklocs()) > 0
    for ax in (wide, narrow):
        assert any(t.get_text() for t in ax.get_yticklabels())
