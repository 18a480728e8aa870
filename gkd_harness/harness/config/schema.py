"""The typed schema of the harness config: one dataclass per Hydra config group.

The YAML files under ``configs/`` are the only home of default values; these dataclasses give the types and the
structure. :func:`register_schemas` puts them into Hydra's ConfigStore, and every group file names its schema in
its defaults list (``- hf_schema``), so a wrong type or an unknown key fails at compose time with the full key.

:func:`to_typed` turns the composed ``DictConfig`` into one :class:`TrainConfig` object, once, at start-up; after
that, code reads attributes (``cfg.loss.precision``), never dotted strings. :func:`from_dict` rebuilds the same
object from its JSON form (``dataclasses.asdict``), which is what the plugin inside ms-swift's ranks receives.

This module imports neither torch nor ms-swift: a bad value must fail in well under two seconds.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional

from omegaconf import MISSING

from gkd_harness.harness.contract import CANDIDATE, PRECISIONS

# loss.precision, loss.beta_form and the dtype names are the contract's (PRECISIONS, BETA_FORMS, DTYPE_NAMES); the
# fields stay `str` here because OmegaConf's structured configs take no Literal types (validate checks the values)
BACKENDS = ("hf", "megatron")
DEVICES = ("auto", "cpu", "cuda")
WANDB_MODES = ("online", "offline", "disabled")
ROLLOUT_ENGINES = ("none", "hf", "vllm")
VLLM_MODES = ("colocate", "server")
#: ``model.student`` / ``model.teacher`` value that selects the tiny model built locally (gkd_harness.harness.fixtures.embedded).
EMBEDDED = "embedded"


#: the longest message a :class:`ConfigError` shows (a 5,000-character value is not echoed whole)
MAX_ERROR_CHARS = 480


class ConfigError(ValueError):
    """An invalid config value; ``key`` is the dotted config key (or file) at fault. The message is console-safe
    (:func:`gkd_harness.harness.config.text.console_safe`: no terminal escape, control or bidi character of a user's value
    reaches the console raw) and at most :data:`MAX_ERROR_CHARS` characters."""

    def __init__(self, key: str, message: str):
        from gkd_harness.harness.config.text import console_safe

        self.key = key
        super().__init__(
            f"{console_safe(key, limit=200)}: {console_safe(message, limit=MAX_ERROR_CHARS, multiline=True)}"
        )


# ----------------------------------------------------------------------------------------------------- groups
@dataclass
class LossConfig:
    precision: str = MISSING
    beta_form: str = MISSING
    source: Optional[str] = MISSING  # loss.precision=candidate: PATH.py or package.module[:attr]
    name: Optional[str] = MISSING  # the candidate's label (null: the file or module name)

    def __post_init__(self) -> None:
        # source and name are the candidate's keys: a sweep `loss=original,candidate loss.source=F loss.name=N` sets
        # them on every point, and another loss never carries them (its config, fingerprint and folder stay those
        # of the same point in any other sweep; gkd_harness.harness.config.candidate_rules)
        if self.precision in PRECISIONS and self.precision != CANDIDATE:
            self.source = self.name = None


@dataclass
class GKDConfig:
    beta: float = MISSING
    temperature: float = MISSING
    topk: Optional[int] = MISSING
    sft_alpha: float = MISSING
    lmbda: float = MISSING
    seq_kd: bool = MISSING


@dataclass
class EmbeddedConfig:
    """The tiny locally built Qwen3-architecture student/teacher (``model.student=embedded``)."""

    vocab_size: int = MISSING
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    head_dim: int = MISSING
    intermediate_size: int = MISSING
    init_std: float = MISSING
    teacher_noise: float = MISSING
    seed: int = MISSING
    num_samples: int = MISSING
    tokenizer: str = MISSING  # bytes (local BPE) | qwen3 | qwen35 (real Qwen vocabulary, gkd_harness.harness.fixtures.qwen_tokenizer)
    teacher: str = MISSING  # near_copy | trained (gkd_harness.harness.fixtures.distill)
    teacher_steps: int = MISSING
    teacher_lr: float = MISSING
    teacher_corpus: int = MISSING
    student_start: str = MISSING  # random | near_teacher (with teacher: trained; gkd_harness.harness.fixtures.distill)
    student_noise: float = MISSING  # with student_start: near_teacher, relative weight noise on the teacher's copy


@dataclass
class ModelConfig:
    student: str = MISSING
    teacher: str = MISSING
    student_dtype: Optional[str] = MISSING
    teacher_dtype: Optional[str] = MISSING
    torch_dtype: Optional[str] = MISSING
    model_type: Optional[str] = MISSING
    teacher_model_type: Optional[str] = MISSING
    template: Optional[str] = MISSING
    vocab_alignment: bool = MISSING
    megatron_boundary_cast: bool = MISSING
    embedded: Optional[EmbeddedConfig] = MISSING


@dataclass
class BackendConfig:
    """Keys both backends share: the process layout (null = derive from the node, see gkd_harness.harness.launcher.node)."""

    name: str = MISSING
    nproc_per_node: Optional[int] = MISSING
    nnodes: Optional[int] = MISSING
    node_rank: Optional[int] = MISSING
    master_addr: Optional[str] = MISSING
    master_port: Optional[int] = MISSING


@dataclass
class HFBackendConfig(BackendConfig):
    deepspeed: Optional[str] = MISSING
    gradient_checkpointing: bool = MISSING


@dataclass
class MegatronBackendConfig(BackendConfig):
    tensor_model_parallel_size: int = MISSING
    pipeline_model_parallel_size: int = MISSING
    context_parallel_size: int = MISSING
    sequence_parallel: bool = MISSING
    micro_batch_size: int = MISSING
    global_batch_size: Optional[int] = MISSING
    bf16: bool = MISSING
    recompute_granularity: Optional[str] = MISSING


@dataclass
class RolloutConfig:
    """``rollout=none``: off-policy GKD (dataset responses only)."""

    engine: str = MISSING


@dataclass
class OnPolicyRolloutConfig(RolloutConfig):
    """``rollout=hf``: on-policy with the student's own HF generate."""

    max_completion_length: Optional[int] = MISSING
    temperature: Optional[float] = MISSING
    log_completions: bool = MISSING


