"""The names the dashboards are built from: metric keys (as logged to wandb and ``metrics.jsonl``) and the
harness config keys the runs carry in wandb.

Metric names are the DESIGN names ("Metric names": the same keys on every backend, in wandb and in
``metrics.jsonl``). They are spelled here rather than imported because the modules that log them
(``harness.instrument`` imports torch and ms-swift, 14 s; ``harness.tracking`` maps HF's ``loss`` to
``train/loss``) do not export one table of them; a dashboard must not import a training stack.

Config keys: the harness adds its flattened config to each wandb run under the prefix ``harness.``
(``harness.tracking.attach_to_wandb_run``): ``loss.precision`` is ``harness.loss.precision`` in wandb. wandb
keeps such a dotted key flat (``{"harness.loss.precision": {"value": "fp32"}}``), so its backend path is
``harness.loss.precision.value``: see :func:`config_path`.
"""
from __future__ import annotations

__all__ = [
    "TRAIN_LOSS", "TRAIN_GRAD_NORM", "JSD_LOSS", "NEG_CALLS", "NEG_CALLS_TOTAL", "LOSS_CALLS_TOTAL",
    "NEG_TOKEN_FRAC", "MIN_TOKEN_JSD", "NONFINITE_TOTAL", "SPOT_LOSS_FP64", "SPOT_ABS_ERR", "SPOT_REL_ERR",
    "SPOT_GRAD_REL_L2", "SPOT_SIGN_MISMATCH", "SPOT_PARAM_GRAD_REL_L2",
    "WANDB_CONFIG_PREFIX", "PRECISION", "BETA_FORM", "BETA", "EXPERIMENT", "GROUPING_KEYS",
    "wandb_config_key", "config_path",
]

# --- metric names (DESIGN "Metric names") --------------------------------------------------------------
TRAIN_LOSS = "train/loss"
TRAIN_GRAD_NORM = "train/grad_norm"
JSD_LOSS = "gkd/jsd_loss"
NEG_CALLS = "gkd/neg_loss_calls"                 # loss calls with JSD < 0 in the logging window, all ranks
NEG_CALLS_TOTAL = "gkd/neg_loss_calls_total"     # cumulative
LOSS_CALLS_TOTAL = "gkd/loss_calls_total"
NEG_TOKEN_FRAC = "gkd/neg_token_frac"            # share of positions with per-position JSD < 0
MIN_TOKEN_JSD = "gkd/min_token_jsd"
NONFINITE_TOTAL = "gkd/nonfinite_calls_total"
SPOT_LOSS_FP64 = "spot/loss_fp64"
SPOT_ABS_ERR = "spot/loss_abs_err"
SPOT_REL_ERR = "spot/loss_rel_err"
SPOT_GRAD_REL_L2 = "spot/grad_rel_l2"
SPOT_SIGN_MISMATCH = "spot/sign_mismatch"
SPOT_PARAM_GRAD_REL_L2 = "spot/param_grad_rel_l2"  # only with monitor.spot_check.param_grad=true

# --- config keys ---------------------------------------------------------------------------------------
#: Prefix of the harness config in a wandb run's config (``harness.tracking.attach_to_wandb_run``).
WANDB_CONFIG_PREFIX = "harness."
PRECISION = "loss.precision"      # native (original) | fp32 | fp64 (patched)
BETA_FORM = "loss.beta_form"      # paper | continuous
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
    """Harness config key -> its wandb backend path (flat key plus ``.value``):
    ``"gkd.beta"`` -> ``"harness.gkd.beta.value"``."""
    return wandb_config_key(key) + ".value"
