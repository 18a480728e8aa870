"""Config trees (one flatten, secrets), metric records, the wandb env mapping, run identity and the fallback."""

import json
import textwrap
from pathlib import Path

import pytest

from gkd_harness.harness.config.secrets import (
    REDACTED,
    find_secret_keys,
    is_secret_key,
    redact,
    redact_name,
    redact_text,
    secret_env_var,
    secret_overrides,
    secret_refusal,
    secret_values,
)

REPO = Path(__file__).resolve().parents[3]


def test_redact_secrets_but_not_token_counts():
    cfg = {
        "tracking": {"wandb": {"api_key": "abc123", "project": "p"}},
        "hub_token": "hf_x",
        "WANDB_API_KEY": "k",
        "monitor": {"spot_check": {"max_tokens": 256}},
        "password": "pw",
        "secret": None,
    }
    out = redact(cfg)
    assert out["tracking"]["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert out["hub_token"] == REDACTED and out["WANDB_API_KEY"] == REDACTED and out["password"] == REDACTED
    assert out["monitor"]["spot_check"]["max_tokens"] == 256
    assert "abc123" not in json.dumps(out) and "hf_x" not in json.dumps(out)
    assert redact({"tracking.wandb.api_key": "abc", "gkd.beta": 0.5}) == {
        "tracking.wandb.api_key": REDACTED,
        "gkd.beta": 0.5,
    }


def test_find_secret_keys_at_any_depth_with_the_env_var_to_use():
    tree = {
        "tracking": {"wandb": {"api_key": "k1", "project": "p"}},
        "model": {"hub_token": "hf_1", "max_tokens": 5, "token_budget": 3},
        "run": {"extra_args": [{"password": "pw"}], "secret": None, "db_secret": ""},
        "modelscope_token": "m",
    }
    assert find_secret_keys(tree) == [
        "tracking.wandb.api_key",
        "model.hub_token",
        "run.extra_args.0.password",
        "modelscope_token",
    ]
    assert secret_values(tree) == ["hf_1", "k1", "pw", "m"]
    assert secret_env_var("tracking.wandb.api_key") == "WANDB_API_KEY"
    assert secret_env_var("+tracking.wandb.api_key") == "WANDB_API_KEY"
    assert secret_env_var("model.hub_token") == "HF_TOKEN"
    assert secret_env_var("modelscope_token") == "MODELSCOPE_API_TOKEN"
    msg = secret_refusal("tracking.wandb.api_key")
    assert "WANDB_API_KEY" in msg and "\n" not in msg
    assert is_secret_key("WANDB_API_KEY") and is_secret_key("token") and not is_secret_key("max_tokens")


def test_secret_overrides_on_the_command_line():
    argv = [
        "-m",
        "+tracking.wandb.api_key=abc",
        "++model.hub_token='hf_x'",
        "gkd.beta=0.5,0.9",
        "monitor.spot_check.max_tokens=8",
        "tracking.wandb.api_key=null",
        "~run.password",
        "--multirun",
    ]
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
    assert (
        redact_name("+tracking.wandb.api_key=abcd1234,gkd.beta=0.5") == "+tracking.wandb.api_key=REDACTED,gkd.beta=0.5"
    )
    assert redact_name("gkd.beta=0.5,loss=fp32") == "gkd.beta=0.5,loss=fp32"


# ------------------------------------------------------------------------------------------------ issue 32, item 2
TOKEN = "hf_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3h"  # the shape of a Hugging Face token (hf_ + 34 alphanumerics)


def test_a_credential_looking_value_is_a_secret_under_any_key():
    """Before the fix only the key counted: `run.dataset=hf_...` was accepted and written unredacted into 11 files."""
    from gkd_harness.harness.config.secrets import looks_like_credential

    tree = {
        "run": {"dataset": TOKEN, "extra_args": ["--lr", f"--hub_model_id={TOKEN}", TOKEN], "name": "hf_dataset_name"},
        "model": {"template": f"data/{TOKEN}.jsonl"},
    }
    assert find_secret_keys(tree) == ["run.dataset", "run.extra_args", "model.template"]
    assert TOKEN in secret_values(tree) and f"data/{TOKEN}.jsonl" in secret_values(tree)
    assert TOKEN not in json.dumps(redact(tree)) and redact(tree)["run"]["name"] == "hf_dataset_name"
    assert (
        redact_text(f"- run.dataset={TOKEN}\n  dataset: {TOKEN}\n#0 : run.extra_args=[--hub_token,{TOKEN}]")
        == f"- run.dataset={REDACTED}\n  dataset: {REDACTED}\n#0 : run.extra_args=[--hub_token,{REDACTED}]"
    )
    for value in (TOKEN, "sk-" + "a1" * 12, "wandb_v1_abc"):
        assert looks_like_credential(value), value
    for value in ("hf_dataset_name", "hf_x", "qwen3", "/data/train.jsonl", "max_tokens", "0123abc"):
        assert not looks_like_credential(value), value
    # 40 hex digits: a wandb key as a flag's value, but a git commit in summary.json's provenance is kept
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert looks_like_credential(commit, hex40=True) and not looks_like_credential(commit)
    assert redact({"provenance": {"harness_commit": commit}}) == {"provenance": {"harness_commit": commit}}
    msg = secret_refusal("run.dataset")
    assert "looks like a credential" in msg and "HF_TOKEN" in msg and "\n" not in msg


def test_credential_flags_and_values_inside_overrides_are_refused_before_hydra():
    """Before the fix `run.extra_args=[--hub_token,hf_...]` passed the pre-Hydra check (validation refused it
    later), so the token reached multirun.yaml twice and Hydra's launch line."""
    argv = [
        "-m",
        f"run.extra_args=[--hub_token,{TOKEN}]",
        "run.extra_args=[--hub-token=abc]",
        f"run.dataset={TOKEN}",
        "run.extra_args=[--max_tokens,8]",
        "gkd.beta=0.5",
        "run.dataset=hf_dataset_name",
    ]
    assert secret_overrides(argv) == ["run.extra_args", "run.extra_args", "run.dataset"]


# ------------------------------------------------------------------------------------------------ issue 40, items 1-2
#: credentials by form (the shapes only: random letters, no real credential)
BY_FORM = {
    "url_password": "https://user:" + "Pa55word" + "@data.example.com/train.jsonl",
    "github_classic": "ghp_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6",
    "github_oauth": "gho_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6",
    "github_fine_grained": "github_pat_" + "11AB3DE6G0" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6",
    "gitlab": "glpat-" + "Ab3dE6gH9jK2mN5pQ8sT",
    "aws_key_id": "AKIA" + "IOSFODNN7EXAMPLE",
    "aws_session_key_id": "ASIA" + "IOSFODNN7EXAMPLE",
    "slack_bot": "xoxb-" + "123456789012-abcdefABCDEF",
    "slack_user": "xoxp-" + "123456789012-abcdefABCDEF",
    "google": "AIza" + "SyAb3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3",
    "npm": "npm_" + "Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6",
    "jwt": "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}
#: look-alikes that are not credentials
NOT_CREDENTIALS = (
    "git@github.com:org/repo.git",
    "https://huggingface.co/datasets/x@main",
    "s3://bucket/data/train.jsonl",
    "https://user:@host/x",
    "ghp_short",
    "AKIA_dataset",
    "xoxb",
    "/data/github_pat_notes.txt",
)


@pytest.mark.parametrize("name", sorted(BY_FORM))
def test_credentials_are_recognised_by_form_under_any_key(name):
    """Before the fix only ``hf_``, ``sk-`` and wandb keys were recognised by form: a URL password, a GitHub token
    in a dataset path or an AWS key id as a tag were accepted and written into up to 11 files."""
    from gkd_harness.harness.config.secrets import looks_like_credential

    value = BY_FORM[name]
    assert looks_like_credential(value) and looks_like_credential(f"data/{value}/train.jsonl")
    tree = {"run": {"dataset": f"{value}"}, "tracking": {"wandb": {"tags": ["smoke", value]}}}
    assert find_secret_keys(tree) == ["run.dataset", "tracking.wandb.tags"]
    assert secret_overrides([f"run.dataset={value}", f"tracking.wandb.tags=[smoke,{value}]"]) == [
        "run.dataset",
        "tracking.wandb.tags",
    ]
    secret = value.split("//")[1].split("@")[0] if name == "url_password" else value
    for text in (
        redact_text(f"run.dataset={value}\n  dataset: {value}\n#0 : tags=[{value}]"),
        json.dumps(redact(tree)),
        redact_name(f"gkd.beta=0.5,run.dataset={value}"),
    ):
        assert secret not in text, text


def test_a_url_password_is_redacted_keeping_the_rest_of_the_url():
    url = BY_FORM["url_password"]
    assert redact_text(f"dataset: {url}") == f"dataset: https://{REDACTED}@data.example.com/train.jsonl"
    assert redact_name(url) == "https://REDACTED@data.example.com/train.jsonl"


@pytest.mark.parametrize("value", NOT_CREDENTIALS)
def test_look_alikes_are_not_credentials(value):
    from gkd_harness.harness.config.secrets import looks_like_credential

    assert not looks_like_credential(value)
    assert redact_text(value) == value and find_secret_keys({"run": {"dataset": value}}) == []
