"""What a ``gkd-train`` job hands back to Hydra, and the exit codes: shared by the entry point
(:mod:`gkd_harness.harness.launcher.cli`) and the sweep callback (``gkd_harness.launch.sweep``), which never
imports the entry point."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EXIT_FAILED", "EXIT_CONFIG", "PointFailed"]

#: gkd-train's exit codes: 1 the run failed, 2 a config or input error
EXIT_FAILED, EXIT_CONFIG = 1, 2


@dataclass(frozen=True)
class PointFailed:
    """What a sweep point's job returns when it failed: Hydra then goes on with the other points, and the sweep
    callback records the failure and makes the sweep exit 1, without a traceback per point."""

    code: int
    error: str
    #: the point was refused (its folder is busy or holds another config): the folder is not this job's, so
    #: nothing may be written into it (gkd_harness.launch.sweep reports the refusal on the sweep's console and log instead)
    refused: bool = False
