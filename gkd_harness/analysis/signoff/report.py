"""The sign-off report: criteria verdict, comparison tables, β-curve, replay, written as
``report.md``, ``report.html`` (same report, self-contained), ``*.png`` and ``verdict.json``.

The report folder is written completely or not at all: everything is built in a temporary folder next to it,
which then replaces the folder (an old report there is removed only after the new one is complete).

Exit codes (see :mod:`gkd_harness.analysis.cli`): 0 pass, 1 fail, 2 unusable input or internal error.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import pandas as pd

from gkd_harness.analysis.signoff import outcome, plots
from gkd_harness.analysis.signoff.betacurve import (
    beta_defect_inputs,
    capture_inputs,
    endpoint_jumps,
    fp64_beta_curve,
    training_beta_curve,
)
from gkd_harness.analysis.signoff.compare import (
    forms_agreement,
    largest_divergence,
    precision_agreement,
    run_summary,
    spot_distribution,
)
from gkd_harness.analysis.signoff.criteria import Evidence, counts
from gkd_harness.analysis.signoff.criteria_file import SignoffCriteria
from gkd_harness.analysis.signoff.document import Document, Link
from gkd_harness.analysis.signoff.verdict import EXIT_FAIL, EXIT_PASS, judgement, report_digests, sweep_inputs
from gkd_harness.analysis.signoff.verdict import jsonable as _jsonable
from gkd_harness.analysis.sweep.evidence import precisions_of
from gkd_harness.analysis.sweep.records import Sweep, UnusableInput
from gkd_harness.harness.contract import (
    CAPTURES_DIR,
    FAILING_STATUSES,
    ORIGINAL,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
)
from gkd_harness.harness.store.provenance import git_state
from gkd_harness.harness.store.records import read_command, read_quietly, read_summary, wandb_run_id

if TYPE_CHECKING:
    from gkd_harness.analysis.signoff.judge import Judged

__all__ = [
    "build_report",
    "EXIT_PASS",
    "EXIT_FAIL",
    "EXIT_UNUSABLE",
    "VERDICT_SCHEMA_VERSION",
    "find_captures",
    "analysis_package_versions",
    "report_title",
    "ReportContext",
    "SECTIONS",
]

EXIT_UNUSABLE = 2
#: Version of the verdict.json layout; raise it when a key changes meaning or goes away.
#: 2: judgement keys of gkd_harness.analysis.signoff.verdict (counts, allow_mixed, mixed, run_files, inputs).
VERDICT_SCHEMA_VERSION = 2
_PROVENANCE_COLS = (
    "loss.precision",
    "version.harness_commit",
    "version.harness_dirty",
    "version.loss_sha256",
    "version.ms-swift",
)
_RUN_COLS = [
    "run",
    "gkd.beta",
    "loss.beta_form",
    "loss.precision",
    "gkd.temperature",
    "gkd.topk",
    "run.seed",
    "backend.name",
    "dtype.student",
    "dtype.teacher",
    "role",
    "outcome",
    "last_step",
    "planned_steps",
    "train_steps",
    "eval_records",
    "error",
    "problems",
]


def analysis_package_versions() -> dict:
    """Versions of the packages that produced this report: the training stack
    (:func:`gkd_harness.harness.store.provenance.package_versions`) plus the analysis stack and Python."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from gkd_harness.harness.store.provenance import package_versions

    out = dict(package_versions())
    for name in ("gkd-harness", "numpy", "pandas", "matplotlib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def find_captures(sweep: Sweep) -> list:
    """Capture files of the sweep's local run folders (``<run>/captures/*.safetensors``), found by gkd-replay's
    own :func:`gkd_harness.analysis.replay.variants.find_captures` (imported only when a run has a captures folder)."""
    folders = [Path(p) / CAPTURES_DIR for p in sweep.runs["path"].dropna()]
    folders = [d for d in folders if d.is_dir()]
    if not folders:
        return []
    from gkd_harness.analysis.replay.variants import find_captures as replay_captures
    from gkd_harness.harness.store.captures import CaptureError

    out = []
    for d in folders:
        try:
            out += replay_captures([d])
        except CaptureError:  # an empty captures/ folder: nothing to replay there
            continue
    return out


def _records(df: pd.DataFrame) -> list:
    return _jsonable(df.to_dict(orient="records")) if df is not None and not df.empty else []


def _replay(captures: list, doc: Document) -> tuple:
    """Run ``gkd_harness.analysis.replay.variants.replay_table`` on the captures; returns (per_capture, averaged) or (None, None)."""
    if not captures:
        doc.para(
            "No captures in this sweep (`monitor.capture` was off), so there is nothing to replay. "
            "Enable captures to get the native / FP32 / FP64 table on the training inputs."
        )
        return None, None
    try:
        from gkd_harness.analysis.replay.variants import replay_table
    except ImportError as e:  # pragma: no cover - the harness ships replay
        doc.para(f"Replay unavailable: cannot import gkd_harness.analysis.replay.variants ({e}).")
        return None, None
    try:
        per_capture, averaged = replay_table([str(c) for c in captures])
    except Exception as e:  # a bad capture must not hide the rest of the report
        doc.para(f"Replay failed on the sweep's captures: {type(e).__name__}: {e}")
        return None, None
    doc.para(
        f"`gkd-replay` on {len(captures)} captures: each capture's inputs recomputed with the native, FP32 "
        "and FP64 loss (same inputs, only the arithmetic changes). Mean over ranks per (run, step):"
    )
    doc.table(averaged, caption="replay, mean over ranks")
    doc.table(per_capture, max_rows=40, caption="replay, per capture")
    return per_capture, averaged


def _seed_defect(sweep: Sweep, doc: Document) -> Optional[pd.DataFrame]:
    """The seed defect table (:func:`gkd_harness.analysis.signoff.seed_defect.seed_defect_table`) for the seed pair and the sweep's
    dtype pairs, written into ``doc``; shown in every report, with or without captures."""
    try:
        from gkd_harness.analysis.signoff.seed_defect import (
            seed_defect_table,
            seed_input_description,
            sweep_dtype_pairs,
        )

        table = seed_defect_table(sweep_dtype_pairs(sweep.runs))
        described = seed_input_description()
    except Exception as e:  # the table must not hide the rest of the report
        doc.para(f"Seed defect table unavailable: {type(e).__name__}: {e}")
        return None
    doc.para(
        f"The seed report's fixed synthetic input ({described}), recomputed with the native (upstream), "
        "FP32 and FP64 loss: same inputs, only the arithmetic changes. Rows for each other dtype pair this sweep's runs saw at the loss follow. "
        "`grad_rel_l2`: relative L2 error of d loss / d student logits against FP64; each row's command "
        "prints the same numbers."
    )
    doc.table(table, caption="seed defect table (gkd-replay synthetic)")
    return table


def _plottable(sweep: Sweep) -> Sweep:
    """The runs whose variant is known (β, β form and precision set): a point that failed before its config
    was recorded is listed in the report and counted by the criteria, but has nothing to plot."""
    r = sweep.runs
    keep = r["gkd.beta"].notna() & r["loss.beta_form"].notna() & r["loss.precision"].notna()
    if keep.all():
        return sweep
    names = set(r.loc[keep, "run"])
    return Sweep(
        source=sweep.source,
        runs=r[keep].reset_index(drop=True),
        history=sweep.history[sweep.history["run"].isin(names)].reset_index(drop=True),
        nonfinite=sweep.nonfinite[sweep.nonfinite["run"].isin(names)].reset_index(drop=True),
    )


def report_owned_files(report_dir: Path) -> Optional[set]:
    """The names an earlier report wrote into ``report_dir`` (its ``verdict.json`` and the files it lists:
    ``report.md``, ``report.html``, the plots); None when the folder holds no readable verdict.json."""
    try:
        recorded = json.loads((report_dir / "verdict.json").read_text())
    except (OSError, ValueError):
        return None
    files = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(files, dict):
        return None
    names = {"verdict.json", str(files.get("markdown") or ""), str(files.get("html") or "")}
    names |= {str(p) for p in (files.get("plots") or []) if isinstance(p, str)}
    return {n for n in names if n and "/" not in n and n not in (".", "..")}


def _check_report_dir(report_dir: Path) -> None:
    """Refuse to write into a folder that holds anything an earlier report did not write: a new or empty folder
    is fine, and so is an earlier report whose every entry its verdict.json lists (``files``); any other entry
    (a note, a sweep, a run folder, a sub-folder) refuses the whole folder, naming it, so nothing of the user's is
    ever replaced."""
    if not report_dir.exists() and not report_dir.is_symlink():
        return
    if report_dir.is_symlink() or not report_dir.is_dir():
        raise UnusableInput(f"--report {report_dir} exists and is not a folder: give a new or empty folder")
    entries = sorted(p.name for p in report_dir.iterdir())
    if not entries:
        return
    owned = report_owned_files(report_dir) or set()
    foreign = [n for n in entries if n not in owned or (report_dir / n).is_dir() or (report_dir / n).is_symlink()]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" ... ({len(foreign)} entries)" if len(foreign) > 5 else "")
        raise UnusableInput(
            f"--report {report_dir} holds what gkd-analyze did not write ({shown}): a report folder holds only "
            "its report; give a new or empty folder"
        )


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


