"""What a dashboard needs to know about a sweep, read from its run folders, its wandb offline files or wandb.

:class:`SweepFacts`: the wandb group, project and entity; the metric keys the runs logged; the config keys and
tags the runs carry in wandb; the experiment name; and the loaded :class:`~gkd_harness.analysis.sweep.records.Sweep` (for the
verdict). Where the sweep folder holds wandb offline files, the wandb side is what a dashboard reads, so its
keys win over ``metrics.jsonl``'s (by contract they are the same names).

Problems raise :class:`~gkd_harness.analysis.sweep.records.UnusableInput` naming the file, folder or key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from gkd_harness.analysis.dashboard import names as n
from gkd_harness.analysis.sweep.records import Sweep, UnusableInput, tabulate
from gkd_harness.harness.config.flat import flatten

__all__ = ["SweepFacts", "facts_from_folder", "facts_from_wandb"]

_NOT_METRICS = {"run", "step"}


@dataclass
class SweepFacts:
    """A sweep as the dashboard sees it.

    metric_keys: history keys logged by at least one run (wandb's own ``_step`` etc. excluded).
    config_keys: keys of the runs' wandb config (``harness.loss.precision``, ...), in every run.
    tags: tags every run carries (empty when unknown). wandb_side: whether the facts come from wandb records.
    """

    source: str
    sweep: Sweep
    group: Optional[str]
    project: str
    entity: Optional[str]
    experiment: Optional[str]
    metric_keys: frozenset
    config_keys: frozenset
    tags: frozenset = frozenset()
    wandb_side: bool = False
    notes: list = field(default_factory=list)

    @property
    def n_runs(self) -> int:
        return len(self.sweep.runs)


def _config(run: Any) -> dict:
    """A wandb run's config with dotted keys: the harness logs its config nested under ``harness``
    (``gkd_harness.harness.rank.wandb_run``), read here as ``harness.gkd.beta``; older runs' flat dotted keys read the same."""
    return flatten(dict(run.config))


def _one(values: Iterable[Any], what: str, where: str, given: Optional[str] = None) -> Optional[str]:
    """The single value of ``values`` (None when none); ``given`` wins; several values are an error."""
    if given:
        return given
    vals = sorted({str(v) for v in values if v not in (None, "") and v == v})
    if len(vals) > 1:
        raise UnusableInput(f"{where}: runs of several {what}s ({', '.join(vals)}); pick one with --{what}")
    return vals[0] if vals else None


def _common(sets: list) -> frozenset:
    return frozenset(set.intersection(*map(set, sets))) if sets else frozenset()


def _history_keys(sweep: Sweep) -> frozenset:
    h = sweep.history
    return frozenset(c for c in h.columns if c not in _NOT_METRICS and h[c].notna().any())


def _wandb_runs(root: Path, group: Optional[str]) -> list:
    """The training runs among the wandb offline files under ``root`` (attempts of one run merged)."""
    from gkd_harness.analysis.sweep.offline import OfflineRun, find_offline_runs, group_attempts

    runs = group_attempts([OfflineRun(f) for f in find_offline_runs(root)])
    runs = [r for r in runs if getattr(r, "job_type", None) != "analysis"]
    if group is not None:
        runs = [r for r in runs if r.group == group]
    return runs


def _target(sweep: Sweep, project: Optional[str], entity: Optional[str]) -> tuple:
    def col(name: str) -> list:
        return list(sweep.runs[name]) if name in sweep.runs.columns else []

    project = (
        project
        or os.environ.get("WANDB_PROJECT")
        or _one(col("tracking.wandb.project"), "project", sweep.source)
        or "gkd-harness"
    )
    entity = entity or os.environ.get("WANDB_ENTITY") or _one(col("tracking.wandb.entity"), "entity", sweep.source)
    return project, entity


def facts_from_folder(
    root: os.PathLike,
    source: str = "local",
    group: Optional[str] = None,
    experiment: Optional[str] = None,
    project: Optional[str] = None,
    entity: Optional[str] = None,
) -> SweepFacts:
    """Facts of the sweep under folder ``root``.

    source ``local``: the run folders (``summary.json``, ``metrics.jsonl``), plus the wandb offline files in
    them where present. source ``wandb-offline``: only the wandb offline files under ``root``.
    """
    from gkd_harness.analysis.sweep.runs import find_run_folders, load_run_folder
    from gkd_harness.analysis.sweep.wandb_api import runs_from_wandb

    root = Path(root)
    if not root.exists():
        raise UnusableInput(f"sweep folder {root} does not exist")
    notes = []
    if source == "local":
        folders = find_run_folders(root)
        records = [load_run_folder(p) for p in folders]
        if group is not None:
            records = [r for r in records if r.group == group]
        if not records:
            raise UnusableInput(f"{root}: no run of group {group!r}")
        sweep = tabulate(records, source=f"local:{root}")
        group = _one(sweep.runs["group"], "group", str(root), group)
        wruns = _wandb_runs(root, group)
        experiment = _one([r.config.get(n.EXPERIMENT) for r in records], "experiment", str(root), experiment) or _one(
            [r.experiment for r in records], "experiment", str(root)
        )  # summary.json's experiment, as gkd-train recorded it
        local_keys = _history_keys(sweep)
        local_config = _common([{n.wandb_config_key(k) for k in r.config} for r in records])
    elif source == "wandb-offline":
        wruns = _wandb_runs(root, group)
        if not wruns:
            raise UnusableInput(
                f"no training runs in the wandb offline files under {root}" + (f" for group {group!r}" if group else "")
            )
        wrecords = runs_from_wandb(wruns)
        sweep = tabulate(wrecords, source=f"wandb-offline:{root}")
        group = _one([r.group for r in wruns], "group", str(root), group)
        experiment = experiment or _one([r.experiment for r in wrecords], "experiment", str(root))
        local_keys, local_config = _history_keys(sweep), frozenset()
    else:
        raise UnusableInput(f"unknown source {source!r} (local | wandb-offline | wandb)")
    project, entity = _target(sweep, project, entity)
    if wruns:
        metric_keys = frozenset(k for r in wruns for row in r.scan_history() for k in row if not k.startswith("_"))
        config_keys = _common([set(_config(r)) for r in wruns])
        tags = _common([set(r.tags or ()) for r in wruns])
        if experiment is None:
            experiment = _one(
                [_config(r).get(n.wandb_config_key(n.EXPERIMENT)) for r in wruns], "experiment", str(root)
            )
    else:
        notes.append(f"no wandb offline files under {root}: metric and config keys taken from the run folders")
        metric_keys, config_keys, tags = local_keys, local_config, frozenset()
    return SweepFacts(
        source=sweep.source,
        sweep=sweep,
        group=group,
        project=project,
        entity=entity,
        experiment=experiment,
        metric_keys=metric_keys,
        config_keys=config_keys,
        tags=tags,
        wandb_side=bool(wruns),
        notes=notes,
    )


def facts_from_wandb(path: str, group: str, experiment: Optional[str] = None, api: Any = None) -> SweepFacts:
    """Facts of the runs of ``group`` in wandb project ``path`` (``ENTITY/PROJECT``), through the public API."""
    from gkd_harness.analysis.sweep.wandb_api import runs_from_wandb

    if path.count("/") != 1:
        raise UnusableInput(f"wandb project {path!r}: expected ENTITY/PROJECT")
    entity, project = path.split("/")
    if api is None:
        import wandb

        api = wandb.Api()
    try:
        runs = [r for r in api.runs(path, filters={"group": group}) if getattr(r, "job_type", None) != "analysis"]
    except Exception as e:  # network, auth, unknown project
        raise UnusableInput(f"wandb {path} group {group!r}: cannot list runs ({e})") from None
    if not runs:
        raise UnusableInput(f"wandb {path} group {group!r}: no runs")
    records = runs_from_wandb(runs)
    sweep = tabulate(records, source=f"wandb:{path}/{group}")
    config_keys = _common([set(_config(r)) for r in runs])
    tags = _common([set(r.tags or ()) for r in runs])
    experiment = experiment or _one(
        [_config(r).get(n.wandb_config_key(n.EXPERIMENT)) for r in runs], "experiment", path
    )
    return SweepFacts(
        source=sweep.source,
        sweep=sweep,
        group=group,
        project=project,
        entity=entity,
        experiment=experiment,
        metric_keys=_history_keys(sweep),
        config_keys=config_keys,
        tags=tags,
        wandb_side=True,
    )
