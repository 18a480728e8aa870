"""Panel specs + sweep facts -> a wandb workspace and a sign-off report (``wandb-workspaces`` objects), their
JSON specs, and saving them to a wandb server.

* The runset: the runs of the sweep's wandb group (run attribute ``Group``), with the experiment's tag where
  every run carries it; grouped by ``harness.loss.precision``, ``harness.loss.beta_form``, ``harness.gkd.beta``
  (and the experiment config key where the runs carry one), so each variant and β is one line.
* Line plots are drawn against ``train/global_step`` (the optimizer step), not wandb's ``_step``.
* The harness config is logged nested in wandb (``{"harness": {"gkd": {"beta": ...}}}``,
  ``gkd_harness.harness.rank.wandb_run``), so every config key is addressed through the library's public API as it
  documents nested keys: ``Config("harness.gkd.beta")`` on panel axes, ``expr.Config`` in the workspace's
  grouping, ``"config.harness.gkd.beta"`` in a report's, ``config:harness.value.gkd.beta`` as a column
  (:func:`gkd_harness.analysis.dashboard.names.config_path`). No override of the library: a saved workspace survives its
  load-and-save with every panel and axis (tests/analysis/test_dashboard.py).

Building needs no server except a report runset's project lookup, which happens only when saving
(``with_project=True``); ``--out`` specs leave the runsets on the report's own project.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces import expr

from gkd_harness.analysis.dashboard import names as n
from gkd_harness.analysis.dashboard.facts import SweepFacts
from gkd_harness.analysis.dashboard.panels import PanelSpec, Section

__all__ = ["runset_filters", "grouping", "build_workspace", "build_report", "spec_dict", "verdict_table", "push"]

MAX_RUNS = 100  # runs (or groups) a panel shows; a β sweep has up to ~70 variant x β groups


def _panel(spec: PanelSpec):
    """One :class:`PanelSpec` -> a wandb-workspaces panel."""
    if spec.kind == "line":
        return wr.LinePlot(
            title=spec.title,
            x=n.STEP,
            y=list(spec.metrics),
            custom_expressions=[line.expression for line in spec.lines] or None,
            log_y=spec.log_y,
            max_runs_to_show=MAX_RUNS,
            smoothing_type="none",
            groupby_aggfunc="mean" if spec.bands else None,  # None: the library's default (left out of the spec)
            groupby_rangefunc="minmax" if spec.bands else None,
        )
    if spec.kind == "bar":
        return wr.BarPlot(title=spec.title, metrics=list(spec.metrics), orientation="h", max_runs_to_show=MAX_RUNS)
    if spec.kind == "scatter":
        return wr.ScatterPlot(
            title=spec.title, x=wr.Config(n.wandb_config_key(spec.config[0])), y=wr.SummaryMetric(spec.metrics[0])
        )
    if spec.kind == "parallel":
        cols = [
            wr.ParallelCoordinatesPlotColumn(metric=wr.Config(n.wandb_config_key(k)), display_name=k)
            for k in spec.config
        ]
        cols += [wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(m), display_name=m) for m in spec.metrics]
        return wr.ParallelCoordinatesPlot(title=spec.title, columns=cols)
    raise ValueError(f"panel {spec.title!r}: unknown kind {spec.kind!r}")


# --- runset -----------------------------------------------------------------------------------------------
def _filter(facts: SweepFacts):
    """The runset filter: the expressions of :func:`runset_filters` joined by AND ("" for none)."""
    exprs = [f for _, f in runset_filters(facts)]
    return expr.And(*exprs) if exprs else ""


def runset_filters(facts: SweepFacts) -> list:
    """-> [(description dict, wandb filter expression)]: the sweep's group, and the experiment tag when every
    run carries it."""
    out: list[tuple[dict[str, Any], Any]] = []
    if facts.group:
        out.append(({"key": "Group", "op": "=", "value": facts.group}, expr.Metric("Group") == facts.group))
    if facts.experiment and facts.experiment in facts.tags:
        out.append(({"key": "Tags", "op": "IN", "value": [facts.experiment]}, expr.Tags().isin([facts.experiment])))
    return out


def grouping(facts: SweepFacts) -> list:
    """Harness config keys the runs are grouped by, outermost first: the experiment key where the runs' config
    carries it, then :data:`~gkd_harness.analysis.dashboard.names.GROUPING_KEYS` (those the runs carry)."""
    keys = ([n.EXPERIMENT] if n.wandb_config_key(n.EXPERIMENT) in facts.config_keys else []) + list(n.GROUPING_KEYS)
    return [k for k in keys if n.wandb_config_key(k) in facts.config_keys]


def _columns(keys: Sequence[str]) -> list:
    cols = [f"config:{n.config_path(k)}" for k in keys]
    cols += [f"summary:{m}" for m in (n.NEG_CALLS_TOTAL, n.NONFINITE_TOTAL, n.MIN_TOKEN_JSD, n.TRAIN_LOSS)]
    return cols


# --- workspace --------------------------------------------------------------------------------------------
def build_workspace(sections: Sequence[Section], facts: SweepFacts, name: Optional[str] = None) -> ws.Workspace:
    """The sweep's workspace: one section per :class:`Section`, runs filtered and grouped (:func:`grouping`)."""
    keys = grouping(facts)
    return ws.Workspace(
        entity=facts.entity or "",
        project=facts.project,
        name=name or f"gkd-harness {facts.group or 'sweep'}",
        sections=[ws.Section(name=s.name, panels=[_panel(p) for p in s.panels], is_open=True) for s in sections],
        settings=ws.WorkspaceSettings(x_axis=n.STEP, max_runs=MAX_RUNS, smoothing_type="none"),
        runset_settings=ws.RunsetSettings(
            filters=_filter(facts),
            groupby=[expr.Config(n.wandb_config_key(k)) for k in keys],
            pinned_columns=_columns(keys),
        ),
    )


