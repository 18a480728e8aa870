"""What a person reads in the report (issue 40, items 11, 13, 14): no variant of nulls for a planned run that never
ran, integer seeds, a difference panel that says what it subtracts, integer step ticks, one line for an empty
table, plots that stay readable on a 390 px screen, no right-to-left override acting on a title, a provenance
table that links each run folder, and one headline line with the defect's and the fix's numbers.

The numbers are checked against the run folders' own files, read here independently of the analysis code."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.signoff.document import Document

RLO = "\u202e"


def _report(sweep: Path, out: Path, *extra: str) -> tuple[int, str, str, dict]:
    rc = main([str(sweep), "--report", str(out), *extra])
    return (
        rc,
        (out / "report.md").read_text(),
        (out / "report.html").read_text(),
        json.loads((out / "verdict.json").read_text()),
    )


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------ headline
def test_the_headline_states_the_defect_and_the_fix_in_one_line(synthetic_sweep_dir, tmp_path):
    """Reference: summed from each run's metrics.jsonl (the last cumulative counters) and the largest logged
    spot/grad_rel_l2, per role (native = original, fp32 = patched)."""
    rc, md, html, verdict = _report(synthetic_sweep_dir, tmp_path / "r")
    expect = {}
    for role, precision in (("original", "native"), ("patched", "fp32")):
        runs = [p for p in synthetic_sweep_dir.iterdir() if p.is_dir() and f"_{precision}_" in p.name]
        runs += [
            p for p in synthetic_sweep_dir.iterdir() if p.is_dir() and precision == "native" and "_original_" in p.name
        ]
        rows = [_metrics(p) for p in runs]
        neg = sum(max(r.get("gkd/neg_loss_calls_total", 0) for r in m) for m in rows)
        calls = sum(max(r.get("gkd/loss_calls_total", 0) for r in m) for m in rows)
        grad = max(r["spot/grad_rel_l2"] for m in rows for r in m if "spot/grad_rel_l2" in r)
        expect[role] = (neg, calls, grad)
    (on, oc, og), (pn, pc, pg) = expect["original"], expect["patched"]
    assert oc > 0 and on > 0 and pc > 0 and pn == 0
    line = (
        f"Defect: original (native) {on:.0f}/{oc:.0f} negative loss calls, gradient up to {og:.2g} off FP64 "
        f"(relative L2). Fix: patched (fp32) {pn:.0f}/{pc:.0f} negative loss calls, gradient within {pg:.2g} of FP64."
    )
    assert verdict["headline"] == line
    assert f"**{line}**" in md.split("## ", 1)[0]  # on the first screen, before the first section
    assert f"<p><strong>{line}</strong></p>" in html


# ------------------------------------------------------------------------------------------------ provenance
def test_the_provenance_table_links_each_run_folder_with_its_wandb_id_torch_cuda_and_device(sweep_copy, tmp_path):
    run = sweep_copy / "b0.5_paper_fp32_T0.9_s0"
    summary = json.loads((run / "summary.json").read_text())
    summary.update(
        device="cuda",
        world_size=16,
        runtime={"torch": "2.8.0+cu128", "cuda": "12.8", "gpu": "NVIDIA H100 80GB HBM3", "gpus": 8},
    )
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "command.json").write_text(
        json.dumps({"argv": ["megatron", "rlhf"], "env": {"WANDB_RUN_ID": "abc123def456"}})
    )
    other = sweep_copy / "b0.5_paper_original_T0.9_s0"  # an older folder: no runtime, a wandb folder only
    (other / "wandb" / "offline-run-20261205_101010-zz99yy88").mkdir(parents=True)
    out = tmp_path / "reports" / "r"
    _, md, html, _ = _report(sweep_copy, out)
    section = md.split("## Run provenance", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in section.splitlines()
        if line.startswith("| [")
    }
    assert len(rows) == 16
    href = os.path.relpath(run, out)
    assert rows[f"[{run.name}]({href})"] == [  # the target percent-encoded (harness/config/text.py)
        "completed",
        "abc123def456",
        "2.8.0+cu128",
        "12.8",
        "cuda: 8 x NVIDIA H100 80GB HBM3",
        "16",
        "000000000000",
    ]
    assert (out / href).resolve() == run.resolve()  # the link leads to the run folder
    assert f"<a href='{href}'>{run.name}</a>" in html
    older = next(v for k, v in rows.items() if k.startswith(f"[{other.name}]"))
    assert older[1] == "zz99yy88" and older[2] == "2.13.0" and older[3] == ""  # an untagged torch: CUDA unknown


def test_a_planned_run_that_never_ran_is_no_variant_of_nulls(sweep_copy, tmp_path):
    """Before: a missing point appeared in the variants table as "null null β=null T=null topk=null null/null"."""
    from gkd_harness.harness.contract import SWEEP_MANIFEST_FILE

    names = sorted(p.name for p in sweep_copy.iterdir() if p.is_dir())
    planned = [*names, "b0.5_paper_fp32_T0.9_s7"]
    (sweep_copy / SWEEP_MANIFEST_FILE).write_text(json.dumps({"group": "synthetic", "points": planned}))
    rc, md, html, verdict = _report(sweep_copy, tmp_path / "r")
    assert rc == 1 and verdict["runs_by_outcome"].get("missing") == 1
    assert "null null" not in md and "β=null" not in md
    provenance = md.split("## Run provenance", 1)[1].split("\n## ", 1)[0]
    assert "| b0.5_paper_fp32_T0.9_s7 | missing |" in provenance  # named, not linked: there is no folder


# ------------------------------------------------------------------------------------------------ document
def test_bidi_controls_are_shown_not_obeyed():
    from gkd_harness.analysis.signoff.document import neutralise_bidi

    doc = Document(f"GKD loss sign-off: grp{RLO}evil")
    doc.heading(f"runs of {RLO}x")
    doc.para(f"group {RLO}abc")
    doc.table(pd.DataFrame({"run": [f"r{RLO}1"]}))
    html, md = doc.to_html(), doc.to_markdown()
    assert RLO not in html and RLO not in md
    assert "<title>GKD loss sign-off: grp&lt;U+202E&gt;evil</title>" in html
    assert neutralise_bidi("a\u2066b\u2069c\u200fd") == "a<U+2066>b<U+2069>c<U+200F>d"


def test_an_empty_table_is_one_line_naming_it():
    doc = Document("t")
    doc.table(pd.DataFrame(), caption="replay, mean over ranks")
    doc.table(pd.DataFrame())
    md, html = doc.to_markdown(), doc.to_html()
    assert md.count("no rows") == 2 and "*replay, mean over ranks*: no rows" in md
    assert "<p><em>replay, mean over ranks</em>: no rows</p>" in html and html.count("no rows") == 2


def test_smoke_like_report_has_no_repeated_no_rows(synthetic_sweep_dir, tmp_path):
    """Before: "(no rows)" under "largest divergence not measured (no pairs)", twice in a smoke report."""
    _, md, _, _ = _report(synthetic_sweep_dir, tmp_path / "r")
    agreement = md.split("## Step-for-step agreement", 1)[1].split("\n## ", 1)[0]
    assert "not measured (no pairs)" in agreement and "no rows" not in agreement


def test_links_render_in_both_formats():
    from gkd_harness.analysis.signoff.document import Link

    doc = Document("t")
    doc.table(pd.DataFrame({"run": [Link("gkd.beta=0.5,loss=fp32", "../sweep/gkd.beta=0.5,loss=fp32")]}))
    assert "[gkd.beta=0.5,loss=fp32](../sweep/gkd.beta=0.5,loss=fp32)" in doc.to_markdown()
    assert "<a href='../sweep/gkd.beta=0.5,loss=fp32'>gkd.beta=0.5,loss=fp32</a>" in doc.to_html()


def test_plots_keep_a_readable_minimum_width(synthetic_sweep_dir, tmp_path):
    """Each plot is shown at least MIN_PLOT_SCALE of its pixel width (the smallest text, 8 pt at 150 dpi, then
    stays >= 9 CSS px); on a narrow screen its figure scrolls instead. Before, a 1650 px plot shrank to 360 px
    on a 390 px phone: 3.6 px text."""
    import re

    from PIL import Image

    from gkd_harness.analysis.signoff.document import MIN_PLOT_SCALE

    _report(synthetic_sweep_dir, tmp_path / "r")
    html = (tmp_path / "r" / "report.html").read_text()
    widths = [int(w) for w in re.findall(r"<img alt='[^']*' style='min-width:(\d+)px'", html)]
    pngs = sorted((tmp_path / "r").glob("*.png"))
    assert len(widths) == len(pngs) > 0
    natural = sorted(Image.open(p).size[0] for p in pngs)
    assert sorted(widths) == sorted(math.ceil(w * MIN_PLOT_SCALE) for w in natural)
    assert 8 * 150 / 72 * MIN_PLOT_SCALE >= 9.0
    assert "figure{margin:1em 0;overflow-x:auto}" in html


# ------------------------------------------------------------------------------------------------ plots
def test_seed_band_difference_panel_says_what_it_subtracts_and_steps_are_integers(monkeypatch, tmp_path):
    """Before: the difference panel's y-label read "− native/paper", and 45 steps got ticks at 22.5."""
    import matplotlib.pyplot as plt

    from gkd_harness.analysis.signoff import outcome
    from gkd_harness.analysis.sweep.records import Sweep

    runs, hist = [], []
    for seed in (1, 2):
        for precision in ("native", "fp32"):
            name = f"{precision}_s{seed}"
            runs.append({"run": name, "loss.precision": precision, "loss.beta_form": "paper", "run.seed": seed})
            hist += [{"run": name, "step": s, "eval/jsd": 1.0 / s + (precision == "fp32") * 0.01} for s in range(1, 46)]
    sweep = Sweep(source="local:x", runs=pd.DataFrame(runs), history=pd.DataFrame(hist))
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    assert outcome.plot_seed_bands(sweep, "eval/jsd", tmp_path / "b.png", "eval/jsd over steps") is not None
    ax, dax = kept[-1].axes
    assert dax.get_ylabel().startswith("variant − ") and not dax.get_ylabel().startswith("−")
    for axis in (ax, dax):
        ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
