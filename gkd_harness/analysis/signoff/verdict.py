"""A verifiable verdict: what ``verdict.json`` records so that ``gkd-analyze --verify REPORT_DIR`` can recompute it.

``verdict.json`` carries

* the **judgement** (:func:`judgement`): the verdict, its exit code, each criterion's status, measurement and
  details, the counts shown in the banner, ``allow_mixed`` and what it let through, and the sha256 of each
  judged run's ``metrics.jsonl``, ``summary.json`` and ``config.yaml`` (:func:`run_files`);
* the **inputs** (:func:`sweep_inputs`): where the runs came from (source, absolute sweep path, group) and the
  criteria (the file given with ``--criteria`` and its sha256, and the sha256 of the effective criteria, the
  shipped defaults with that file merged over them).

:func:`first_difference` compares a recorded verdict with one recomputed from the run folders and names the first
difference: other criteria, a run file changed, added or removed, a judgement key edited, or a ``report.md``
whose verdict is not the recorded one.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from gkd_harness.analysis.sweep.records import UnusableInput
from gkd_harness.harness.contract import CONFIG_FILE, FAILING_STATUSES, METRICS_FILE, SUMMARY_FILE

__all__ = [
    "RUN_FILES",
    "EXIT_PASS",
    "EXIT_FAIL",
    "file_sha256",
    "run_files",
    "criteria_digest",
    "judgement",
    "sweep_inputs",
    "read_verdict",
    "first_difference",
    "report_digests",
    "report_files_difference",
    "jsonable",
]

EXIT_PASS, EXIT_FAIL = 0, 1
#: Judgement keys --verify does not compare one by one: the run files (compared above, file by file) and what the
#: criteria changed (a function of the criteria, sealed by their sha256, and of the plan, compared as ``plan``;
#: the file's name may differ between the report and the check).
_SEALED_BY_CRITERIA = ("run_files", "rests_on", "criteria_changes")
#: The files of a run folder whose sha256 the verdict records.
RUN_FILES = (METRICS_FILE, SUMMARY_FILE, CONFIG_FILE)


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars as Python numbers, NaN/±Inf as None, tuples as lists (what json.dumps keeps)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def file_sha256(path: Path) -> Optional[str]:
    """sha256 of a file's bytes, None when it does not exist."""
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:  # in blocks: hashlib.file_digest is Python 3.11+, the package supports 3.10
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def run_files(runs) -> dict:
    """``{run: {file: sha256 or None}}`` for each run with a local folder (:data:`RUN_FILES`)."""
    out = {}
    for name, path in zip(runs["run"], runs["path"] if "path" in runs.columns else [None] * len(runs)):
        if isinstance(path, str) and path:
            out[str(name)] = {f: file_sha256(Path(path) / f) for f in RUN_FILES}
    return out


def criteria_digest(cfg, criteria_file: Optional[Path]) -> dict:
    """The criteria a verdict was reached with: ``file`` (given with --criteria, else None: the shipped
    defaults), ``file_sha256`` and ``sha256`` of the effective criteria (canonical JSON of every value)."""
    effective = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return {
        "file": str(Path(criteria_file).absolute()) if criteria_file else None,
        "file_sha256": file_sha256(Path(criteria_file)) if criteria_file else None,
        "sha256": hashlib.sha256(effective.encode()).hexdigest(),
    }


def judgement(j) -> dict:
    """The part of verdict.json that ``--verify`` recomputes from the run folders (JSON-ready), from a
    :class:`~gkd_harness.analysis.signoff.judge.Judged`: besides the verdict and each criterion, what it rests on
    (``rests_on``: :func:`~gkd_harness.analysis.signoff.judge.rests_on`; ``criteria_changes``: each key not at its
    shipped value; ``verdict_without_criteria_file``) and the ``headline``."""
    from gkd_harness.analysis.signoff.criteria import counts
    from gkd_harness.analysis.signoff.judge import rests_on

    ev, verdict, results = j.ev, j.verdict, j.results
    runs = ev.sweep.runs
    n = counts(results)
    return jsonable(
        {
            "verdict": verdict,
            "exit_code": EXIT_PASS if verdict == "pass" else EXIT_FAIL,
            "rests_on": rests_on(j),
            "criteria_changes": list(j.changes),
            "verdict_without_criteria_file": j.shipped,
            "headline": j.headline,
            "failed_criteria": [r.name for r in results if r.status in FAILING_STATUSES],
            "failed_reasons": {r.name: r.reason() for r in results if r.status in FAILING_STATUSES},
            "counts": {k: v for k, v in n.items() if k != "names"},
            "criteria": [r.to_dict() for r in results],
            "allow_mixed": bool(j.allow_mixed),
            "mixed": list(j.mixed),
            "judged": ev.judged_why,
            "plan": ev.sweep.plan.summary() if getattr(ev.sweep, "plan", None) is not None else None,
            "n_runs": int(len(runs)),
            "runs_by_outcome": {str(k): int(v) for k, v in runs["outcome"].value_counts().sort_index().items()},
            "run_files": run_files(runs),
        }
    )