def build_report(
    judged: "Judged",
    report_dir: Path,
    captures: Optional[list] = None,
    *,
    source: Optional[dict] = None,
) -> dict:
    """Write the report folder ``report_dir`` of a judged sweep, completely or not at all. The verdict is the
    judge's (:func:`gkd_harness.analysis.signoff.judge.judge`): this renders it and never computes one.

    ``source``: how the runs were loaded (``source``, ``sweep``, ``group``: what --verify reloads); the criteria
    file, ``--allow-mixed`` and what it let through come with ``judged`` (recorded in verdict.json, shown in the
    banner).

    Returns the verdict dict (also written as ``verdict.json``); ``verdict["exit_code"]`` is 0 (pass) or 1
    (fail). Raises :class:`UnusableInput` when ``report_dir`` is a folder that is not an earlier report."""
    report_dir = Path(report_dir).absolute()
    _check_report_dir(report_dir)
    report_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = report_dir.with_name(f".{report_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        out = _write_report(judged, tmp, captures, source)
        _replace_dir(tmp, report_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out["_plots"] = {k: report_dir / Path(p).name for k, p in out["_plots"].items()}
    return out


@dataclass
class ReportContext:
    """Everything the report shows, each table computed once (the criteria's tables come from ``ev``); the
    verdict and the criteria's results are the judge's (``judged``)."""

    judged: "Judged"
    report_dir: Path
    source: Optional[dict] = None
    shown: Optional[Sweep] = None
    summary: pd.DataFrame = None
    spot_dist: pd.DataFrame = None
    forms: pd.DataFrame = None
    precs: pd.DataFrame = None
    curve: pd.DataFrame = None
    jumps: pd.DataFrame = None
    train_curve: pd.DataFrame = None
    captures: list = field(default_factory=list)
    cap_curve: Optional[pd.DataFrame] = None
    capture_error: Optional[str] = None
    png: dict = field(default_factory=dict)
    seed: Optional[pd.DataFrame] = None
    replay_avg: Optional[pd.DataFrame] = None

    @property
    def ev(self) -> Evidence:
        return self.judged.ev

    @property
    def cfg(self) -> SignoffCriteria:
        return self.judged.cfg

    @property
    def verdict(self) -> str:
        return self.judged.verdict

    @property
    def results(self) -> list:
        return self.judged.results

    @property
    def mixed(self) -> list:
        return self.judged.mixed

    @property
    def allow_mixed(self) -> bool:
        return self.judged.allow_mixed

    @property
    def criteria_file(self) -> Optional[Path]:
        return self.judged.criteria_file

    @property
    def sweep(self) -> Sweep:
        return self.ev.sweep

    @property
    def runs(self) -> pd.DataFrame:
        return self.ev.sweep.runs


def _tables(ctx: ReportContext, captures: Optional[list]) -> None:
    """Compute every table and curve of the report once."""
    sweep, cfg = ctx.sweep, ctx.cfg
    ctx.shown = _plottable(sweep)  # plots and the training β-curve: runs whose variant is known
    ctx.summary = run_summary(sweep)
    ctx.spot_dist = spot_distribution(ctx.ev.spots)
    ctx.forms = forms_agreement(sweep, cfg.beta_forms_unchanged.betas)
    ctx.precs = precision_agreement(sweep)
    s, t = beta_defect_inputs()
    ctx.curve = fp64_beta_curve(s, t, cfg.report.beta_curve_betas, source="fixed synthetic (seed 7, V=300)")
    ctx.jumps = endpoint_jumps(ctx.curve)
    ctx.train_curve = training_beta_curve(ctx.shown, cfg.report.first_steps)
    ctx.captures = find_captures(sweep) if captures is None else captures
    if ctx.captures:
        try:
            from gkd_harness.harness.store.captures import load_capture

            first = ctx.captures[0]
            cs, ct, temp, _ = capture_inputs(load_capture(first))
            if cs.shape[0]:
                ctx.cap_curve = fp64_beta_curve(
                    cs,
                    ct,
                    cfg.report.beta_curve_betas,
                    temperature=temp,
                    source=f"captured ({first.parent.parent.name}/{first.name})",
                )
        except Exception as e:  # report it, keep going
            ctx.capture_error = f"{type(e).__name__}: {e}"


def _plots(ctx: ReportContext) -> None:
    rcfg, st, d = ctx.cfg.report, ctx.cfg.spot_tolerance, ctx.report_dir
    shown = ctx.shown
    if shown is None:  # chosen with the tables, before the plots
        raise RuntimeError("report: the runs to show are chosen before the plots are drawn")
    plotted = set(shown.runs["run"])
    neg, spots = ctx.ev.negatives, ctx.ev.spots
    ctx.png = {
        "loss": plots.plot_curves(shown, TRAIN_LOSS, d / "loss_curves.png", rcfg.max_curve_panels),
        "grad_norm": plots.plot_curves(shown, TRAIN_GRAD_NORM, d / "grad_norm_curves.png", rcfg.max_curve_panels),
        "negatives": plots.plot_negatives(neg[neg["run"].isin(plotted)], d / "negatives.png"),
        "spot": plots.plot_spot_errors(
            spots[spots["run"].isin(plotted)],
            d / "spot_errors.png",
            st.grad_rel_l2_max,
            st.loss_rtol,
            st.param_grad_rel_l2_max,
        ),
        "beta": plots.plot_beta_curve(ctx.curve, ctx.train_curve, d / "beta_curve.png", first_steps=rcfg.first_steps),
        "beta_captured": (
            plots.plot_beta_curve(ctx.cap_curve, pd.DataFrame(), d / "beta_curve_captured.png")
            if ctx.cap_curve is not None
            else None
        ),
    }


def report_title(sweep: Sweep, host: Optional[str] = None) -> str:
    """The report's title: the sweep's group(s) and where it lives (an absolute path and the host), so the
    title still says which sweep once the file is shared."""
    import socket

    kind, _, where = sweep.source.partition(":")
    if kind == "local" and where:
        where = str(Path(where).absolute())
    name = ", ".join(map(str, sweep.groups)) or (Path(where).name if where else sweep.source)
    return f"GKD loss sign-off: {name} ({kind} {where} on {host or socket.gethostname()})"


def _banner(ctx: ReportContext, doc: Document) -> None:
    """The verdict banner: counts of passed, failed, not applicable, skipped and turned-off criteria, and
    ``--allow-mixed`` with what it let through."""
    from gkd_harness.analysis.signoff.judge import rests_on

    n = counts(ctx.results)
    runs = ctx.runs
    outcome_counts = runs["outcome"].value_counts().to_dict()
    rests = rests_on(ctx.judged)
    parts = [f"{n['passed']} passed, {n['failed']} failed, {n['not_applicable']} not applicable to this sweep's design"]
    if n["skipped"]:
        parts.append(f"{n['skipped']} skipped (not required, nothing measured: {', '.join(n['names']['skipped'])})")
    if n["disabled"]:
        parts.append(f"{n['disabled']} turned off by the criteria file ({', '.join(n['names']['disabled'])})")
    no_plan = "No plan (no sweep_manifest.json or multirun.yaml): completeness not checked. "
    detail = (
        (no_plan if getattr(ctx.sweep, "plan", None) is None else "")
        + (f"Not the shipped criteria: {rests}. " if rests else "")
        + "; ".join(parts)
        + "."
    )
    if n["failed"]:
        detail += f" Failing: {', '.join(n['names']['failed'])}."
    if ctx.allow_mixed:
        detail += (
            " Analysed with --allow-mixed: " + ("; ".join(ctx.mixed) if ctx.mixed else "nothing mixed found") + "."
        )
    detail += (
        f" {len(runs)} runs ({', '.join(f'{v} {k}' for k, v in sorted(outcome_counts.items()))}); judged: "
        f"{ctx.ev.judged_why}. Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}."
    )
    failing = [r for r in ctx.results if r.status in FAILING_STATUSES]
    doc.banner(ctx.verdict, detail, failing=[(f"{r.name} ({r.status})", r.reason()) for r in failing])


def _ran(runs: pd.DataFrame) -> pd.Series:
    """Which runs exist (a planned point without a run folder is ``missing``: it has no variant, no versions)."""
    return runs["status"].astype(str) != "missing" if "status" in runs.columns else pd.Series(True, index=runs.index)


def _versions_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per variant: its loss sha256, ms-swift version, harness tree and runs (each sha256 shown with
    the variant it belongs to). Planned runs that never ran have none of these: they are left out here (the
    Runs section lists them), not shown as a variant of nulls."""
    cols = ["variant_label", "loss_sha256", "ms_swift", "harness_commit", "harness_dirty"]
    r = runs[_ran(runs)].reindex(columns=cols + ["run"]).copy()
    r["loss_sha256"] = r["loss_sha256"].map(lambda v: str(v)[:16] if isinstance(v, str) else None)
    r["harness_commit"] = r["harness_commit"].map(lambda v: str(v)[:12] if isinstance(v, str) else None)
    key = ["|".join(map(str, row)) for row in r[cols].itertuples(index=False, name=None)]
    g = r.assign(_k=key).groupby("_k", sort=True)
    out = g.first()[cols].rename(
        columns={
            "variant_label": "variant",
            "loss_sha256": "loss sha256 (first 16)",
            "ms_swift": "ms-swift",
            "harness_commit": "harness commit",
            "harness_dirty": "dirty",
        }
    )
    out["runs"] = g.size()
    return out.sort_values("variant").reset_index(drop=True)


def _heading_section(ctx: ReportContext, doc: Document) -> None:
    _banner(ctx, doc)
    headline = ctx.judged.headline
    if headline:  # issue 40: the smoke numbers in one line, not spread over the criteria table
        doc.para(f"**{headline}**")
    doc.table(_versions_table(ctx.runs), caption="variants: the loss code each ran (sha256), ms-swift, harness tree")
    effect = outcome.headline(ctx.sweep, precisions_of(ORIGINAL)[0], ctx.ev.patched_precisions)
    if effect:  # issue 20: the held-out effect in one sentence on the first screen
        doc.para("Held-out outcome: " + effect)
    doc.toc()


def _criteria_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Criteria")
    doc.para(
        "`not_applicable`: the sweep's design does not contain the criterion's subject (never a failure); "
        "`not_measured`: the design has the subject but the evidence is missing (a failure when required); "
        "`disabled`: turned off by the criteria file."
    )
    doc.table(
        pd.DataFrame(
            [
                {
                    "criterion": r.title,
                    "status": r.status,
                    "why it applies": r.applies,
                    "threshold": r.threshold,
                    "measured": r.measured,
                }
                for r in ctx.results
            ]
        )
    )
    for r in ctx.results:
        if r.details:
            doc.heading(f"{r.title}: {r.status}", 3)
            doc.bullets(r.details[:40] + ([f"... {len(r.details) - 40} more"] if len(r.details) > 40 else []))


def _runs_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Runs")
    doc.para(
        "Failed and incomplete runs are listed here and counted by the criteria; none is dropped. "
        "`train_steps`: steps that logged train/loss; `eval_records`: held-out evaluations, counted apart."
    )
    runs = ctx.runs
    doc.table(runs[[c for c in _RUN_COLS if c in runs.columns]], max_rows=250)


def _cuda_of_torch(version: Optional[str]) -> Optional[str]:
    """The CUDA version a torch build names in its local tag (``2.8.0+cu128`` -> ``12.8``; ``+cpu`` -> ``none``);
    None for an untagged build (the registry's wheels), whose CUDA the tag does not say."""
    tag = str(version or "").partition("+")[2]
    if tag == "cpu":
        return "none"
    if tag.startswith("cu") and tag[2:].isdigit() and len(tag) >= 5:
        return f"{tag[2:-1]}.{tag[-1]}"
    return None


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _device_text(summary: dict, command: dict) -> Optional[str]:
    """``cpu``, or ``cuda: 8 x NVIDIA H100 80GB HBM3`` from what the run recorded (its plan's device, the rank's
    GPU); an older run folder without them: ``cpu`` when its ms-swift command says ``--use_cpu true``."""
    runtime = _mapping(summary.get("runtime"))
    device = summary.get("device")
    argv = [str(a) for a in command.get("argv") or []]
    if device is None and "--use_cpu" in argv[:-1] and argv[argv.index("--use_cpu") + 1] == "true":
        device = "cpu"
    if device == "cuda" and runtime.get("gpu"):
        return f"cuda: {runtime.get('gpus') or 1} x {runtime['gpu']}"
    return device


def provenance_table(runs: pd.DataFrame, report_dir: Path) -> pd.DataFrame:
    """One row per run: its folder (a link, relative to the report folder), status, the wandb run id, torch and
    the CUDA it was built with, the device, the world size and the harness commit, read from the run folder
    (summary.json, command.json, wandb/). A planned run that never ran: its name and status only."""
    rows = []
    for row in runs.to_dict(orient="records"):
        path = row.get("path") if isinstance(row.get("path"), str) else None
        folder = Path(path) if path else None
        summary = dict(read_quietly(read_summary, folder) or {}) if folder else {}
        cmd = read_quietly(read_command, folder) if folder else None
        command = {"argv": list(cmd.argv), "env": cmd.env} if cmd is not None else {}
        runtime = _mapping(summary.get("runtime"))
        torch = runtime.get("torch") or _mapping(summary.get("versions")).get("torch") or row.get("version.torch")
        commit = row.get("harness_commit")
        rows.append(
            {
                "run": Link(str(row["run"]), os.path.relpath(folder, report_dir)) if folder else str(row["run"]),
                "status": row.get("status"),
                "wandb run id": wandb_run_id(folder) if folder else None,
                "torch": torch,
                "CUDA": (runtime["cuda"] or "none") if "cuda" in runtime else _cuda_of_torch(torch),
                "device": _device_text(summary, command),
                "world size": summary.get("world_size"),
                "harness commit": str(commit)[:12] if isinstance(commit, str) else None,
            }
        )
    return pd.DataFrame(rows)


def _provenance_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Run provenance")
    doc.para(
        "Each run's folder (linked, relative to this report), its wandb run id, the torch build and the CUDA it "
        "was built with, and the device it trained on, as the run folder recorded them."
    )
    # the report is built in a folder beside its final one: a link relative to it is the same from the final one
    doc.table(provenance_table(ctx.runs, ctx.report_dir), max_rows=250)


def _outcome_section(ctx: ReportContext, doc: Document) -> None:
    outcome.report_section(ctx.sweep, doc, ctx.report_dir, precisions_of(ORIGINAL)[0], ctx.ev.patched_precisions)


def _curves_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Original vs patched: loss and grad_norm")
    doc.para(
        "Original = `loss.precision=native` (upstream arithmetic), patched = `fp32` or a candidate, reference "
        "= `fp64` (gkd_harness.harness.contract.role_of). Per run: last logged value and mean over all logged steps."
    )
    doc.table(ctx.summary, max_rows=250)
    doc.image(
        ctx.png["loss"],
        "train/loss per step, one panel per β, one line per run in its variant's colour and "
        "marker; where native/fp32 pairs exist, the panel below shows native − fp32",
    )
    doc.image(ctx.png["grad_norm"], "train/grad_norm per step, laid out as the loss plot")


def _negatives_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Negative-loss calls and negative-token fractions")
    doc.table(ctx.ev.negatives, max_rows=250)
    doc.image(ctx.png["negatives"], "negative-loss calls / loss calls and negative-token fraction")


def _spot_section(ctx: ReportContext, doc: Document) -> None:
    st = ctx.cfg.spot_tolerance
    doc.heading("FP64 spot checks")
    doc.para(
        f"Each spot check recomputes the loss and d loss / d logits in FP64 on the same inputs. Tolerance: "
        f"|loss − FP64| ≤ {st.loss_rtol:g}·|FP64| + {st.loss_atol:g}; gradient relative L2 ≤ "
        f"{st.grad_rel_l2_max:g}."
    )
    doc.table(ctx.spot_dist, caption="error distribution per variant (precision, mixed dtypes at the loss boundary)")
    doc.image(ctx.png["spot"], "spot-check errors per variant, log scale")


def _beta_section(ctx: ReportContext, doc: Document) -> None:
    rcfg = ctx.cfg.report
    doc.heading("β-curve: paper vs continuous form")
    doc.para(
        "FP64 D(β) on fixed synthetic inputs (seed 7, vocabulary 300), so the curve shows the formula, not "
        "training noise. "
        "The paper form β·KL(T‖M)+(1−β)·KL(S‖M) falls to ≈ min(β, 1−β)·KL next to the endpoints while the "
        "endpoint branches return the full KLs (a jump); the continuous form (1−β)·KL(T‖M)+β·KL(S‖M) meets them."
    )
    doc.table(ctx.curve.pivot(index="beta", columns="form", values="D").reset_index(), caption="FP64 D(β)")
    doc.table(ctx.jumps, caption="D next to the endpoints / endpoint value (1 = continuous)")
    if ctx.cap_curve is not None:
        doc.table(
            ctx.cap_curve.pivot(index="beta", columns="form", values="D").reset_index(),
            caption=f"FP64 D(β) on {ctx.cap_curve['source'].iloc[0]} inputs",
        )
        doc.table(endpoint_jumps(ctx.cap_curve), caption="captured inputs: D next to the endpoints / endpoint value")
        doc.image(ctx.png["beta_captured"], "FP64 D(β) on captured loss inputs")
    elif ctx.captures and ctx.capture_error:
        doc.para(f"FP64 β-curve on captured inputs unavailable: {ctx.capture_error}")
    doc.para(
        f"Training: mean of the first {rcfg.first_steps} logged steps per run, averaged over runs with the "
        "same (form, precision, β)."
    )
    doc.table(ctx.train_curve, max_rows=100)
    n_betas = ctx.train_curve["gkd.beta"].nunique() if not ctx.train_curve.empty else 0
    if n_betas < 2:
        doc.para(
            f"The sweep trained at {n_betas} β value(s), so the plot has no training panels (they need 2 or more)."
        )
    doc.image(
        ctx.png["beta"],
        "β-curve: FP64 D(β) and, with 2 or more trained β, training loss / grad_norm against β (endpoints circled)",
    )


def _divergence_text(ld: Optional[dict]) -> str:
    return (
        f"{ld['max_rel_diff']:.3g} relative ({ld['max_abs_diff']:.3g} absolute) in {ld['metric']} at step "
        f"{ld['at_step']}."
        if ld
        else "not measured (no pairs)."
    )


def _agreement_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Step-for-step agreement")
    doc.para(
        "Paper vs continuous at β ∈ {"
        + ", ".join(f"{b:g}" for b in ctx.cfg.beta_forms_unchanged.betas)
        + "} (runs equal in every other config key): largest divergence "
        + _divergence_text(largest_divergence(ctx.forms))
    )
    if not ctx.forms.empty:  # "not measured (no pairs)" says it; no "(no rows)" under it
        doc.table(ctx.forms, max_rows=100)
    doc.para(
        "Native vs fp32 precision where both sides reach the loss in FP32 (shown, not judged: the criterion "
        "judges each side against FP64): largest divergence " + _divergence_text(largest_divergence(ctx.precs))
    )
    if not ctx.precs.empty:
        doc.table(ctx.precs, max_rows=100)


def _seed_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Seed defect table (native / FP32 / FP64 on the seed report's synthetic input)")
    ctx.seed = _seed_defect(ctx.sweep, doc)


def _replay_section(ctx: ReportContext, doc: Document) -> None:
    doc.heading("Replay of captures (native / FP32 / FP64 on the training inputs)")
    _, ctx.replay_avg = _replay(ctx.captures, doc)


def _criteria_file_section(ctx: ReportContext, doc: Document) -> None:
    import yaml

    doc.heading("Criteria file")
    doc.para(
        "Effective criteria: the shipped defaults"
        + (f" with {ctx.criteria_file} merged over them" if ctx.criteria_file else "")
        + "."
    )
    doc.code(yaml.safe_dump(ctx.cfg.to_dict(), sort_keys=False))


#: The report's sections, in order; each writes its part of the document from the context.
SECTIONS = (
    _heading_section,
    _criteria_section,
    _runs_section,
    _provenance_section,
    _outcome_section,
    _curves_section,
    _negatives_section,
    _spot_section,
    _beta_section,
    _agreement_section,
    _seed_section,
    _replay_section,
    _criteria_file_section,
)


def _verdict(ctx: ReportContext) -> dict:
    runs = ctx.runs
    versions = {c: runs[c].dropna().unique().tolist() for c in runs.columns if c.startswith("version.")}
    return {
        "schema_version": VERDICT_SCHEMA_VERSION,
        **judgement(ctx.judged),
        "not_applicable": {r.name: r.measured for r in ctx.results if r.status == "not_applicable"},
        "sweep": ctx.sweep.source,
        "groups": ctx.sweep.groups,
        "inputs": sweep_inputs(ctx.ev.sweep, ctx.cfg, ctx.criteria_file, ctx.source),
        "runs": _records(runs[[c for c in _RUN_COLS if c in runs.columns]]),
        "beta_curve": {
            "fp64_endpoint_jumps": _records(ctx.jumps),
            "captured_endpoint_jumps": (_records(endpoint_jumps(ctx.cap_curve)) if ctx.cap_curve is not None else None),
            "training": _records(ctx.train_curve),
        },
        "largest_divergence": {
            "beta_forms": _jsonable(largest_divergence(ctx.forms)),
            "precisions_fp32": _jsonable(largest_divergence(ctx.precs)),
        },
        "replay": _records(ctx.replay_avg) if ctx.replay_avg is not None else None,
        "seed_defect": _records(ctx.seed) if ctx.seed is not None else None,
        "criteria_config": ctx.cfg.to_dict(),
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "provenance": {
            "analysis": git_state(),
            "runs": _records(runs[["run"] + [c for c in _PROVENANCE_COLS if c in runs.columns]]),
        },
        "package_versions": {
            "analysis": analysis_package_versions(),
            "runs": {k[len("version.") :]: [str(x) for x in v] for k, v in versions.items()},
        },
        "files": {
            "markdown": "report.md",
            "html": "report.html",
            "plots": sorted(p.name for p in ctx.png.values() if p is not None),
        },
    }


def _write_report(judged: "Judged", report_dir: Path, captures: Optional[list], source: Optional[dict]) -> dict:
    """Write every report file into the (new, empty) folder ``report_dir``; returns the verdict dict."""
    ctx = ReportContext(judged, report_dir, source)
    ev, results = ctx.ev, ctx.results
    _tables(ctx, captures)
    _plots(ctx)
    doc = Document(report_title(ev.sweep))
    for section in SECTIONS:
        section(ctx, doc)
    out = _verdict(ctx)
    (report_dir / "report.md").write_text(doc.to_markdown())
    (report_dir / "report.html").write_text(doc.to_html())
    out["report_files"] = report_digests(report_dir, ["report.md", "report.html", *out["files"]["plots"]])
    (report_dir / "verdict.json").write_text(json.dumps(_jsonable(out), indent=1, default=str))
    out["_tables"] = {
        "runs": ctx.runs,
        "summary": ctx.summary,
        "negatives": ev.negatives,
        "spot_distribution": ctx.spot_dist,
        "beta_curve_fp64": ctx.curve,
        "beta_curve_training": ctx.train_curve,
        "forms_agreement": ctx.forms,
        "precision_agreement": ctx.precs,
        "criteria": pd.DataFrame([{k: v for k, v in r.to_dict().items() if k != "details"} for r in results]),
    }
    out["_plots"] = {k: v for k, v in ctx.png.items() if v is not None}
    return out
