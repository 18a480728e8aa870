"""The metric names: the one module that owns them (instrumentation, tracking, analysis, dashboards and tests
import them from here). The same keys are used on the HF and Megatron backends, in wandb and in metrics.jsonl.
"""
from __future__ import annotations

# training (ms-swift's own values under the harness's names)
TRAIN_LOSS = "train/loss"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_LEARNING_RATE = "train/learning_rate"
TRAIN_METRICS = (TRAIN_LOSS, TRAIN_GRAD_NORM, TRAIN_LEARNING_RATE)
#: ms-swift / transformers log keys -> harness names
HF_KEY_MAP = {"loss": TRAIN_LOSS, "grad_norm": TRAIN_GRAD_NORM, "learning_rate": TRAIN_LEARNING_RATE}

# per logging window, from the instrumented loss
JSD_LOSS = "gkd/jsd_loss"
SFT_LOSS = "gkd/sft_loss"
NEG_LOSS_CALLS = "gkd/neg_loss_calls"
NEG_TOKEN_FRAC = "gkd/neg_token_frac"
MIN_TOKEN_JSD = "gkd/min_token_jsd"
WINDOW_METRICS = (JSD_LOSS, SFT_LOSS, NEG_LOSS_CALLS, NEG_TOKEN_FRAC, MIN_TOKEN_JSD)

# cumulative over the run (a resumed run continues them)
NEG_LOSS_CALLS_TOTAL = "gkd/neg_loss_calls_total"
LOSS_CALLS_TOTAL = "gkd/loss_calls_total"
NONFINITE_CALLS_TOTAL = "gkd/nonfinite_calls_total"
CUMULATIVE_METRICS = (NEG_LOSS_CALLS_TOTAL, LOSS_CALLS_TOTAL, NONFINITE_CALLS_TOTAL)

# FP64 spot checks
SPOT_LOSS = "spot/loss"
SPOT_LOSS_FP64 = "spot/loss_fp64"
SPOT_LOSS_ABS_ERR = "spot/loss_abs_err"
SPOT_LOSS_REL_ERR = "spot/loss_rel_err"
SPOT_GRAD_REL_L2 = "spot/grad_rel_l2"
SPOT_SIGN_MISMATCH = "spot/sign_mismatch"
SPOT_METRICS = (SPOT_LOSS, SPOT_LOSS_FP64, SPOT_LOSS_ABS_ERR, SPOT_LOSS_REL_ERR, SPOT_GRAD_REL_L2, SPOT_SIGN_MISMATCH)
SPOT_PARAM_GRAD_REL_L2 = "spot/param_grad_rel_l2"

#: prefixes of the harness's own metrics (kept under these names in wandb on both backends)
HARNESS_PREFIXES = ("gkd/", "spot/", "rollout/")
#: wandb summary aggregation per metric
WANDB_SUMMARIES = {
    NEG_LOSS_CALLS_TOTAL: "max", NONFINITE_CALLS_TOTAL: "max", LOSS_CALLS_TOTAL: "max", NEG_LOSS_CALLS: "max",
    NEG_TOKEN_FRAC: "max", MIN_TOKEN_JSD: "min", SPOT_LOSS_ABS_ERR: "max", SPOT_LOSS_REL_ERR: "max",
    SPOT_GRAD_REL_L2: "max", SPOT_SIGN_MISMATCH: "max", SPOT_PARAM_GRAD_REL_L2: "max",
}
ALL_METRICS = TRAIN_METRICS + WINDOW_METRICS + CUMULATIVE_METRICS + SPOT_METRICS + (SPOT_PARAM_GRAD_REL_L2,)
