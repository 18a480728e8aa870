"""Every invalid config input fails before any model loads, with an error naming the key."""
import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from harness.train import CONFIG_DIR, train
from harness.validate import ConfigError, validate_config


def base_cfg(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=["run.output_dir=/tmp/unused", *overrides])


def model_dir(tmp_path, name, vocab):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": vocab}))
    return str(d)


def test_default_config_is_valid():
    validate_config(base_cfg())
    validate_config(base_cfg("loss=original", "gkd.topk=8", "gkd.beta=0", "backend=megatron"))


@pytest.mark.parametrize("key,value", [
    ("loss.precision", "fp16"), ("loss.beta_form", "swapped"),
    ("gkd.beta", -0.1), ("gkd.beta", 1.5), ("gkd.beta", "half"), ("gkd.beta", float("nan")),
    ("gkd.temperature", 0), ("gkd.temperature", -1.0), ("gkd.temperature", None),
    ("gkd.topk", 0), ("gkd.topk", 513), ("gkd.topk", 2.5),
    ("gkd.sft_alpha", -1.0), ("gkd.seq_kd", True), ("gkd.lmbda", 0.5), ("gkd.lmbda", 2.0),
    ("model.student_dtype", "fp8"), ("model.teacher_dtype", "half"), ("model.torch_dtype", "int8"),
    ("model.student", "/nonexistent/student"), ("model.teacher", "./no/such/teacher"),
    ("model.embedded.num_kv_heads", 3), ("model.embedded.vocab_size", 100), ("model.embedded.teacher_noise", -1.0),
    ("backend.name", "deepspeed"), ("backend.nproc_per_node", 0),
    ("run.max_steps", 0), ("run.seed", "x"), ("run.grad_accum", 0), ("run.per_device_batch_size", 0),
    ("run.learning_rate", -1.0), ("run.device", "tpu"), ("run.output_dir", ""), ("run.save_steps", 0),
    ("run.resume", "yes"),
    ("monitor.enabled", "yes"), ("monitor.spot_check.every_n_steps", -1), ("monitor.spot_check.max_tokens", 0),
    ("monitor.spot_check.param_grad", 1), ("monitor.capture", "sometimes"),
    ("tracking.wandb.mode", "cloud"), ("tracking.wandb.tags", "a,b"),
    ("rollout.engine", "sglang"),
])
def test_invalid_value_names_its_key(key, value):
    cfg = base_cfg()
    OmegaConf.update(cfg, key, value, force_add=True)
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    assert key in str(err.value)


@pytest.mark.parametrize("key", ["monitor.capture", "monitor.spot_check.param_grad"])
def test_capture_and_param_grad_need_spot_checks(key):
    for extra in (["monitor.spot_check.every_n_steps=0"], ["monitor=off"]):
        cfg = base_cfg(*extra)
        OmegaConf.update(cfg, key, True)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate_config(cfg)


def test_unknown_embedded_setting_names_its_key():
    cfg = base_cfg()
    with open_dict(cfg):
        cfg.model.embedded.width = 3
    with pytest.raises(ValueError, match=r"model\.embedded\.width"):
        validate_config(cfg)


@pytest.mark.parametrize("key", ["model.student", "model.teacher"])
def test_folder_without_config_json(tmp_path, key):
    cfg = base_cfg("run.dataset=" + str(tmp_path))
    OmegaConf.update(cfg, key, str(tmp_path))
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ".*config.json"):
        validate_config(cfg)


def test_vocab_mismatch_needs_explicit_alignment(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    cfg = base_cfg(f"model.student={model_dir(tmp_path, 's', 1000)}", f"model.teacher={model_dir(tmp_path, 't', 1024)}",
                   f"run.dataset={data}")
    with pytest.raises(ConfigError, match=r"model\.teacher: vocab size 1024 differs .* 1000"):
        validate_config(cfg)
    OmegaConf.update(cfg, "model.vocab_alignment", True)
    validate_config(cfg)
    OmegaConf.update(cfg, "gkd.topk", 1001)  # larger than the smaller vocabulary
    with pytest.raises(ConfigError, match=r"gkd\.topk"):
        validate_config(cfg)


def test_real_models_need_a_dataset(tmp_path):
    cfg = base_cfg(f"model.student={model_dir(tmp_path, 's', 10)}", f"model.teacher={model_dir(tmp_path, 't', 10)}")
    with pytest.raises(ConfigError, match=r"run\.dataset"):
        validate_config(cfg)


def test_train_rejects_before_creating_anything(tmp_path, monkeypatch):
    """train() raises on a bad value without building models or starting ms-swift."""
    import harness.train as tr

    monkeypatch.setattr(tr, "resolve_inputs", lambda cfg: pytest.fail("models prepared before validation"))
    cfg = base_cfg("gkd.temperature=-2")
    OmegaConf.update(cfg, "run.output_dir", str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"gkd\.temperature"):
        train(cfg)
    assert not (tmp_path / "run").exists()
