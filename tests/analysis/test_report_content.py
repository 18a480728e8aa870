"""What the report shows: user text escaped in report.md, null settings, loss sha256 values with their variant, the
held-out JSD plot. Issue 29 reproduction 11 (user text reaches report.md unescaped: the title) and issue 33 item 7 (the report:
``gkd.topk = ,`` for null, loss sha256 values without their variant, a bare relative path as the title, the
held-out JSD plot where fp32 hides under native and no difference panel)."""

from __future__ import annotations

import json

import markdown
import numpy as np
import pandas as pd

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.signoff.document import Document, constant_settings
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import EVAL_JSD

IMG = "<img src=x onerror=alert(1)>"


def _live_tags(md: str) -> list:
    """Live elements python-markdown renders from ``md`` that the report never writes itself: a <script>, any
    on* attribute, an <img> whose source is not a plot (.png). Escaped text is not an element."""
    from html.parser import HTMLParser

    found = []

    class P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if (
                tag == "script"
                or any(k.startswith("on") for k in attrs)
                or (tag == "img" and not str(attrs.get("src", "")).endswith(".png"))
            ):
                found.append((tag, attrs))

    P().feed(markdown.markdown(md, extensions=["tables", "fenced_code"]))
    return found


def test_repro11_title_is_escaped_for_python_markdown():
    # Before: "# {title}" went to report.md as it was; python-markdown rendered a live <img onerror>.
    d = Document(f"GKD loss sign-off: g{IMG}")
    d.para("x")
    assert _live_tags(d.to_markdown()) == []
    assert "&lt;img src=x onerror=alert(1)&gt;" in d.to_markdown()


def test_code_block_fence_cannot_be_closed_by_its_text():
    d = Document("t")
    d.code("a\n```\n" + IMG + "\n```")
    assert _live_tags(d.to_markdown()) == []


def test_a_group_with_html_gives_a_report_md_without_live_html(tmp_path, monkeypatch):
    # The reproduction: a group `g<img src=x onerror=alert(1)>` passes validation; its sweep folder
    # outputs/multirun/<group> reached report.md's title as it was.
    group = f"g{IMG}"
    for prec, loss in (("native", "original"), ("fp32", "fp32")):
        write_run(
            tmp_path / "multirun" / group / f"loss={loss}",
            beta=0.5,
            beta_form="paper",
            precision=prec,
            seed=1,
            steps=4,
            spot_every=2,
            group=group,
        )
    monkeypatch.chdir(tmp_path)
    assert main([f"multirun/{group}", "--report", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert _live_tags(md) == []
    title = md.splitlines()[0]
    # Issue 33 item 7: the title names the group, the absolute sweep path and the host, not "local:multirun/...".
    assert "&lt;img" in title and " on " in title
    assert str(tmp_path / "multirun" / "g&lt;img") in title
    # Each loss sha256 shown with the variant it belongs to.
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["verdict"] == "pass"


def test_null_setting_is_shown_as_null_not_an_empty_value():
    # Before: "gkd.topk = ," in the HTML's "Every row:" line.
    df = pd.DataFrame({"run": ["a", "b"], "gkd.topk": [None, None], "gkd.beta": [0.5, 0.5]})
    assert dict(constant_settings(df)) == {"gkd.topk": "null", "gkd.beta": "0.5"}
    d = Document("t")
    d.table(df)
    assert "<code>gkd.topk</code> = null" in d.to_html()


def test_versions_table_shows_each_sha256_with_its_variant(tmp_path):
    from gkd_harness.analysis.signoff.report import _versions_table
    from gkd_harness.analysis.sweep.evidence import annotate
    from gkd_harness.analysis.sweep.runs import load_sweep

    for prec, loss, sha in (("native", "original", "a" * 64), ("fp32", "fp32", "b" * 64)):
        run = write_run(
            tmp_path / f"loss={loss}", beta=0.5, beta_form="paper", precision=prec, seed=1, steps=4, spot_every=2
        )
        s = json.loads((run / "summary.json").read_text())
        s["provenance"] = {"loss_sha256": sha, "harness_commit": "c" * 40, "harness_dirty": False}
        (run / "summary.json").write_text(json.dumps(s))
    t = _versions_table(annotate(load_sweep(tmp_path)).runs).set_index("loss sha256 (first 16)")
    assert t.loc["a" * 16, "variant"].startswith("native paper") and t.loc["b" * 16, "variant"].startswith("fp32 paper")


def test_held_out_jsd_plot_shows_both_lines_and_a_difference_panel(tmp_path):
    """Two variants with equal eval/jsd: both lines are drawn distinguishably (different line styles and markers),
    and a lower panel shows patched − original."""
    import matplotlib

    matplotlib.use("Agg")
    from gkd_harness.analysis.signoff import outcome

    steps = [2, 4, 6]
    rows, runs = [], []
    for prec in ("native", "fp32"):
        for seed in (1, 2):
            name = f"{prec}_s{seed}"
            runs.append(
                {"run": name, "loss.precision": prec, "loss.beta_form": "paper", "run.seed": seed, "gkd.beta": 0.5}
            )
            rows += [{"run": name, "step": s, EVAL_JSD: 0.1 / s + (1e-4 if prec == "fp32" else 0)} for s in steps]

    class S:  # the two tables plot_seed_bands reads
        pass

    sw = S()
    sw.runs, sw.history = pd.DataFrame(runs), pd.DataFrame(rows)
    captured = {}
    real_savefig = matplotlib.figure.Figure.savefig

    def spy(fig, *a, **k):
        captured["fig"] = fig
        return real_savefig(fig, *a, **k)

    matplotlib.figure.Figure.savefig = spy
    try:
        assert outcome.plot_seed_bands(sw, EVAL_JSD, tmp_path / "p.png", "held-out JSD") is not None
    finally:
        matplotlib.figure.Figure.savefig = real_savefig
    axes = captured["fig"].axes
    assert len(axes) == 2, "a difference panel under the curves"
    lines = [ln for ln in axes[0].get_lines() if len(ln.get_xdata()) == len(steps)]
    assert len(lines) == 2
    assert lines[0].get_linestyle() != lines[1].get_linestyle() and lines[0].get_marker() != lines[1].get_marker()
    diff = [ln for ln in axes[1].get_lines() if len(ln.get_xdata()) == len(steps)]
    assert len(diff) == 1 and np.allclose(diff[0].get_ydata(), 1e-4)
