"""gkd_harness.harness.config.schema: the typed schema of the config tree, through real Hydra composition (``gkd_harness.harness.launcher.compose``).

* A wrong type fails at compose time and the error names the full key; an unknown key is refused.
* The schema holds no default values: every dataclass field defaults to ``MISSING`` (the YAML is their only home).
* ``from_dict(to_dict(cfg))`` gives back the same typed object for every experiment preset (the plugin inside
  ms-swift's ranks receives the config in that form).
* Validating a bad value takes well under 2 s and imports neither torch nor ms-swift.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import MISSING

import gkd_harness.harness.config.schema as config_module
from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.schema import (
    ConfigError,
    HFBackendConfig,
    MegatronBackendConfig,
    TrainConfig,
    VllmColocateRolloutConfig,
    from_dict,
    to_dict,
    to_typed,
)
from gkd_harness.harness.launcher.compose import compose, point_config

REPO = Path(__file__).resolve().parents[3]
EXPERIMENTS = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))
#: presets on real hub models: they need a dataset (the embedded ones bring their own)
NEEDS_DATASET = ("seed", "seed_hf", "precision_ab")


def preset_overrides(experiment: str | None) -> list[str]:
    if experiment is None:
        return []
    return [f"experiment={experiment}", *(["run.dataset=x/y"] if experiment in NEEDS_DATASET else [])]


# ---------------------------------------------------------------------------------------------- types at compose
@pytest.mark.parametrize(
    "overrides,key",
    [
        (["gkd.beta=abc"], "gkd.beta"),
        (["run.seed=x"], "run.seed"),
        (["gkd.topk=2.5"], "gkd.topk"),
        (["run.resume=maybe"], "run.resume"),
        (["model.embedded.hidden_size=wide"], "model.embedded.hidden_size"),
        (["monitor.spot_check.max_tokens=many"], "monitor.spot_check.max_tokens"),
        (["backend=megatron", "backend.tensor_model_parallel_size=two"], "backend.tensor_model_parallel_size"),
        (["rollout=vllm_colocate", "rollout.vllm.gpu_memory_utilization=most"], "rollout.vllm.gpu_memory_utilization"),
        (["tracking.wandb.tags=notalist"], "tracking.wandb.tags"),
    ],
)
def test_wrong_type_fails_at_compose_naming_the_full_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert err.value.key == key, str(err.value)
    assert str(err.value).startswith(f"{key}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override,key", [("gkd.gamma=1", "gkd.gamma"), ("run.stepz=3", "run.stepz"), ("backend.tp=2", "backend.tp")]
)
def test_unknown_key_is_refused_at_compose(override, key):
    with pytest.raises(ConfigError) as err:
        compose([override])
    assert key in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "override,key",
    [
        ("+gkd.gamma=1", "gkd.gamma"),
        ("+run.stepz=3", "run.stepz"),
        ("+backend.tp=2", "backend.tp"),
        ("+newgroup.x=1", "newgroup"),
        ("+model.embedded.width=3", "model.embedded.width"),
    ],
)
def test_appended_unknown_key_is_refused_when_the_job_types_its_config(override, key):
    """Hydra's ``+key=value`` appends past the schema's struct flag; the typed config (what every job builds
    first) refuses the key."""
    with pytest.raises(ConfigError) as err:
        point_config([override], run_dir="/tmp/unused")
    assert err.value.key == key and "unknown key" in str(err.value), str(err.value)


def test_unknown_or_missing_key_is_refused_by_from_dict():
    data = to_dict(point_config([], run_dir="/tmp/unused")[0])
    data["gkd"]["gamma"] = 1.0
    with pytest.raises(ConfigError, match=r"^gkd\.gamma: unknown key"):
        from_dict(data)
    del data["gkd"]["gamma"], data["loss"]["precision"]
    with pytest.raises(ConfigError, match=r"^loss\.precision: missing"):
        from_dict(data)


def test_wrong_type_is_refused_by_from_dict_naming_the_full_key():
    data = to_dict(point_config([], run_dir="/tmp/unused")[0])
    data["monitor"]["spot_check"]["every_n_steps"] = "often"
    with pytest.raises(ConfigError, match=r"^monitor\.spot_check\.every_n_steps: must be an integer"):
        from_dict(data)


# ---------------------------------------------------------------------------------------------- no code defaults
def schema_classes() -> list[type]:
    return [
        obj
        for obj in vars(config_module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == config_module.__name__
    ]


def test_every_schema_field_defaults_to_missing():
    classes = schema_classes()
    assert TrainConfig in classes and len(classes) >= 20
    with_default = [
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if f.default is not MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert with_default == []


# ---------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_from_dict_of_to_dict_round_trips_every_preset(experiment):
    cfg, run_dir = point_config(preset_overrides(experiment), run_dir="/tmp/unused")
    data = to_dict(cfg)
    assert json.loads(json.dumps(data)) == data  # JSON-serialisable, as the plugin settings file holds it
    again = from_dict(json.loads(json.dumps(data)))
    assert again == cfg and type(again.backend) is type(cfg.backend) and type(again.rollout) is type(cfg.rollout)
    assert flatten(again) == flatten(cfg)
    assert to_typed(cfg) is cfg
    if experiment in ("seed", "precision_ab"):
        assert isinstance(cfg.backend, MegatronBackendConfig)
        assert isinstance(cfg.rollout, VllmColocateRolloutConfig)
    if experiment in ("smoke", "beta_sweep", None):
        assert isinstance(cfg.backend, HFBackendConfig)


def test_typed_values_are_the_yaml_values():
    """Spot values of configs/train.yaml and the groups arrive typed (int, float, None, list), not as strings."""
    cfg, run_dir = point_config(["experiment=seed", "run.dataset=x/y"], run_dir="/tmp/unused")
    assert cfg.run.max_steps == 100 and isinstance(cfg.run.max_steps, int)
    assert cfg.gkd.topk == 64 and cfg.gkd.beta == 0.5 and isinstance(cfg.gkd.beta, float)
    assert cfg.backend.nproc_per_node == 8 and cfg.backend.nnodes is None
    assert cfg.run.extra_args == ["--save_total_limit", "2"]  # the seed keeps its newest 2 checkpoints
    assert cfg.rollout.vllm.gpu_memory_utilization == 0.3  # configs/rollout/vllm_colocate.yaml, the one home
    assert cfg.run.output_dir == str(run_dir) == "/tmp/unused"
    assert flatten(cfg)["loss.precision"] == cfg.loss.precision


# ---------------------------------------------------------------------------------------------- fast validation
VALIDATE_BAD_VALUE = """
import sys, time
t0 = time.perf_counter()
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.validate import validate_config
cfg, _ = point_config(["gkd.beta=1.5"], run_dir="/tmp/unused")
try:
    validate_config(cfg)