# --- report -----------------------------------------------------------------------------------------------
def _cell(x: Any) -> str:
    return str(x if x not in (None, "") else "-").replace("|", "\\|").replace("\n", " ")


def verdict_table(verdict: Optional[str], results: Sequence[Any]) -> str:
    """The sign-off verdict as a markdown table (criterion, status, threshold, measured)."""
    if verdict is None:
        return "No verdict: the sign-off criteria could not be evaluated on this sweep."
    rows = [f"**Verdict: {verdict.upper()}**", "", "| criterion | status | threshold | measured |", "|---|---|---|---|"]
    rows += [f"| {_cell(r.name)} | {_cell(r.status)} | {_cell(r.threshold)} | {_cell(r.measured)} |" for r in results]
    return "\n".join(rows)


def _runset(facts: SweepFacts, with_project: bool) -> wr.Runset:
    return wr.Runset(
        entity=(facts.entity or "") if with_project else "",
        project=facts.project if with_project else "",
        name=f"group {facts.group}" if facts.group else "sweep",
        filters=_filter(facts),
        groupby=[f"config.{n.wandb_config_key(k)}" for k in grouping(facts)],
    )


def build_report(
    sections: Sequence[Section],
    facts: SweepFacts,
    verdict: Optional[str],
    results: Sequence[Any],
    with_project: bool = False,
) -> wr.Report:
    """The sign-off report: the verdict table, then each section's panels over the sweep's runs.

    ``with_project``: give the runsets the sweep's entity/project (looked up on the server: only when saving).
    """
    blocks: list[wr.interface.BlockTypes] = [
        wr.P(
            f"wandb group {facts.group or '-'}, experiment {facts.experiment or '-'}, {facts.n_runs} runs "
            f"(source {facts.source}). Runs are grouped by {', '.join(grouping(facts))}."
        ),
        wr.H2("Sign-off verdict"),
        wr.MarkdownBlock(text=verdict_table(verdict, results)),
    ]
    for s in sections:
        blocks += [
            wr.H2(s.name),
            wr.PanelGrid(runsets=[_runset(facts, with_project)], panels=[_panel(p) for p in s.panels]),
        ]
    return wr.Report(
        entity=facts.entity or "",
        project=facts.project,
        title=f"GKD sign-off: {facts.group or 'sweep'}"[:128],
        description="Built by gkd-dashboard from the harness's versioned panel definitions.",
        blocks=blocks,
        width="fluid",
    )


# --- specs and saving -----------------------------------------------------------------------------------
def _dump(model: Any) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def spec_dict(
    workspace: ws.Workspace,
    report: wr.Report,
    sections: Sequence[Section],
    facts: SweepFacts,
    left_out: Sequence[str],
    verdict: Optional[str],
    results: Sequence[Any],
    version: str,
) -> dict:
    """Everything ``--out`` writes: a summary (runset, panels, verdict) and the two wandb specs as the
    wandb-workspaces library sends them to the server."""
    return {
        "tool": {"name": "gkd-dashboard", "version": version},
        "sweep": {
            "source": facts.source,
            "group": facts.group,
            "experiment": facts.experiment,
            "entity": facts.entity,
            "project": facts.project,
            "n_runs": facts.n_runs,
        },
        "runset": {
            "filters": [d for d, _ in runset_filters(facts)],
            "groupby": [n.wandb_config_key(k) for k in grouping(facts)],
        },
        "panels": [
            {
                "section": s.name,
                "kind": p.kind,
                "title": p.title,
                "metrics": list(p.metrics),
                "config": [n.wandb_config_key(k) for k in p.config],
                "lines": [{"label": line.label, "expression": line.expression} for line in p.lines],
            }
            for s in sections
            for p in s.panels
        ],
        "left_out": list(left_out),
        "verdict": {"verdict": verdict, "criteria": [r.to_dict() for r in results]},
        "workspace": _dump(workspace._to_model()),
        "report": _dump(report._to_model()),
    }


def push(workspace: ws.Workspace, report: wr.Report) -> tuple:
    """Save both to the wandb server -> (workspace URL, report URL)."""
    workspace.save()
    report.save()
    return workspace.url, report.url