@dataclass
class VllmColocateConfig:
    mode: str = MISSING
    device: str = MISSING
    gpu_memory_utilization: float = MISSING
    tensor_parallel_size: int = MISSING
    enforce_eager: bool = MISSING
    sleep_level: int = MISSING
    offload_model: bool = MISSING
    offload_optimizer: bool = MISSING
    cpu_kvcache_space_gb: int = MISSING


@dataclass
class VllmServerAddress:
    base_url: Optional[Any] = MISSING  # a URL or a list of URLs
    host: Optional[Any] = MISSING  # a host or a list of hosts
    port: Optional[Any] = MISSING  # a port or one per host
    timeout: Optional[float] = MISSING


@dataclass
class VllmServerConfig:
    mode: str = MISSING
    device: str = MISSING
    tensor_parallel_size: int = MISSING
    server: VllmServerAddress = MISSING


@dataclass
class VllmColocateRolloutConfig(OnPolicyRolloutConfig):
    max_model_len: Optional[int] = MISSING
    vllm: VllmColocateConfig = MISSING


@dataclass
class VllmServerRolloutConfig(OnPolicyRolloutConfig):
    max_model_len: Optional[int] = MISSING
    vllm: VllmServerConfig = MISSING


@dataclass
class WandbConfig:
    mode: str = MISSING
    project: str = MISSING
    entity: Optional[str] = MISSING
    group: str = MISSING
    tags: List[str] = MISSING


@dataclass
class TrackingConfig:
    wandb: WandbConfig = MISSING


@dataclass
class SpotCheckConfig:
    every_n_steps: int = MISSING
    max_tokens: int = MISSING
    param_grad: bool = MISSING


@dataclass
class EvalConfig:
    """The held-out evaluation (gkd_harness.harness.rank.evaluation): every N steps and at the end; 0 = off."""

    every_n_steps: int = MISSING
    dataset: Optional[str] = MISSING  # the held-out file (null: the embedded dataset's validation split)
    embedded_samples: int = MISSING  # rows of the embedded validation split
    batch_size: int = MISSING  # per-device eval batch size


@dataclass
class MonitorConfig:
    enabled: bool = MISSING
    spot_check: SpotCheckConfig = MISSING
    capture: bool = MISSING
    capture_max_tokens: int = MISSING  # rows kept per capture (gkd_harness.harness.store.captures)
    fail_on_nonfinite: bool = MISSING
    eval: EvalConfig = MISSING


@dataclass
class RunConfig:
    name: Optional[str] = MISSING
    seed: int = MISSING
    max_steps: int = MISSING
    output_dir: str = MISSING
    per_device_batch_size: int = MISSING
    grad_accum: int = MISSING
    learning_rate: float = MISSING
    max_length: int = MISSING
    dataset: Optional[str] = MISSING
    logging_steps: int = MISSING
    device: str = MISSING
    save_steps: Optional[int] = MISSING
    resume: bool = MISSING
    overwrite: bool = MISSING
    dry_run: bool = MISSING
    verbose: bool = MISSING
    extra_args: List[str] = MISSING
    optimized_metric: Optional[str] = MISSING  # what the job returns to a sweeper plugin (launcher/objective.py)
    allow_untested_swift: bool = (
        MISSING  # go on with an ms-swift outside the tested series (gkd_harness.harness.launcher.swift_version)
    )


@dataclass
class TrainConfig:
    """The whole ``gkd-train`` config (``configs/train.yaml`` composed with its groups)."""

    run: RunConfig = MISSING
    model: ModelConfig = MISSING
    loss: LossConfig = MISSING
    gkd: GKDConfig = MISSING
    backend: BackendConfig = MISSING
    rollout: RolloutConfig = MISSING
    tracking: TrackingConfig = MISSING
    monitor: MonitorConfig = MISSING


