"""The sign-off report: criteria verdict, comparison tables, β-curve, replay, written as
``report.md``, ``report.html`` (same report, self-contained), ``*.png`` and ``verdict.json``.

The report folder is written completely or not at all: everything is built in a temporary folder next to it,
which then replaces the folder (an old report there is removed only after the new one is complete).

Exit codes (see :mod:`analysis.cli`): 0 pass, 1 fail, 2 unusable input or internal error.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from analysis.signoff import plots
from analysis.signoff.betacurve import (capture_inputs, endpoint_jumps, fp64_beta_curve, beta_defect_inputs,
                                training_beta_curve)
from analysis.signoff.compare import (forms_agreement, largest_divergence, negatives_table, precision_agreement,
                              run_summary, spot_distribution, spot_table)
from analysis.signoff.criteria import FAILING, evaluate
from analysis.signoff.document import Document
from analysis.sweep.records import Sweep, UnusableInput
from analysis.signoff.criteria_file import SignoffCriteria
from harness.contract import TRAIN_GRAD_NORM, TRAIN_LOSS
from harness.store.provenance import git_state

__all__ = ["build_report", "EXIT_PASS", "EXIT_FAIL", "EXIT_UNUSABLE", "VERDICT_SCHEMA_VERSION", "find_captures",
           "analysis_package_versions"]

EXIT_PASS, EXIT_FAIL, EXIT_UNUSABLE = 0, 1, 2
#: Version of the verdict.json layout; raise it when a key changes meaning or goes away.
VERDICT_SCHEMA_VERSION = 1
_PROVENANCE_COLS = ("loss.precision", "version.harness_commit", "version.harness_dirty", "version.loss_sha256",
                    "version.ms-swift")
_RUN_COLS = ["run", "gkd.beta", "loss.beta_form", "loss.precision", "gkd.temperature", "gkd.topk", "run.seed",
             "backend.name", "dtype.student", "dtype.teacher", "outcome", "last_step", "run.max_steps", "error",
             "problems"]


def analysis_package_versions() -> dict:
    """Versions of the packages that produced this report: the training stack
    (:func:`harness.store.provenance.package_versions`) plus the analysis stack and Python."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from harness.store.provenance import package_versions

    out = dict(package_versions())
    for name in ("gkd-harness", "numpy", "pandas", "matplotlib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def find_captures(sweep: Sweep) -> list:
    """Capture files (``captures/*.safetensors``) of the sweep's local run folders."""
    out = []
    for p in sweep.runs["path"].dropna():
        d = Path(p) / "captures"
        if d.is_dir():
            out += sorted(d.glob("*.safetensors"))
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _records(df: pd.DataFrame) -> list:
    return _jsonable(df.to_dict(orient="records")) if df is not None and not df.empty else []


def _replay(captures: list, doc: Document) -> tuple:
    """Run ``analysis.replay.variants.replay_table`` on the captures; returns (per_capture, averaged) or (None, None)."""
    if not captures:
        doc.para("No captures in this sweep (`monitor.capture` was off), so there is nothing to replay. "
                 "Enable captures to get the native / FP32 / FP64 table on the training inputs.")
        return None, None
    try:
        from analysis.replay.variants import replay_table
    except ImportError as e:  # pragma: no cover - the harness ships replay
        doc.para(f"Replay unavailable: cannot import analysis.replay.variants ({e}).")
        return None, None
    try:
        per_capture, averaged = replay_table([str(c) for c in captures])
    except Exception as e:  # a bad capture must not hide the rest of the report
        doc.para(f"Replay failed on the sweep's captures: {type(e).__name__}: {e}")
        return None, None
    doc.para(f"`gkd-replay` on {len(captures)} captures: each capture's inputs recomputed with the native, FP32 "
             "and FP64 loss (same inputs, only the arithmetic changes). Mean over ranks per (run, step):")
    doc.table(averaged, caption="replay, mean over ranks")
    doc.table(per_capture, max_rows=40, caption="replay, per capture")
    return per_capture, averaged


def _seed_defect(sweep: Sweep, doc: Document) -> Optional[pd.DataFrame]:
    """The seed defect table (:func:`analysis.signoff.seed_defect.seed_defect_table`) for the seed pair and the sweep's
    dtype pairs, written into ``doc``; shown in every report, with or without captures."""
    try:
        from analysis.signoff.seed_defect import seed_defect_table, seed_input_description, sweep_dtype_pairs

        table = seed_defect_table(sweep_dtype_pairs(sweep.runs))
        described = seed_input_description()
    except Exception as e:  # the table must not hide the rest of the report
        doc.para(f"Seed defect table unavailable: {type(e).__name__}: {e}")
        return None
    doc.para(f"The seed report's fixed synthetic input ({described}), recomputed with the native (upstream), "
             "FP32 and FP64 loss: same inputs, only the arithmetic changes. Rows for each other dtype pair this sweep's runs saw at the loss follow. "
             "`grad_rel_l2`: relative L2 error of d loss / d student logits against FP64; each row's command "
             "prints the same numbers.")
    doc.table(table, caption="seed defect table (gkd-replay synthetic)")
    return table


_REPORT_FILES = ("verdict.json", "report.md", "report.html")


def _plottable(sweep: Sweep) -> Sweep:
    """The runs whose variant is known (β, β form and precision set): a point that failed before its config
    was recorded is listed in the report and counted by the criteria, but has nothing to plot."""
    r = sweep.runs
    keep = r["gkd.beta"].notna() & r["loss.beta_form"].notna() & r["loss.precision"].notna()
    if keep.all():
        return sweep
    names = set(r.loc[keep, "run"])
    return Sweep(source=sweep.source, runs=r[keep].reset_index(drop=True),
                 history=sweep.history[sweep.history["run"].isin(names)].reset_index(drop=True),
                 nonfinite=sweep.nonfinite[sweep.nonfinite["run"].isin(names)].reset_index(drop=True))


def _check_report_dir(report_dir: Path) -> None:
    """Refuse to replace a folder that is not an earlier report (an empty folder is fine)."""
    if not report_dir.exists():
        return
    if not report_dir.is_dir():
        raise UnusableInput(f"--report {report_dir} exists and is not a folder")
    entries = list(report_dir.iterdir())
    if entries and not any((report_dir / f).exists() for f in _REPORT_FILES):
        raise UnusableInput(f"--report {report_dir} exists and is not a gkd-analyze report (no verdict.json or "
                            "report.md): give a new or empty folder")


def _replace_dir(new: Path, target: Path) -> None:
    """Put the complete folder ``new`` at ``target``; an old ``target`` is removed once ``new`` is in place."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, old)
    try:
        os.replace(new, target)
    except OSError:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_report(sweep: Sweep, report_dir: Path, cfg: SignoffCriteria, captures: Optional[list] = None) -> dict:
    """Evaluate the criteria and write the report folder ``report_dir``, completely or not at all.

    Returns the verdict dict (also written as ``verdict.json``); ``verdict["exit_code"]`` is 0 (pass) or 1
    (fail). Raises :class:`UnusableInput` when ``report_dir`` is a folder that is not an earlier report."""
    report_dir = Path(report_dir).absolute()
    _check_report_dir(report_dir)
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = report_dir.with_name(f".{report_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        out = _write_report(sweep, tmp, cfg, captures)
        _replace_dir(tmp, report_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out["_plots"] = {k: report_dir / Path(p).name for k, p in out["_plots"].items()}
    return out


def _write_report(sweep: Sweep, report_dir: Path, cfg: SignoffCriteria, captures: Optional[list]) -> dict:
    """Write every report file into the (new, empty) folder ``report_dir``; returns the verdict dict."""
    rcfg = cfg.report
    st = cfg.spot_tolerance
    verdict, results = evaluate(sweep, cfg)
    shown = _plottable(sweep)  # plots and the training β-curve: runs whose variant is known

    summary = run_summary(sweep)
    neg = negatives_table(sweep)
    spots = spot_table(sweep, st.loss_rtol, st.loss_atol)
    spot_dist = spot_distribution(spots)
    forms = forms_agreement(sweep, cfg.beta_forms_unchanged.betas)
    precs = precision_agreement(sweep)
    s, t = beta_defect_inputs()
    curve = fp64_beta_curve(s, t, rcfg.beta_curve_betas, source="fixed synthetic (seed 7, V=300)")
    captures = find_captures(sweep) if captures is None else captures
    cap_curve, capture_error = None, None
    if captures:
        try:
            from harness.store.captures import load_capture

            cs, ct, temp, _ = capture_inputs(load_capture(captures[0]))
            if cs.shape[0]:
                cap_curve = fp64_beta_curve(cs, ct, rcfg.beta_curve_betas, temperature=temp,
                                            source=f"captured ({captures[0].parent.parent.name}/{captures[0].name})")
        except Exception as e:  # report it, keep going
            capture_error = f"{type(e).__name__}: {e}"
    jumps = endpoint_jumps(curve)
    train_curve = training_beta_curve(shown, rcfg.first_steps)
    plotted = set(shown.runs["run"])

    png = {
        "loss": plots.plot_curves(shown, TRAIN_LOSS, report_dir / "loss_curves.png", rcfg.max_curve_panels),
        "grad_norm": plots.plot_curves(shown, TRAIN_GRAD_NORM, report_dir / "grad_norm_curves.png",
                                       rcfg.max_curve_panels),
        "negatives": plots.plot_negatives(neg[neg["run"].isin(plotted)], report_dir / "negatives.png"),
        "spot": plots.plot_spot_errors(spots[spots["run"].isin(plotted)], report_dir / "spot_errors.png",
                                       st.grad_rel_l2_max, st.loss_rtol, st.param_grad_rel_l2_max),
        "beta": plots.plot_beta_curve(curve, train_curve, report_dir / "beta_curve.png",
                                      first_steps=rcfg.first_steps),
        "beta_captured": (plots.plot_beta_curve(cap_curve, pd.DataFrame(), report_dir / "beta_curve_captured.png")
                          if cap_curve is not None else None),
    }

    runs = sweep.runs
    outcome_counts = runs["outcome"].value_counts().to_dict()
    doc = Document(f"GKD loss sign-off: {sweep.source}")
    failing = [r for r in results if r.status in FAILING]
    n_na = sum(r.status == "not_applicable" for r in results)
    doc.banner(verdict, f"{sum(r.status == 'pass' for r in results)} of "
               f"{sum(r.status not in ('disabled', 'not_applicable') for r in results)} applicable criteria pass"
               + (f" ({n_na} not applicable to this sweep's design)" if n_na else "")
               + (f"; failing: {', '.join(r.name for r in failing)}" if failing else "") + f". {len(runs)} runs "
             f"({', '.join(f'{v} {k}' for k, v in sorted(outcome_counts.items()))}); group(s): "
             f"{', '.join(map(str, sweep.groups)) or 'n/a'}. Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}.",
               failing=[(f"{r.name} ({r.status})", r.reason()) for r in failing])
    versions = {c: runs[c].dropna().unique().tolist() for c in runs.columns if c.startswith("version.")}
    if versions:
        doc.para("Versions: " + "; ".join(f"{k[8:]} {', '.join(map(str, v))}" for k, v in versions.items()))
    from analysis.signoff import outcome  # issue 20: the held-out effect in one sentence on the first screen

    effect = outcome.headline(sweep, cfg.original_precision, cfg.patched_precisions)
    if effect:
        doc.para("Held-out outcome: " + effect)
    doc.toc()

    doc.heading("Criteria")
    doc.para("`not_applicable`: the sweep's design does not contain the criterion's subject (never a failure); "
             "`not_measured`: the design has the subject but the evidence is missing (a failure when required).")
    doc.table(pd.DataFrame([{"criterion": r.title, "status": r.status, "why it applies": r.applies,
                             "threshold": r.threshold, "measured": r.measured} for r in results]))
    for r in results:
        if r.details:
            doc.heading(f"{r.title}: {r.status}", 3)
            doc.bullets(r.details[:40] + ([f"... {len(r.details) - 40} more"] if len(r.details) > 40 else []))

    doc.heading("Runs")
    doc.para("Failed and incomplete runs are listed here and counted by the criteria; none is dropped.")
    doc.table(runs[[c for c in _RUN_COLS if c in runs.columns]], max_rows=250)

    outcome.report_section(sweep, doc, report_dir, cfg.original_precision, cfg.patched_precisions)

    doc.heading("Original vs patched: loss and grad_norm")
    doc.para("Original = `loss.precision=native` (upstream arithmetic), patched = `fp32`, reference = `fp64`. "
             "Per run: last logged value and mean over all logged steps.")
    doc.table(summary, max_rows=250)
    doc.image(png["loss"], "train/loss per step, one panel per β, one line per run in its variant's colour and "
              "marker; where native/fp32 pairs exist, the panel below shows native − fp32")
    doc.image(png["grad_norm"], "train/grad_norm per step, laid out as the loss plot")

    doc.heading("Negative-loss calls and negative-token fractions")
    doc.table(neg, max_rows=250)
    doc.image(png["negatives"], "negative-loss calls / loss calls and negative-token fraction")

    doc.heading("FP64 spot checks")
    doc.para(f"Each spot check recomputes the loss and d loss / d logits in FP64 on the same inputs. Tolerance: "
             f"|loss − FP64| ≤ {st.loss_rtol:g}·|FP64| + {st.loss_atol:g}; gradient relative L2 ≤ "
             f"{st.grad_rel_l2_max:g}.")
    doc.table(spot_dist, caption="error distribution per variant (precision, mixed dtypes at the loss boundary)")
    doc.image(png["spot"], "spot-check errors per variant, log scale")

    doc.heading("β-curve: paper vs continuous form")
    doc.para("FP64 D(β) on fixed synthetic inputs (seed 7, vocabulary 300), so the curve shows the formula, not "
             "training noise. "
             "The paper form β·KL(T‖M)+(1−β)·KL(S‖M) falls to ≈ min(β, 1−β)·KL next to the endpoints while the "
             "endpoint branches return the full KLs (a jump); the continuous form (1−β)·KL(T‖M)+β·KL(S‖M) meets them.")
    doc.table(curve.pivot(index="beta", columns="form", values="D").reset_index(), caption="FP64 D(β)")
    doc.table(jumps, caption="D next to the endpoints / endpoint value (1 = continuous)")
    if cap_curve is not None:
        doc.table(cap_curve.pivot(index="beta", columns="form", values="D").reset_index(),
                  caption=f"FP64 D(β) on {cap_curve['source'].iloc[0]} inputs")
        doc.table(endpoint_jumps(cap_curve), caption="captured inputs: D next to the endpoints / endpoint value")
        doc.image(png["beta_captured"], "FP64 D(β) on captured loss inputs")
    elif captures and capture_error:
        doc.para(f"FP64 β-curve on captured inputs unavailable: {capture_error}")
    doc.para(f"Training: mean of the first {rcfg.first_steps} logged steps per run, averaged over runs with the "
             "same (form, precision, β).")
    doc.table(train_curve, max_rows=100)
    n_betas = train_curve["gkd.beta"].nunique() if not train_curve.empty else 0
    if n_betas < 2:
        doc.para(f"The sweep trained at {n_betas} β value(s), so the plot has no training panels (they need 2 or more).")
    doc.image(png["beta"], "β-curve: FP64 D(β) and, with 2 or more trained β, training loss / grad_norm against β "
              "(endpoints circled)")

    doc.heading("Step-for-step agreement")
    ld_forms, ld_precs = largest_divergence(forms), largest_divergence(precs)
    doc.para("Paper vs continuous at β ∈ {" + ", ".join(f"{b:g}" for b in cfg.beta_forms_unchanged.betas)
             + "} (runs equal in every other config key): largest divergence "
             + (f"{ld_forms['max_rel_diff']:.3g} relative ({ld_forms['max_abs_diff']:.3g} absolute) in "
                f"{ld_forms['metric']} at step {ld_forms['at_step']}." if ld_forms else "not measured (no pairs)."))
    doc.table(forms, max_rows=100)
    doc.para("Native vs fp32 precision where both sides reach the loss in FP32: largest divergence "
             + (f"{ld_precs['max_rel_diff']:.3g} relative ({ld_precs['max_abs_diff']:.3g} absolute) in "
                f"{ld_precs['metric']} at step {ld_precs['at_step']}." if ld_precs else "not measured (no pairs)."))
    doc.table(precs, max_rows=100)

    doc.heading("Seed defect table (native / FP32 / FP64 on the seed report's synthetic input)")
    seed = _seed_defect(sweep, doc)
    doc.heading("Replay of captures (native / FP32 / FP64 on the training inputs)")
    _, replay_avg = _replay(captures, doc)

    doc.heading("Criteria file")
    import yaml

    doc.code(yaml.safe_dump(cfg.to_dict(), sort_keys=False))

    exit_code = EXIT_PASS if verdict == "pass" else EXIT_FAIL
    out = {
        "schema_version": VERDICT_SCHEMA_VERSION,
        "verdict": verdict,
        "exit_code": exit_code,
        "failed_criteria": [r.name for r in results if r.status in FAILING],
        "failed_reasons": {r.name: r.reason() for r in results if r.status in FAILING},
        "not_applicable": {r.name: r.measured for r in results if r.status == "not_applicable"},
        "criteria": [r.to_dict() for r in results],
        "sweep": sweep.source,
        "groups": sweep.groups,
        "n_runs": int(len(runs)),
        "runs_by_outcome": {k: int(v) for k, v in outcome_counts.items()},
        "runs": _records(runs[[c for c in _RUN_COLS if c in runs.columns]]),
        "beta_curve": {"fp64_endpoint_jumps": _records(jumps),
                       "captured_endpoint_jumps": _records(endpoint_jumps(cap_curve)) if cap_curve is not None else None,
                       "training": _records(train_curve)},
        "largest_divergence": {"beta_forms": _jsonable(ld_forms), "precisions_fp32": _jsonable(ld_precs)},
        "replay": _records(replay_avg) if replay_avg is not None else None,
        "seed_defect": _records(seed) if seed is not None else None,
        "criteria_config": cfg.to_dict(),
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "provenance": {"analysis": git_state(),
                       "runs": _records(runs[["run"] + [c for c in _PROVENANCE_COLS if c in runs.columns]])},
        "package_versions": {"analysis": analysis_package_versions(),
                             "runs": {k[len("version."):]: [str(x) for x in v] for k, v in versions.items()}},
        "files": {"markdown": "report.md", "html": "report.html",
                  "plots": sorted(p.name for p in png.values() if p is not None)},
    }
    (report_dir / "report.md").write_text(doc.to_markdown())
    (report_dir / "report.html").write_text(doc.to_html())
    (report_dir / "verdict.json").write_text(json.dumps(_jsonable(out), indent=1, default=str))
    out["_tables"] = {"runs": runs, "summary": summary, "negatives": neg, "spot_distribution": spot_dist,
                      "beta_curve_fp64": curve, "beta_curve_training": train_curve, "forms_agreement": forms,
                      "precision_agreement": precs,
                      "criteria": pd.DataFrame([{k: v for k, v in r.to_dict().items() if k != "details"}
                                                for r in results])}
    out["_plots"] = {k: v for k, v in png.items() if v is not None}
    return out
