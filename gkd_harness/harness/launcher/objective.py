"""What a ``gkd-train`` job returns to Hydra: the value of ``run.optimized_metric`` (issue 47, item 5).

Hydra's sweeper plugins (Optuna, Nevergrad, Ax) optimise the float each job returns, as in lightning-hydra-template's
``optimized_metric``. ``run.optimized_metric: null`` (the default) returns nothing: the basic grid sweeper needs no
value. A name from the contract's metrics (``eval/jsd``, ``train/loss``, ...) returns the last finite value of that
metric in the run's ``metrics.jsonl``; a completed run that never logged it fails the point, naming the key.
A dry run trains nothing and returns NaN: a sweeper records the trial as failed, never as a score.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.contract import ALL_METRICS, ROLLOUT_METRICS
from gkd_harness.harness.store.metrics_io import read_metrics
from gkd_harness.harness.store.records import metrics_path

KEY = "run.optimized_metric"
#: the metrics a job can return: every per-step metric the run folder's metrics.jsonl carries
OPTIMIZABLE = ALL_METRICS + ROLLOUT_METRICS


def check_optimized_metric(name: Optional[str]) -> None:
    """Refuse an unknown metric name at start-up, before any model loads.

    Raises:
        ConfigError: naming ``run.optimized_metric``.
    """
    if name is not None and name not in OPTIMIZABLE:
        raise ConfigError(KEY, f"unknown metric {name!r}; one of {', '.join(OPTIMIZABLE)} (or null)")


def optimized_value(name: Optional[str], run_dir: Path, dry_run: bool = False) -> Optional[float]:
    """The job's return value: None without a metric, NaN for a dry run, else the metric's last finite value.

    Raises:
        ConfigError: naming ``run.optimized_metric`` when the run's metrics never hold a finite value of it.
    """
    if name is None:
        return None
    if dry_run:
        return math.nan
    values = [row[name] for row in read_metrics(metrics_path(run_dir)) if isinstance(row.get(name), (int, float))]
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        raise ConfigError(KEY, f"{name!r} has no finite value in {metrics_path(run_dir)}")
    return finite[-1]