def sweep_inputs(sweep, cfg, criteria_file: Optional[Path], source: Optional[dict] = None) -> dict:
    """Where the verdict's evidence came from: ``source`` (local | wandb-offline | wandb), ``sweep`` (an
    absolute path for a folder), ``group``, and the criteria (:func:`criteria_digest`)."""
    source = dict(source or {})
    kind, _, where = sweep.source.partition(":")
    source.setdefault("source", kind if kind in ("local", "wandb", "wandb-offline") else "local")
    source.setdefault("sweep", where)
    source.setdefault("group", None)
    if source["source"] in ("local", "wandb-offline") and source["sweep"]:
        source["sweep"] = str(Path(source["sweep"]).absolute())
    return {**source, "criteria": criteria_digest(cfg, criteria_file)}


def read_verdict(report_dir: Path) -> dict:
    """verdict.json of a report folder; :class:`UnusableInput` when it is missing or not a verdict."""
    path = Path(report_dir) / "verdict.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UnusableInput(f"{path}: missing (is {report_dir} a gkd-analyze report folder?)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UnusableInput(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict) or "run_files" not in data:
        raise UnusableInput(
            f"{path}: no inputs or run_files recorded (written before gkd-analyze --verify "
            "existed): write the report again"
        )
    return data


def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def report_digests(report_dir: Path, names: list) -> dict:
    """``{name: sha256}`` of the report's own files (report.md, report.html, the plots), recorded in verdict.json
    as ``report_files``."""
    return {str(n): file_sha256(Path(report_dir) / n) for n in names}


def report_files_difference(recorded: dict, report_dir: Path) -> Optional[str]:
    """The first of the report's files (``report_files`` in verdict.json) whose bytes changed since the report was
    written, as one line; None when all match or the report recorded none. Drift, not tampering: the digests sit
    beside the files they seal, so whoever edits both is not caught (docs/signoff.md)."""
    for name, sha in sorted((recorded.get("report_files") or {}).items()):
        now = file_sha256(Path(report_dir) / name)
        if now != sha:
            return f"{name} changed since the report (sha256 {str(sha)[:12]} recorded, {str(now)[:12]} now)"
    return None


def first_difference(
    recorded: dict, fresh: dict, criteria: dict, report_md: Optional[str], report_html: Optional[str] = None
) -> Optional[str]:
    """The first difference between a recorded verdict.json and the judgement recomputed from the runs with
    ``criteria`` (:func:`criteria_digest`), as one line; None when they match. ``report_md`` / ``report_html``: the
    report's text, whose banner must show the recomputed verdict."""
    was = recorded["inputs"].get("criteria") or {}
    if was.get("sha256") != criteria["sha256"]:
        return (
            f"different criteria: the report was judged with {was.get('file') or 'the shipped defaults'} "
            f"(sha256 {str(was.get('sha256'))[:12]}), this check with {criteria['file'] or 'the shipped defaults'} "
            f"(sha256 {criteria['sha256'][:12]}); pass the report's file with --criteria"
        )
    old, new = recorded.get("run_files") or {}, fresh["run_files"]
    for run in sorted(set(old) | set(new)):
        if run not in new:
            return f"run {run}: in the report, no longer in the sweep"
        if run not in old:
            return f"run {run}: in the sweep, not in the report"
        for f in sorted(set(old[run]) | set(new[run])):
            if old[run].get(f) != new[run].get(f):
                return (
                    f"run {run}: {f} changed since the report (sha256 {str(old[run].get(f))[:12]} recorded, "
                    f"{str(new[run].get(f))[:12]} now)"
                )
    for key, value in fresh.items():
        if key in _SEALED_BY_CRITERIA:
            continue
        if recorded.get(key) != value:
            if key == "criteria":
                for a, b in zip(recorded.get(key) or [], value):
                    if a != b:
                        field = next((k for k in b if a.get(k) != b[k]), "?")
                        return (
                            f"verdict.json: criterion {b['name']} {field} is {_short(a.get(field))}, the runs "
                            f"give {_short(b[field])}"
                        )
            return f"verdict.json: {key} is {_short(recorded.get(key))}, the runs give {_short(value)}"
    if report_md is not None:
        word = f"**Verdict: {str(fresh['verdict']).upper()}**"
        if word not in report_md:
            return f"report.md: its banner does not say {word.strip('*')} (the runs give {fresh['verdict'].upper()})"
    if report_html is not None:
        v = str(fresh["verdict"])
        word = f"<div id='verdict-banner' class='banner {v}' role='status'><span id='verdict'>{v.upper()}</span>"
        if word not in report_html:
            shown = next(
                (w.upper() for w in ("pass", "fail") if f"<span id='verdict'>{w.upper()}</span>" in report_html), None
            )
            return f"report.html: its banner says {shown or 'no verdict'}, the runs give {v.upper()}"
    return None
