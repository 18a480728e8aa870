"""Where ms-swift's trainers call ``gkd_loss``, and the train-begin check that the active one holds the harness's
loss (so a call site that failed to import when the plugin loaded never trains on upstream's loss unnoticed)."""

from __future__ import annotations

import sys

from gkd_harness.harness.rank import state

#: Modules that did ``from swift.rlhf_trainers.gkd_loss import gkd_loss``.
TRAINER_MODULES = (
    "swift.rlhf_trainers.gkd_trainer",
    "swift.megatron.trainers.gkd_trainer",
    "swift.ray.megatron.loss.gkd",
)
#: The call site each backend trains through (``backend.name`` -> module of :data:`TRAINER_MODULES`).
ACTIVE_CALL_SITE = {"hf": TRAINER_MODULES[0], "megatron": TRAINER_MODULES[1]}


class LossNotInstalledError(RuntimeError):
    """The active backend's ``gkd_loss`` call site does not hold the configured loss (its module did not import
    when the plugin loaded, or something rebound it since): training would run upstream's loss."""


def check_rebound(st=None) -> str:
    """At train begin: the active backend's call site (:data:`ACTIVE_CALL_SITE`) holds the installed loss;
    returns the module's name.

    Raises:
        LossNotInstalledError: naming the module, the configured variant, and why (the import error the plugin
            met, or what the module's ``gkd_loss`` is now).
    """
    st = st or state.STATE
    name = ACTIVE_CALL_SITE[st.config.backend.name]
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "gkd_loss", None) is st.boundary:
        return name
    if st.rebound.get(name, "").startswith("skipped"):
        why = st.rebound[name]
    elif mod is None:
        why = "the module is not imported in this process"
    else:
        found = getattr(mod, "gkd_loss", None)
        why = f"its gkd_loss is {getattr(found, '__module__', '?')}.{getattr(found, '__qualname__', found)!s}"
    raise LossNotInstalledError(
        f"loss.precision={st.config.loss.precision} is not installed in {name}, which backend="
        f"{st.config.backend.name} trains through ({why}): training would use ms-swift's own gkd_loss; stopping"
    )
