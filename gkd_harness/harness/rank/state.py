"""The plugin's process-wide state: one per ms-swift process, set by ``gkd_harness.harness.rank.plugin.install`` and read by
the callbacks and the trainer wrappers (``state.STATE``, never a copy of it)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Optional

from gkd_harness.harness.config.schema import TrainConfig
from gkd_harness.harness.contract import PluginSettings

logger = logging.getLogger("gkd_harness.plugin")
if not logger.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("[gkd-harness] %(message)s"))
    logger.addHandler(_h)
    logger.setLevel(logging.INFO)


def global_rank() -> int:
    """This process's global rank (0 outside torchrun)."""
    return max(int(os.environ.get("RANK", "-1")), 0)


@dataclasses.dataclass
class PluginState:
    """What the plugin installed in this process.

    settings: what ``gkd-train`` sent (parsed once); config: its typed config (parsed once).
    boundary: the installed ``gkd_loss`` (:class:`gkd_harness.harness.rank.boundary.DtypeBoundary`).
    instrument: the :class:`gkd_harness.harness.rank.instrument.LossInstrument`, or None with ``monitor=off``.
    rebound: ``{trainer module: "rebound" | "skipped: ..."}``.
    """

    settings: PluginSettings
    config: TrainConfig
    boundary: Any
    instrument: Any
    rebound: Dict[str, str]
    dtypes_sent: bool = False  # dtypes already added to the wandb run
    begin_step: int = 0  # the trainer's step at train begin (a resumed run's checkpoint step)

    @property
    def fail_on_nonfinite(self) -> bool:
        """Stop at the first non-finite loss call / logged loss / grad_norm (``monitor.fail_on_nonfinite``)."""
        return bool(self.config.monitor.fail_on_nonfinite)


#: Process-wide state of the installed plugin (None until ``install``).
STATE: Optional[PluginState] = None


def current() -> PluginState:
    """:data:`STATE`, installed (what the callbacks and trainer wrappers read once the plugin is in).

    Raises:
        RuntimeError: the plugin is not installed in this process.
    """
    if STATE is None:
        raise RuntimeError("the gkd_harness plugin is not installed in this process (gkd_harness.harness.rank.plugin)")
    return STATE
