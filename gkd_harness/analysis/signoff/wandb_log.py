"""Log a sign-off to wandb: one analysis run (``job_type="analysis"``) in the sweep's group, carrying the
verdict (summary), the tables (``wandb.Table``), the plots (``wandb.Image``) and one ``signoff`` artifact
(``report.html``, ``report.md``, ``verdict.json`` and the sweep's certificates), whose metadata and the run's
config name the training runs it judged (their wandb run ids). The analysis run's id and URL are written to
``wandb_run.json`` in the report folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import pandas as pd

__all__ = ["log_analysis_run", "wandb_target", "judged_run_ids", "signoff_files", "WANDB_RUN_FILE"]

#: the analysis run's id, URL and artifact, in the report folder
WANDB_RUN_FILE = "wandb_run.json"
#: the report files the sign-off artifact carries (those that exist)
REPORT_FILES = ("report.html", "report.md", "verdict.json")


def judged_run_ids(sweep) -> List[str]:
    """The wandb run ids of the training runs ``sweep`` holds, read from their run folders' wandb files
    (``wandb/wandb/{offline-,}run-<time>-<id>``), in the runs' order; a run without wandb files has none."""
    ids: List[str] = []
    paths = sweep.runs["path"].dropna() if "path" in sweep.runs.columns else []
    for path in paths:
        found = sorted(Path(str(path), "wandb", "wandb").glob("*run-*-*"))
        for run_dir in found[-1:]:
            if run_dir.is_dir():
                ids.append(run_dir.name.rsplit("-", 1)[-1])
    return ids


def signoff_files(sweep, report_dir) -> List[Path]:
    """What the sign-off artifact carries: the report's files and every certificate cached in the sweep folder."""
    files = [Path(report_dir) / f for f in REPORT_FILES if (Path(report_dir) / f).is_file()]
    paths = sweep.runs["path"].dropna() if "path" in sweep.runs.columns else []
    for sweep_dir in sorted({Path(str(p)).parent for p in paths}):
        files += sorted((sweep_dir / "certificates").glob("*/certificate.*"))
    return files


def wandb_target(sweep) -> dict:
    """project / entity / group / mode for the analysis run, from the runs' own tracking config.

    Falls back to ``WANDB_PROJECT`` / ``WANDB_ENTITY`` / ``WANDB_MODE`` and the group in ``summary.json``.
    """

    def first(col: str, env: Optional[str] = None, default=None):
        if col in sweep.runs.columns:
            vals = sweep.runs[col].dropna()
            if len(vals):
                return str(vals.iloc[0])
        return os.environ.get(env, default) if env else default

    groups = sweep.groups
    return {
        "project": os.environ.get("WANDB_PROJECT") or first("tracking.wandb.project", None, "gkd-harness"),
        "entity": os.environ.get("WANDB_ENTITY") or first("tracking.wandb.entity"),
        "group": groups[0] if len(groups) == 1 else (first("tracking.wandb.group") or None),
        "mode": os.environ.get("WANDB_MODE") or first("tracking.wandb.mode", None, "online"),
    }


def _table(df: pd.DataFrame):
    import wandb

    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = df[c].map(lambda v: "" if v is None else str(v))
    return wandb.Table(dataframe=df.reset_index(drop=True))


def log_analysis_run(result: dict, target: dict, report_dir, sweep=None) -> str:
    """Create the analysis run and log ``result`` (the dict from :func:`gkd_harness.analysis.signoff.report.build_report`).

    ``sweep``: the judged runs (their wandb ids go into the config and the artifact's metadata; their sweep's
    certificates into the artifact). Returns the run's URL, or its local directory (offline mode).
    """
    import wandb

    judged = judged_run_ids(sweep) if sweep is not None else []

    run = wandb.init(
        project=target["project"],
        entity=target["entity"],
        group=target["group"],
        job_type="analysis",
        name=f"signoff-{target['group'] or 'sweep'}",
        mode=target["mode"],
        dir=os.environ.get("WANDB_DIR") or str(report_dir),
        config={"criteria": result["criteria_config"], "sweep": result["sweep"], "judged_runs": judged},
        reinit="finish_previous",
    )
    try:
        run.summary["verdict"] = result["verdict"]
        run.summary["exit_code"] = result["exit_code"]
        run.summary["failed_criteria"] = ",".join(result["failed_criteria"])
        run.summary["n_runs"] = result["n_runs"]
        for c in result["criteria"]:
            run.summary[f"criteria/{c['name']}"] = c["status"]
        log = {f"tables/{k}": _table(v) for k, v in result["_tables"].items() if v is not None and not v.empty}
        log.update({f"plots/{k}": wandb.Image(str(p)) for k, p in result["_plots"].items()})
        run.log(log)
        run.save(str(report_dir / "verdict.json"), base_path=str(report_dir), policy="now")
        artifact = wandb.Artifact(
            f"signoff-{target['group'] or 'sweep'}",
            type="signoff",
            metadata={"verdict": result["verdict"], "judged_runs": judged, "group": target["group"]},
        )
        for path in signoff_files(sweep, report_dir) if sweep is not None else []:
            name = path.name if path.parent == Path(report_dir) else f"certificates/{path.parent.name}/{path.name}"
            artifact.add_file(str(path), name=name)
        run.log_artifact(artifact)
        where = run.url or run.dir
        record = {"run_id": run.id, "url": run.url, "artifact": artifact.name, "judged_runs": judged}
        (Path(report_dir) / WANDB_RUN_FILE).write_text(json.dumps(record, indent=1) + "\n")
    finally:
        run.finish()
        # wandb-core may return from finish() before its writer has flushed the offline run file; shutting the
        # service down waits for it, so the files are complete when gkd-analyze exits (seen: 1 run in 3 empty).
        wandb.teardown()
    return where