#: (group, schema name, dataclass): each YAML file of the group lists its schema first in its defaults.
SCHEMAS = (
    (None, "train_schema", TrainConfig),
    ("loss", "loss_schema", LossConfig),
    ("gkd", "gkd_schema", GKDConfig),
    ("model", "model_schema", ModelConfig),
    ("backend", "hf_schema", HFBackendConfig),
    ("backend", "megatron_schema", MegatronBackendConfig),
    ("rollout", "none_schema", RolloutConfig),
    ("rollout", "hf_schema", OnPolicyRolloutConfig),
    ("rollout", "vllm_colocate_schema", VllmColocateRolloutConfig),
    ("rollout", "vllm_server_schema", VllmServerRolloutConfig),
    ("tracking", "tracking_schema", TrackingConfig),
    ("monitor", "monitor_schema", MonitorConfig),
)


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent; call before composing)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for group, name, node in SCHEMAS:
        cs.store(group=group, name=name, node=node)


# --------------------------------------------------------------------------------------- typed object, once
def to_typed(cfg: Any) -> TrainConfig:
    """The composed config as one :class:`TrainConfig` (interpolations resolved; Hydra's own node dropped).

    Raises:
        ConfigError: a missing or ill-typed value, naming its full key.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(cfg, TrainConfig):
        return cfg
    data: Any
    if isinstance(cfg, DictConfig):
        try:
            data = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as e:
            raise ConfigError(_full_key(e), _short(e)) from None
    else:
        data = cfg
    data = {k: v for k, v in dict(data).items() if k != "hydra"}
    return from_dict(data)


def _full_key(e: Exception) -> str:
    return str(getattr(e, "full_key", None) or "config")


def _short(e: Exception) -> str:
    msg = str(getattr(e, "msg", None) or e).splitlines()[0]
    return msg


# The concrete class of a polymorphic group, chosen by the value that tells them apart.
# The discriminating value is checked first: with an unknown one, the error must name it (rollout.engine), not
# a key the fallback class happens not to have.
def _backend_class(data: Mapping[str, Any]) -> type:
    if data.get("name") not in BACKENDS:
        raise ConfigError("backend.name", f"must be one of {list(BACKENDS)}, got {data.get('name')!r}")
    return MegatronBackendConfig if data.get("name") == "megatron" else HFBackendConfig


def _rollout_class(data: Mapping[str, Any]) -> type:
    if data.get("engine") not in ROLLOUT_ENGINES:
        raise ConfigError("rollout.engine", f"must be one of {list(ROLLOUT_ENGINES)}, got {data.get('engine')!r}")
    if data.get("engine") == "vllm":
        mode = (data.get("vllm") or {}).get("mode")
        if mode not in VLLM_MODES:
            raise ConfigError("rollout.vllm.mode", f"must be one of {list(VLLM_MODES)}, got {mode!r}")
        return VllmServerRolloutConfig if mode == "server" else VllmColocateRolloutConfig
    if data.get("engine") == "hf":
        return OnPolicyRolloutConfig
    return RolloutConfig


_POLYMORPHIC = {BackendConfig: _backend_class, RolloutConfig: _rollout_class}


def from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """Rebuild a :class:`TrainConfig` from nested plain data (``dataclasses.asdict`` output or YAML).

    Raises:
        ConfigError: an unknown or missing key, or a value of the wrong type, naming its full key.
    """
    return _build(TrainConfig, data, "")


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(prefix.rstrip(".") or "config", f"must be a mapping, got {data!r}")
    if cls in _POLYMORPHIC:
        cls = _POLYMORPHIC[cls](data)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown key (known: {', '.join(names)})")
    values = {}
    for name in names:
        key = prefix + name
        if name not in data:
            raise ConfigError(key, "missing")
        values[name] = _value(hints[name], data[name], key)
    return cls(**values)


def _value(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _value(args[0], value, key)
    if tp is Any:
        return value
    if value is None:
        raise ConfigError(key, "must not be null")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin in (list, List):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"must be a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_value(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != int(value):
            raise ConfigError(key, f"must be an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string, got {value!r}")
        return value
    return value


def to_dict(cfg: TrainConfig) -> dict:
    """The plain nested form of ``cfg`` (JSON-serialisable): what the plugin receives and config.yaml holds."""
    return dataclasses.asdict(cfg)


__all__ = [
    "BACKENDS",
    "DEVICES",
    "WANDB_MODES",
    "ROLLOUT_ENGINES",
    "VLLM_MODES",
    "EMBEDDED",
    "ConfigError",
    "TrainConfig",
    "RunConfig",
    "ModelConfig",
    "EmbeddedConfig",
    "LossConfig",
    "GKDConfig",
    "BackendConfig",
    "HFBackendConfig",
    "MegatronBackendConfig",
    "RolloutConfig",
    "OnPolicyRolloutConfig",
    "VllmColocateRolloutConfig",
    "VllmServerRolloutConfig",
    "VllmColocateConfig",
    "VllmServerConfig",
    "VllmServerAddress",
    "TrackingConfig",
    "WandbConfig",
    "MonitorConfig",
    "SpotCheckConfig",
    "EvalConfig",
    "register_schemas",
    "to_typed",
    "from_dict",
    "to_dict",
]
