"""A multirun's points as Hydra's basic sweeper expands them, and each point's folder name.

Used by the sweep callback and the SLURM dry run (``launch/``) and by the sign-off's loader (``analysis/``), which
lists a sweep's planned points from Hydra's ``multirun.yaml`` when no manifest exists.
"""

from __future__ import annotations

from typing import Iterable

from omegaconf import DictConfig, OmegaConf

__all__ = ["sweep_points", "point_name"]


def sweep_points(config: DictConfig) -> list[list[str]]:
    """The override lists of every point, in launch order, as Hydra's BasicSweeper expands them.

    Args:
        config: the multirun config handed to ``on_multirun_start`` (holds ``hydra.sweeper.params`` and
            ``hydra.overrides.task``).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    lines = [f"{k}={v}" for k, v in params.items()]
    task = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    lines += [str(t) for t in task] if isinstance(task, list) else []
    overrides = OverridesParser.create().parse_overrides(lines)
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def point_name(job_overrides: Iterable[str], config: DictConfig) -> str:
    """The point's folder name: Hydra's ``override_dirname`` (same exclusions and separators as the config), or
    the stand-in Hydra's ``sweep.subdir`` gives an unsafe one (:func:`gkd_harness.harness.config.name_rules.run_folder_name`)."""
    from gkd_harness.harness.config.name_rules import run_folder_name
    from gkd_harness.harness.launcher.compose import override_dirname

    return run_folder_name(override_dirname(job_overrides, config.hydra))
