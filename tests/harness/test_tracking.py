"""Run folder, metrics stream, summary lifecycle, wandb env mapping and the online->offline fallback."""
import json
import warnings

import pytest

from harness.tracking import (REDACTED, MetricsWriter, RunFolder, design_record, flatten, read_metrics, redact,
                              resolve_wandb_mode, wandb_env)


def test_redact_secrets_but_not_token_counts():
    cfg = {"tracking": {"wandb": {"api_key": "abc123", "project": "p"}}, "hub_token": "hf_x", "WANDB_API_KEY": "k",
           "monitor": {"spot_check": {"max_tokens": 256}}, "password": "pw", "secret": None}
    out = redact(cfg)
    assert out["tracking"]["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert out["hub_token"] == REDACTED and out["WANDB_API_KEY"] == REDACTED and out["password"] == REDACTED
    assert out["monitor"]["spot_check"]["max_tokens"] == 256
    assert "abc123" not in json.dumps(out) and "hf_x" not in json.dumps(out)


def test_summary_lifecycle(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    flat = flatten({"loss": {"precision": "fp32"}, "gkd": {"beta": 0.5}, "tracking": {"api_key": "zzz"}})
    s = folder.start_summary("r", "g", flat)
    assert s["status"] == "running" and s["config"]["loss.precision"] == "fp32"
    assert s["config"]["tracking.api_key"] == REDACTED
    assert set(s["versions"]) >= {"ms-swift", "torch", "transformers"}
    writer = MetricsWriter(folder.metrics_path)
    writer.write({"train/loss": 1.0, "step": 1})
    writer.write({"train/loss": 0.5, "step": 2})
    folder.update_summary(dtypes_seen={"student": "float32"})
    folder.update_summary(dtypes_seen={"teacher": "bfloat16"})
    done = folder.finish_summary("failed", "boom")
    assert done["status"] == "failed" and done["error"] == "boom" and done["last_step"] == 2
    assert done["dtypes_seen"] == {"student": "float32", "teacher": "bfloat16"}
    assert done["wall_s"] is not None and done["ended_at"]
    assert not folder.is_completed()
    folder.finish_summary("completed")
    assert folder.is_completed()
    assert "zzz" not in folder.summary_path.read_text()


def test_metrics_stream_is_line_per_step_and_survives_a_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"step": 1, "gkd/neg_loss_calls": 0.0})
    with open(path, "a") as f:
        f.write('{"step": 2, "gkd/neg')  # what a SIGKILL mid-write could leave
    assert read_metrics(path) == [{"step": 1, "gkd/neg_loss_calls": 0.0}]


def test_design_record_maps_hf_keys():
    logs = {"loss": "0.25", "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": 0.1, "gkd/neg_loss_calls": 2.0,
            "spot/grad_rel_l2": 1e-6, "global_step/max_steps": "1/3", "memory(GiB)": 1.0}
    rec = design_record(logs, 7)
    assert rec == {"train/loss": 0.25, "train/grad_norm": 1.5, "train/learning_rate": 1e-4,
                   "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 1e-6, "step": 7}
    assert design_record({"epoch": 1.0}, 3) is None


def test_online_falls_back_to_offline_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_wandb_mode("online", reachable=lambda: False) == "offline"
    assert len(caught) == 1 and "offline" in str(caught[0].message)
    assert resolve_wandb_mode("online", reachable=lambda: True) == "online"
    assert resolve_wandb_mode("disabled", reachable=lambda: False) == "disabled"
    with pytest.raises(ValueError, match="tracking.wandb.mode"):
        resolve_wandb_mode("sometimes")


def test_wandb_env_mapping_never_carries_a_key(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-123")
    env = wandb_env({"project": "p", "entity": "e", "group": "g", "tags": ["a", "b"], "api_key": "x"}, "offline",
                    tmp_path, "run-1")
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_ENTITY"] == "e" and env["WANDB_RUN_GROUP"] == "g"
    assert env["WANDB_TAGS"] == "a,b" and env["WANDB_NAME"] == "run-1" and env["WANDB_MODE"] == "offline"
    assert env["WANDB_DIR"] == str(tmp_path / "wandb") and env["WANDB_JOB_TYPE"] == "gkd-train"
    assert "WANDB_API_KEY" not in env and "secret-key-123" not in json.dumps(env)


def test_unfinished_attempt_is_archived(tmp_path):
    folder = RunFolder(tmp_path / "run").create()
    folder.start_summary("r", None, {})
    MetricsWriter(folder.metrics_path).write({"step": 1})
    archived = folder.archive_previous_attempt()
    assert archived == tmp_path / "run" / "previous_attempts" / "1"
    assert (archived / "metrics.jsonl").is_file() and (archived / "summary.json").is_file()
    assert not folder.metrics_path.exists() and folder.read_summary() is None
    assert folder.archive_previous_attempt() is None  # nothing left to move


def test_truncate_metrics_for_a_resumed_run(tmp_path):
    folder = RunFolder(tmp_path).create()
    for step in (1, 2, 3, 4):
        MetricsWriter(folder.metrics_path).write({"step": step, "gkd/loss_calls_total": float(step)})
    assert folder.truncate_metrics(2) == 2
    assert [r["step"] for r in read_metrics(folder.metrics_path)] == [1, 2]
