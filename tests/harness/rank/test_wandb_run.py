"""harness.rank.wandb_run: the harness's records of ms-swift's logs."""
from __future__ import annotations

from harness.rank.wandb_run import design_record


def test_design_record_maps_hf_keys():
    logs = {"loss": "0.25", "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": 0.1, "gkd/neg_loss_calls": 2.0,
            "spot/grad_rel_l2": 1e-6, "global_step/max_steps": "1/3", "memory(GiB)": 1.0}
    rec = design_record(logs, 7)
    assert rec == {"train/loss": 0.25, "train/grad_norm": 1.5, "train/learning_rate": 1e-4,
                   "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 1e-6, "step": 7}
    assert design_record({"epoch": 1.0}, 3) is None
