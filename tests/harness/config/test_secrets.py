"""Config trees (one flatten, secrets), metric records, the wandb env mapping, run identity and the fallback."""
import dataclasses
import json
import re
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from harness.config.secrets import REDACTED, find_secret_keys, is_secret_key, redact, redact_name, redact_text, secret_env_var, secret_overrides, secret_refusal, secret_values
from harness.rank.wandb_run import design_record
from harness.config.flat import flatten
from harness.launcher.wandb_env import resolve_wandb_mode, run_tags, wandb_env, wandb_run_id

REPO = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------------------------------ config trees
def test_flatten_keeps_lists_and_empty_mappings_and_reads_dataclasses():
    @dataclasses.dataclass
    class Loss:
        precision: str = "fp32"
        extra: dict = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass
    class Cfg:
        loss: Loss = dataclasses.field(default_factory=Loss)
        tags: list = dataclasses.field(default_factory=lambda: ["a"])

    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": {},
                                                                               "f": None}
    assert flatten(Cfg()) == {"loss.precision": "fp32", "loss.extra": {}, "tags": ["a"]}
    assert flatten({}) == {}


def test_redact_secrets_but_not_token_counts():
    cfg = {"tracking": {"wandb": {"api_key": "abc123", "project": "p"}}, "hub_token": "hf_x", "WANDB_API_KEY": "k",
           "monitor": {"spot_check": {"max_tokens": 256}}, "password": "pw", "secret": None}
    out = redact(cfg)
    assert out["tracking"]["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert out["hub_token"] == REDACTED and out["WANDB_API_KEY"] == REDACTED and out["password"] == REDACTED
    assert out["monitor"]["spot_check"]["max_tokens"] == 256
    assert "abc123" not in json.dumps(out) and "hf_x" not in json.dumps(out)
    assert redact({"tracking.wandb.api_key": "abc", "gkd.beta": 0.5}) == {"tracking.wandb.api_key": REDACTED,
                                                                          "gkd.beta": 0.5}


def test_find_secret_keys_at_any_depth_with_the_env_var_to_use():
    tree = {"tracking": {"wandb": {"api_key": "k1", "project": "p"}},
            "model": {"hub_token": "hf_1", "max_tokens": 5, "token_budget": 3},
            "run": {"extra_args": [{"password": "pw"}], "secret": None, "db_secret": ""},
            "modelscope_token": "m"}
    assert find_secret_keys(tree) == ["tracking.wandb.api_key", "model.hub_token", "run.extra_args.0.password",
                                      "modelscope_token"]
    assert secret_values(tree) == ["hf_1", "k1", "pw", "m"]
    assert secret_env_var("tracking.wandb.api_key") == "WANDB_API_KEY"
    assert secret_env_var("+tracking.wandb.api_key") == "WANDB_API_KEY"
    assert secret_env_var("model.hub_token") == "HF_TOKEN"
    assert secret_env_var("modelscope_token") == "MODELSCOPE_API_TOKEN"
    msg = secret_refusal("tracking.wandb.api_key")
    assert "WANDB_API_KEY" in msg and "\n" not in msg
    assert is_secret_key("WANDB_API_KEY") and is_secret_key("token") and not is_secret_key("max_tokens")


def test_secret_overrides_on_the_command_line():
    argv = ["-m", "+tracking.wandb.api_key=abc", "++model.hub_token='hf_x'", "gkd.beta=0.5,0.9",
            "monitor.spot_check.max_tokens=8", "tracking.wandb.api_key=null", "~run.password", "--multirun"]
    assert secret_overrides(argv) == ["tracking.wandb.api_key", "model.hub_token"]


def test_redact_text_covers_overrides_yaml_lines_and_values():
    text = textwrap.dedent("""\
        - +tracking.wandb.api_key=abcd1234
        - gkd.beta=0.5
        override_dirname: +tracking.wandb.api_key=abcd1234,gkd.beta=0.5
        output_dir: /o/+tracking.wandb.api_key=abcd1234,gkd.beta=0.5
        wandb:
          api_key: abcd1234
          secret: null
          max_tokens: 7
          key_hint: abcd1234 in prose
        """)
    out = redact_text(text, ["abcd1234"])
    assert "abcd1234" not in out
    assert "- gkd.beta=0.5" in out and "max_tokens: 7" in out and "secret: null" in out
    assert f"api_key: {REDACTED}" in out and f"+tracking.wandb.api_key={REDACTED},gkd.beta=0.5" in out
    assert redact_name("+tracking.wandb.api_key=abcd1234,gkd.beta=0.5") == \
        "+tracking.wandb.api_key=REDACTED,gkd.beta=0.5"
    assert redact_name("gkd.beta=0.5,loss=fp32") == "gkd.beta=0.5,loss=fp32"


def test_design_record_maps_hf_keys():
    logs = {"loss": "0.25", "grad_norm": 1.5, "learning_rate": 1e-4, "epoch": 0.1, "gkd/neg_loss_calls": 2.0,
            "spot/grad_rel_l2": 1e-6, "global_step/max_steps": "1/3", "memory(GiB)": 1.0}
    rec = design_record(logs, 7)
    assert rec == {"train/loss": 0.25, "train/grad_norm": 1.5, "train/learning_rate": 1e-4,
                   "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 1e-6, "step": 7}
    assert design_record({"epoch": 1.0}, 3) is None


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
    env = wandb_env({"project": "p", "entity": "e", "group": "g", "tags": ["a", "b"], "api_key": "x"}, "offline",
                    tmp_path, "run-1")
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_ENTITY"] == "e" and env["WANDB_RUN_GROUP"] == "g"
    assert env["WANDB_TAGS"] == "g,a,b" and env["WANDB_NAME"] == "run-1" and env["WANDB_MODE"] == "offline"
    assert env["WANDB_DIR"] == str(tmp_path / "wandb") and env["WANDB_JOB_TYPE"] == "gkd-train"
    assert "WANDB_API_KEY" not in env and "secret-key-123" not in json.dumps(env)
    named = wandb_env({}, "offline", tmp_path, "+tracking.wandb.api_key=abcd1234,gkd.beta=0.5")
    assert "abcd1234" not in json.dumps(named)


def test_run_identity_tags_group_job_type_and_a_stable_id(tmp_path, monkeypatch):
    env = wandb_env({"group": "smoke", "tags": ["mine", "fp32"]}, "offline", tmp_path / "run", "loss=fp32",
                    precision="fp32", beta_form="continuous", experiment="smoke")
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
    env = wandb_env({"project": "p", "group": "smoke"}, "offline", run_dir, "loss=fp32", precision="fp32",
                    beta_form="paper", experiment="smoke")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out = subprocess.run([sys.executable, "-c", WANDB_SCRIPT], env={**clean, **env}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    assert first["id"] == second["id"] == env["WANDB_RUN_ID"] == wandb_run_id(run_dir)
    for attempt in (first, second):
        assert attempt["group"] == "smoke" and attempt["job_type"] == "gkd-train" and attempt["name"] == "loss=fp32"
        assert attempt["tags"] == ["patched", "fp32", "paper", "smoke"]
        assert Path(attempt["dir"]).resolve().is_relative_to((run_dir / "wandb").resolve())
    offline = sorted(p.name for p in (run_dir / "wandb" / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<id>; wandb appends -1 when both attempts start within the same second
    assert len(offline) == 2 and all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{env['WANDB_RUN_ID']}(-\d+)?", name)
                                     for name in offline), offline
