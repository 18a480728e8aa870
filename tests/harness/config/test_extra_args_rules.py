"""``run.extra_args`` at validation (issue 24, item 2): a flag the harness sets is refused naming the key to use
(``--beta 0.9`` used to reach ms-swift after the harness's ``--beta 0.5`` while wandb recorded 0.5), and a
credential-looking flag or value is refused (``--hub_token hf_...`` used to reach 15 files). Before the fix each of
these validated."""

from __future__ import annotations

import pytest

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.validate import validate_config
from tests.harness.config.test_validate import base_cfg


def _error(extra: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(base_cfg(f"run.extra_args={extra}"))
    return str(err.value)


@pytest.mark.parametrize(
    "extra,key",
    [
        ("[--beta,0.9]", "gkd.beta"),
        ("['--temperature=2']", "gkd.temperature"),
        ("[--max-steps,9]", "run.max_steps"),
        ("[--deepspeed,zero3]", "backend.deepspeed"),
        ("[--lora_rank,8,--seed,3]", "run.seed"),
        ("[--vllm_gpu_memory_utilization,0.5]", "rollout.*"),
    ],
)
def test_a_flag_the_harness_sets_names_the_key_to_use(extra, key):
    msg = _error(extra)
    assert msg.startswith("run.extra_args: ") and f"use the config key {key} instead" in msg


def test_a_flag_only_the_harness_may_set_is_refused():
    assert "set by the harness and cannot be overridden" in _error("[--external_plugins,x.py]")


@pytest.mark.parametrize(
    "extra",
    ["[--hub_token,abc]", "['--hub-token=abc']", "[--push_to_hub_token,x]", "[--hub_model_id,hf_abcdefghijklmnop]"],
)
def test_credential_looking_flags_and_values_are_refused(extra):
    msg = _error(extra)
    assert "looks like a credential" in msg and "abcdefghijklmnop" not in msg


def test_the_list_starts_with_a_flag():
    assert "must start with an ms-swift flag" in _error("[lora]")


def test_free_flags_pass_validation():
    validate_config(base_cfg("run.extra_args=[--tuner_type,lora,--lora_rank,8,--attn_impl,sdpa]"))


@pytest.mark.parametrize(
    "extra,flag",
    [
        ("[--use_liger_kernel,true]", "use_liger_kernel"),
        ("[--use_liger_kernel]", "use_liger_kernel"),
        ("['--use-liger-kernel=True']", "use_liger_kernel"),
        ("[--lora_rank,8,--use_liger_kernel,1]", "use_liger_kernel"),
        ("[--use_ray,true]", "use_ray"),
    ],
)
def test_a_flag_that_routes_the_loss_past_gkd_loss_is_refused(extra, flag):
    """Issue 41, item 5: ms-swift's HF GKD trainer with --use_liger_kernel trains on Liger's fused JSD and never
    calls gkd_loss, so the run "completed" with no gkd/* or spot/* metrics; Megatron's --use_ray runs the loss in
    Ray actors nobody checked. Before the fix both validated."""
    msg = _error(extra)
    assert msg.startswith(f"run.extra_args: --{flag} ") and msg.endswith("; drop the flag") and "\n" not in msg


def test_a_loss_bypass_flag_switched_off_passes():
    validate_config(base_cfg("run.extra_args=[--use_liger_kernel,false]"))


def test_gkd_train_refuses_liger_in_one_line_with_exit_2(tmp_path):
    """The issue's command, as typed: one line, exit 2, before any model loads, no run folder."""
    import os
    import subprocess

    from tests.conftest import entry_point

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GKD_OUTPUT_ROOT": str(tmp_path / "out")}
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n')
    argv = [
        entry_point("gkd-train"),
        "experiment=seed_hf",
        f"run.dataset={data}",
        "gkd.topk=null",
        "run.extra_args=[--use_liger_kernel,true]",
        "run.device=cuda",
        "run.dry_run=true",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "gkd-train: invalid config: run.extra_args: --use_liger_kernel routes ms-swift's GKD loss to Liger's fused JSD"
    ), lines
    assert not list((tmp_path / "out").rglob("*"))
