"""The names the dashboards are built from: metric keys (as logged to wandb and ``metrics.jsonl``) and the
harness config keys the runs carry in wandb.

Metric names come from ``gkd_harness.harness.contract``, the one module that owns them (torch-free, so a dashboard
never imports a training stack); the same keys are used on every backend, in wandb and in ``metrics.jsonl``.

Config keys: the harness logs its config to each wandb run nested under ``harness``
(``gkd_harness.harness.rank.wandb_run.attach_to_wandb_run``): ``loss.precision`` is ``harness.loss.precision`` in wandb's
UI and in wandb-workspaces' ``Config("harness.loss.precision")``, and wandb stores it as
``{"harness": {"value": {"loss": {"precision": "fp32"}}}}``, so its backend path is
``harness.value.loss.precision``: see :func:`config_path`. The analysis readers flatten a run's config to the
dotted ``harness.loss.precision``.
"""

from __future__ import annotations

__all__ = [
    "TRAIN_LOSS",
    "TRAIN_GRAD_NORM",
    "JSD_LOSS",
    "NEG_CALLS",
    "NEG_CALLS_TOTAL",
    "LOSS_CALLS_TOTAL",
    "NEG_TOKEN_FRAC",
    "MIN_TOKEN_JSD",
    "NONFINITE_TOTAL",
    "SPOT_LOSS_FP64",
    "SPOT_ABS_ERR",
    "SPOT_REL_ERR",
    "SPOT_GRAD_REL_L2",
    "SPOT_SIGN_MISMATCH",
    "SPOT_PARAM_GRAD_REL_L2",
    "STEP",
    "EVAL_JSD",
    "EVAL_FORWARD_KL",
    "EVAL_REVERSE_KL",
    "EVAL_TOP1_AGREEMENT",
    "WANDB_CONFIG_PREFIX",
    "PRECISION",
    "BETA_FORM",
    "BETA",
    "EXPERIMENT",
    "GROUPING_KEYS",
    "wandb_config_key",
    "config_path",
]

# --- metric names: owned by gkd_harness.harness.contract (torch-free), re-exported under the dashboard's names -------
from gkd_harness.harness.contract import (  # noqa: E402
    EVAL_FORWARD_KL,
    EVAL_JSD,
    EVAL_REVERSE_KL,
    EVAL_TOP1_AGREEMENT,
    JSD_LOSS,
    LOSS_CALLS_TOTAL,
    MIN_TOKEN_JSD,
    NEG_TOKEN_FRAC,
    SPOT_GRAD_REL_L2,
    SPOT_LOSS_FP64,
    SPOT_PARAM_GRAD_REL_L2,
    SPOT_SIGN_MISMATCH,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
    WANDB_CONFIG_KEY,  # noqa: E402
)
from gkd_harness.harness.contract import NEG_LOSS_CALLS as NEG_CALLS  # noqa: E402
from gkd_harness.harness.contract import NEG_LOSS_CALLS_TOTAL as NEG_CALLS_TOTAL  # noqa: E402
from gkd_harness.harness.contract import NONFINITE_CALLS_TOTAL as NONFINITE_TOTAL  # noqa: E402
from gkd_harness.harness.contract import SPOT_LOSS_ABS_ERR as SPOT_ABS_ERR  # noqa: E402
from gkd_harness.harness.contract import SPOT_LOSS_REL_ERR as SPOT_REL_ERR  # noqa: E402

#: The x-axis of every line plot: the optimizer step (transformers' declared step metric, the report's step),
#: not wandb's ``_step`` log counter (off by one, and the log index once ``logging_steps`` > 1).
from gkd_harness.harness.contract import TRAIN_GLOBAL_STEP as STEP  # noqa: E402

# --- config keys ---------------------------------------------------------------------------------------
#: Prefix of the harness config's keys in a wandb run's config, read flat (``gkd_harness.harness.rank.wandb_run``).
WANDB_CONFIG_PREFIX = WANDB_CONFIG_KEY + "."
PRECISION = "loss.precision"  # native (original) | fp32 | fp64 (patched)
BETA_FORM = "loss.beta_form"  # paper | continuous
BETA = "gkd.beta"
#: The experiment preset's name (``experiment=smoke``), where the runs' config carries it; else the
#: dashboards find the experiment through the runs' tags.
EXPERIMENT = "experiment"
#: Runs are grouped by these, outermost first: one line per variant and β (seeds averaged).
GROUPING_KEYS = (PRECISION, BETA_FORM, BETA)


def wandb_config_key(key: str) -> str:
    """Harness config key -> the key in a wandb run's config: ``"gkd.beta"`` -> ``"harness.gkd.beta"``."""
    return WANDB_CONFIG_PREFIX + key


def config_path(key: str) -> str:
    """Harness config key -> its wandb backend path (``.value`` after the top-level key, as wandb stores a nested
    config): ``"gkd.beta"`` -> ``"harness.value.gkd.beta"``."""
    return f"{WANDB_CONFIG_KEY}.value.{key}"