except ConfigError as e:
    assert e.key == "gkd.beta", e
else:
    raise SystemExit("gkd.beta=1.5 was accepted")
elapsed = time.perf_counter() - t0
heavy = sorted(m for m in ("torch", "swift", "transformers", "megatron") if m in sys.modules)
assert not heavy, heavy
print(elapsed)
"""


def test_validation_of_a_bad_value_imports_neither_torch_nor_swift():
    """Imports, compose and validation together, in a fresh interpreter, name the key without loading torch, ms-swift,
    transformers or megatron (what keeps a config error quick; its time is printed, not asserted)."""
    proc = subprocess.run(
        [sys.executable, "-c", VALIDATE_BAD_VALUE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(f"validation of a bad value in a fresh interpreter: {float(proc.stdout.strip().splitlines()[-1]):.2f} s")


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["backend=megatron", "backend.name=ds"], "backend.name"),
        (["rollout=hf", "gkd.lmbda=1", "rollout.engine=sglang"], "rollout.engine"),
        (["rollout=vllm_colocate", "gkd.lmbda=1", "rollout.vllm.mode=remote"], "rollout.vllm.mode"),
    ],
)
def test_unknown_discriminator_is_named_not_a_key_of_the_fallback_class(overrides, key):
    """backend.name / rollout.engine / rollout.vllm.mode pick the group's dataclass; an unknown value is the error
    (before the fix: ``rollout.log_completions: unknown key``, ``backend.bf16: unknown key``)."""
    with pytest.raises(ConfigError) as err:
        point_config(overrides, run_dir="/tmp/unused")
    assert err.value.key == key and "must be one of" in str(err.value), str(err.value)
