"""Every invalid config input fails before any model loads, with an error naming the key.

Each value is given the way a user gives it (a Hydra override, composed for real by ``gkd_harness.harness.launcher.compose``); a wrong
type fails at compose time (the schema), a value out of range at ``validate_config``. Either way the error is a
:class:`ConfigError` whose message names the full key.
"""

import json

import pytest

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.validate import validate_config
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.run import train
from tests.launch.helpers import with_value


def base_cfg(*overrides, run_dir="/tmp/unused"):
    return point_config(list(overrides), run_dir=run_dir)[0]


def model_dir(tmp_path, name, vocab):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab}))
    return str(d)


def config_error(*overrides) -> ConfigError:
    """The ConfigError of composing ``overrides`` and validating the result (compose- or validation-time)."""
    with pytest.raises(ConfigError) as err:
        validate_config(base_cfg(*overrides))
    return err.value


def test_default_config_is_valid():
    validate_config(base_cfg())
    validate_config(
        base_cfg(
            "loss=original",
            "gkd.topk=8",
            "gkd.beta=0",
            "backend=megatron",
            "model.student_dtype=null",
            "model.teacher_dtype=null",
        )
    )


@pytest.mark.parametrize(
    "key,value",
    [
        ("loss.precision", "fp16"),
        ("loss.beta_form", "swapped"),
        ("gkd.beta", "-0.1"),
        ("gkd.beta", "1.5"),
        ("gkd.beta", "half"),
        ("gkd.beta", "nan"),
        ("gkd.temperature", "0"),
        ("gkd.temperature", "-1.0"),
        ("gkd.temperature", "null"),
        ("gkd.topk", "0"),
        ("gkd.topk", "513"),
        ("gkd.topk", "2.5"),
        ("gkd.sft_alpha", "-1.0"),
        ("gkd.seq_kd", "true"),
        ("gkd.lmbda", "0.5"),
        ("gkd.lmbda", "2.0"),
        ("model.student_dtype", "fp8"),
        ("model.teacher_dtype", "half"),
        ("model.torch_dtype", "int8"),
        ("model.student", "/nonexistent/student"),
        ("model.teacher", "./no/such/teacher"),
        ("model.embedded.num_kv_heads", "3"),
        ("model.embedded.vocab_size", "100"),
        ("model.embedded.teacher_noise", "-1.0"),
        ("model.embedded.teacher", "oracle"),
        ("backend.name", "deepspeed"),
        ("backend.nproc_per_node", "0"),
        ("run.max_steps", "0"),
        ("run.seed", "x"),
        ("run.grad_accum", "0"),
        ("run.per_device_batch_size", "0"),
        ("run.learning_rate", "-1.0"),
        ("run.device", "tpu"),
        ("run.save_steps", "0"),
        # booleans: OmegaConf's own coercion accepts true/false, yes/no, on/off and integers; words else are refused
        ("run.resume", "maybe"),
        ("monitor.enabled", "often"),
        ("monitor.spot_check.every_n_steps", "-1"),
        ("monitor.spot_check.max_tokens", "0"),
        ("monitor.spot_check.param_grad", "often"),
        ("monitor.capture", "sometimes"),
        ("monitor.capture_max_tokens", "0"),
        ("monitor.capture_max_tokens", "all"),
        ("tracking.wandb.mode", "cloud"),
        ("tracking.wandb.tags", "'a,b'"),
        ("rollout.engine", "sglang"),
    ],
)
def test_invalid_value_names_its_key(key, value):
    err = config_error(f"{key}={value}")
    assert err.key == key and str(err).startswith(f"{key}: "), str(err)
    assert "\n" not in str(err)  # one line


def test_empty_output_dir_names_its_key():
    """An empty run folder is not expressible as an override (the job then sees Hydra's folder): typed copy."""
    with pytest.raises(ConfigError, match=r"^run\.output_dir: "):
        validate_config(with_value(base_cfg(), "run.output_dir", ""))


@pytest.mark.parametrize("key", ["monitor.capture", "monitor.spot_check.param_grad"])
def test_capture_and_param_grad_need_spot_checks(key):
    for extra in ("monitor.spot_check.every_n_steps=0", "monitor=off"):
        with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.")):
            validate_config(base_cfg(extra, f"{key}=true"))


def test_unknown_embedded_setting_names_its_key():
    with pytest.raises(ConfigError, match=r"model\.embedded\.width"):
        base_cfg("+model.embedded.width=3")


@pytest.mark.parametrize("key", ["model.student", "model.teacher"])
def test_folder_without_config_json(tmp_path, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ".*config.json"):
        validate_config(base_cfg(f"run.dataset={tmp_path}", f"{key}={tmp_path}"))


def test_vocab_mismatch_needs_explicit_alignment(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    models = [
        f"model.student={model_dir(tmp_path, 's', 1000)}",
        f"model.teacher={model_dir(tmp_path, 't', 1024)}",
        f"run.dataset={data}",
    ]
    with pytest.raises(ConfigError, match=r"model\.teacher: vocab size 1024 differs .* 1000"):
        validate_config(base_cfg(*models))
    validate_config(base_cfg(*models, "model.vocab_alignment=true"))
    with pytest.raises(ConfigError, match=r"gkd\.topk"):  # larger than the smaller vocabulary
        validate_config(base_cfg(*models, "model.vocab_alignment=true", "gkd.topk=1001"))


def test_real_models_need_a_dataset(tmp_path):
    with pytest.raises(ConfigError, match=r"run\.dataset"):
        validate_config(
            base_cfg(f"model.student={model_dir(tmp_path, 's', 10)}", f"model.teacher={model_dir(tmp_path, 't', 10)}")
        )


def test_boundary_cast_on_megatron_needs_explicit_consent():
    with pytest.raises(ConfigError, match=r"^model\.student_dtype: a boundary cast on the Megatron backend"):
        validate_config(base_cfg("backend=megatron", "model.student_dtype=bfloat16"))
    validate_config(base_cfg("backend=megatron", "model.student_dtype=bfloat16", "model.megatron_boundary_cast=true"))


def test_train_rejects_before_creating_anything(tmp_path, monkeypatch):
    """train() raises on a bad value without building models or starting ms-swift."""
    import gkd_harness.harness.launcher.run as tr

    monkeypatch.setattr(tr, "resolve_inputs", lambda *a, **k: pytest.fail("models prepared before validation"))
    cfg = base_cfg("gkd.temperature=-2", run_dir=tmp_path / "run")
    assert cfg.run.output_dir == str(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"gkd\.temperature"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_hub_id_must_be_cached_when_offline_except_in_a_dry_run(monkeypatch):
    """With HF_HUB_OFFLINE set, a hub id that is not in the Hugging Face cache cannot be fetched: refused naming the
    key before anything starts; a dry run only names it and is accepted."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = ["model.student=example-org/not-cached-student", "run.dataset=x/y"]
    with pytest.raises(ConfigError, match=r"^model\.student: 'example-org/not-cached-student' is not a local folder"):
        validate_config(base_cfg(*hub))
    validate_config(base_cfg(*hub, "run.dry_run=true"))
