"""Log a sign-off to wandb: one analysis run (``job_type="analysis"``) in the sweep's group, carrying the
verdict (summary), the tables (``wandb.Table``) and the plots (``wandb.Image``)."""

from __future__ import annotations

import os
from typing import Optional

import pandas as pd

__all__ = ["log_analysis_run", "wandb_target"]


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


def log_analysis_run(result: dict, target: dict, report_dir) -> str:
    """Create the analysis run and log ``result`` (the dict from :func:`gkd_harness.analysis.signoff.report.build_report`).

    Returns the run's local directory (offline mode) or URL.
    """
    import wandb

    run = wandb.init(
        project=target["project"],
        entity=target["entity"],
        group=target["group"],
        job_type="analysis",
        name=f"signoff-{target['group'] or 'sweep'}",
        mode=target["mode"],
        dir=os.environ.get("WANDB_DIR") or str(report_dir),
        config={"criteria": result["criteria_config"], "sweep": result["sweep"]},
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
        where = run.url or run.dir
    finally:
        run.finish()
        # wandb-core may return from finish() before its writer has flushed the offline run file; shutting the
        # service down waits for it, so the files are complete when gkd-analyze exits (seen: 1 run in 3 empty).
        wandb.teardown()
    return where
