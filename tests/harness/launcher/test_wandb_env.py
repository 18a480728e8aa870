"""gkd_harness.harness.launcher.wandb_env: the WANDB_* variables that steer ms-swift's wandb.init, and the online/offline decision."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gkd_harness.harness.launcher.wandb_env import resolve_wandb_mode, run_tags, wandb_env, wandb_run_id


# ------------------------------------------------------------------------------------------------ wandb
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
    env = wandb_env(
        {"project": "p", "entity": "e", "group": "g", "tags": ["a", "b"], "api_key": "x"}, "offline", tmp_path, "run-1"
    )
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_ENTITY"] == "e" and env["WANDB_RUN_GROUP"] == "g"
    assert env["WANDB_TAGS"] == "g,a,b" and env["WANDB_NAME"] == "run-1" and env["WANDB_MODE"] == "offline"
    assert env["WANDB_DIR"] == str(tmp_path / "wandb") and env["WANDB_JOB_TYPE"] == "gkd-train"
    assert "WANDB_API_KEY" not in env and "secret-key-123" not in json.dumps(env)
    named = wandb_env({}, "offline", tmp_path, "+tracking.wandb.api_key=abcd1234,gkd.beta=0.5")
    assert "abcd1234" not in json.dumps(named)


def test_run_identity_tags_group_job_type_and_a_stable_id(tmp_path, monkeypatch):
    env = wandb_env(
        {"group": "smoke", "tags": ["mine", "fp32"]},
        "offline",
        tmp_path / "run",
        "loss=fp32",
        precision="fp32",
        beta_form="continuous",
        experiment="smoke",
    )
    assert env["WANDB_TAGS"].split(",") == ["patched", "fp32", "continuous", "smoke", "mine"]
    assert env["WANDB_RUN_GROUP"] == "smoke" and env["WANDB_JOB_TYPE"] == "gkd-train"
    assert env["WANDB_RESUME"] == "allow" and env["WANDB_RUN_ID"] == wandb_run_id(tmp_path / "run")
    assert run_tags("native", "paper", None, "default") == ["original", "native", "paper", "default"]
    assert run_tags(None, None) == [] and run_tags("fp64", "paper", "a,b") == ["reference", "fp64", "paper", "a;b"]
    # one id per folder, whatever the spelling of its path; the config fingerprint (overwrite) gives a new one
    monkeypatch.chdir(tmp_path)
    rid = wandb_run_id(tmp_path / "run")
    assert wandb_run_id("run") == rid == wandb_run_id(tmp_path / "x" / ".." / "run")
    assert len(rid) == 16 and all(c in "0123456789abcdef" for c in rid)
    assert wandb_run_id(tmp_path / "other") != rid
    assert wandb_run_id(tmp_path / "run", "f" * 64) != rid == wandb_run_id(tmp_path / "run", None)


WANDB_SCRIPT = """
import json, os, sys
import wandb
ids = []
for attempt in range(2):
    run = wandb.init(config={"attempt": attempt})
    ids.append({"id": run.id, "group": run.group, "job_type": run.job_type, "tags": list(run.tags),
                "name": run.name, "dir": run.dir})
    run.log({"train/loss": 1.0 / (attempt + 1)})
    run.finish()
print(json.dumps(ids))
"""


def test_a_retry_continues_the_same_wandb_run_offline(tmp_path):
    """Issue 12 item 8 / issue 15: a retried point became a second wandb run; with the env of wandb_env, two
    real ``wandb.init`` calls (offline, same folder) get the same run id, group, job type and tags."""
    run_dir = tmp_path / "run"
    (run_dir / "wandb").mkdir(parents=True)
    env = wandb_env(
        {"project": "p", "group": "smoke"},
        "offline",
        run_dir,
        "loss=fp32",
        precision="fp32",
        beta_form="paper",
        experiment="smoke",
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out = subprocess.run(
        [sys.executable, "-c", WANDB_SCRIPT],
        env={**clean, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    assert first["id"] == second["id"] == env["WANDB_RUN_ID"] == wandb_run_id(run_dir)
    for attempt in (first, second):
        assert attempt["group"] == "smoke" and attempt["job_type"] == "gkd-train" and attempt["name"] == "loss=fp32"
        assert attempt["tags"] == ["patched", "fp32", "paper", "smoke"]
        assert Path(attempt["dir"]).resolve().is_relative_to((run_dir / "wandb").resolve())
    offline = sorted(p.name for p in (run_dir / "wandb" / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<id>; wandb appends -1 when both attempts start within the same second
    assert len(offline) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{env['WANDB_RUN_ID']}(-\d+)?", name) for name in offline
    ), offline
