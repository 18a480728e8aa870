"""Config trees (one flatten, secrets), metric records, the wandb env mapping, run identity and the fallback."""
import json
import textwrap
from pathlib import Path


from harness.config.secrets import REDACTED, find_secret_keys, is_secret_key, redact, redact_name, redact_text, secret_env_var, secret_overrides, secret_refusal, secret_values

REPO = Path(__file__).resolve().parents[3]




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












