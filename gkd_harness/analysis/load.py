"""Load a sweep's runs into tidy pandas tables, from any source (one import for notebooks and scripts).

Sources (same :class:`Sweep` either way):

* local run folders (the default): :func:`load_sweep` (:mod:`gkd_harness.analysis.sweep.runs`);
* wandb, through the public API: :func:`load_wandb_sweep` (:mod:`gkd_harness.analysis.sweep.wandb_api`);
* wandb offline run files: :func:`load_wandb_offline` (:mod:`gkd_harness.analysis.sweep.offline`).

The tables are described in :mod:`gkd_harness.analysis.sweep.records`. Example::

    from gkd_harness.analysis.load import load_sweep
    sw = load_sweep("outputs/multirun/smoke")
    sw.runs[["run", "loss.precision", "gkd.beta", "outcome"]]

This module only re-exports; nothing in ``analysis/`` imports it.
"""

from __future__ import annotations

from gkd_harness.analysis.sweep.offline import (
    MergedRun,
    OfflineRun,
    find_offline_runs,
    group_attempts,
    load_wandb_offline,
)
from gkd_harness.analysis.sweep.records import (
    CONFIG_COLUMNS,
    TRACKING_COLUMNS,
    RunRecord,
    Sweep,
    UnusableInput,
    tabulate,
)
from gkd_harness.analysis.sweep.runs import find_run_folders, load_run_folder, load_sweep
from gkd_harness.analysis.sweep.wandb_api import load_wandb_sweep, runs_from_wandb
from gkd_harness.harness.config.flat import flatten

__all__ = [
    "UnusableInput",
    "Sweep",
    "RunRecord",
    "CONFIG_COLUMNS",
    "TRACKING_COLUMNS",
    "load_sweep",
    "load_run_folder",
    "find_run_folders",
    "load_wandb_sweep",
    "load_wandb_offline",
    "runs_from_wandb",
    "OfflineRun",
    "MergedRun",
    "group_attempts",
    "find_offline_runs",
    "tabulate",
    "flatten",
]
