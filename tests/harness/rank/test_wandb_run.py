"""gkd_harness.harness.rank.wandb_run: the harness's records of ms-swift's logs."""

from __future__ import annotations

from gkd_harness.harness.rank.wandb_run import design_record


def test_design_record_maps_hf_keys():
    logs = {
        "loss": "0.25",
        "grad_norm": 1.5,
        "learning_rate": 1e-4,
        "epoch": 0.1,
        "gkd/neg_loss_calls": 2.0,
        "spot/grad_rel_l2": 1e-6,
        "global_step/max_steps": "1/3",
        "memory(GiB)": 1.0,
    }
    rec = design_record(logs, 7)
    assert rec == {
        "train/loss": 0.25,
        "train/grad_norm": 1.5,
        "train/learning_rate": 1e-4,
        "gkd/neg_loss_calls": 2.0,
        "spot/grad_rel_l2": 1e-6,
        "step": 7,
    }
    assert design_record({"epoch": 1.0}, 3) is None


def test_the_harness_config_is_logged_nested_and_read_back_flat(tmp_path, monkeypatch):
    """Issue 24: the harness config was logged as flat dotted keys (``harness.gkd.beta``), which wandb-workspaces
    cannot address on a panel axis through its own load-and-save. It is logged nested under ``harness`` now, the
    late-known dtypes merged into it, and the analysis readers (the offline file reader, ``runs_from_wandb``)
    read it back as the dotted keys they read before. Real wandb, offline."""
    import wandb

    from gkd_harness.analysis.sweep.offline import OfflineRun, find_offline_runs
    from gkd_harness.analysis.sweep.wandb_api import runs_from_wandb
    from gkd_harness.harness.config.flat import flatten
    from gkd_harness.harness.config.schema import to_dict
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.rank.wandb_run import attach_to_wandb_run, update_wandb_config

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg, _ = point_config(["gkd.beta=0.7", "loss=fp32"], run_dir=tmp_path / "run")
    wandb.init(dir=str(tmp_path), mode="offline", project="t", group="g", config={"beta": 0.5})
    try:
        assert attach_to_wandb_run({**to_dict(cfg), "experiment": "smoke"})
        update_wandb_config({"dtypes_seen": {"student": "float32", "teacher": "bfloat16"}})
        wandb.log({"train/loss": 1.0, "train/global_step": 1})
    finally:
        wandb.finish()
    (path,) = find_offline_runs(tmp_path)
    run = OfflineRun(path)
    assert not any(k.startswith("harness.") for k in run.config)
    tree = run.config["harness"]
    assert tree["gkd"]["beta"] == 0.7 and tree["loss"]["precision"] == "fp32" and tree["experiment"] == "smoke"
    assert tree["dtypes_seen"] == {"student": "float32", "teacher": "bfloat16"} and "provenance" in tree
    flat = flatten(run.config)
    assert flat["harness.gkd.beta"] == 0.7 and flat["beta"] == 0.5  # ms-swift's own config keys stay as they are
    (record,) = runs_from_wandb([run])
    # the run folder's flat keys (issue 45: under the "harness." prefix every key outside the shown columns, e.g.
    # monitor.eval.every_n_steps, came back None); ms-swift's own keys stay as they are
    assert record.config["loss.precision"] == "fp32" and record.config["gkd.beta"] == 0.7
    assert (
        record.config["monitor.eval.every_n_steps"] == cfg.monitor.eval.every_n_steps and record.config["beta"] == 0.5
    )
    assert not any(k.startswith("harness.") for k in record.config)
