"""On-policy rollout settings in ``gkd-train``: the ``rollout`` group as ms-swift arguments and as the subprocess
environment (its rules are :mod:`gkd_harness.harness.config.rollout_rules`).

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
``gkd_harness.harness.rank.rollout_patches``.
"""

from __future__ import annotations

from typing import Optional

from gkd_harness.harness.config.rollout_rules import server_urls, vllm_device
from gkd_harness.harness.config.schema import (
    OnPolicyRolloutConfig,
    TrainConfig,
    VllmColocateRolloutConfig,
    VllmServerRolloutConfig,
)
from gkd_harness.harness.contract import ROLLOUT_ENGINE_ENV
from gkd_harness.harness.launcher.argv_format import cli_value as _fmt


def rollout_args(cfg: TrainConfig) -> list[str]:
    """ms-swift arguments for the rollout group: ``--lmbda``, ``--use_vllm`` and the ``--vllm_*`` flags."""
    ro = cfg.rollout
    args = ["--lmbda", _fmt(float(cfg.gkd.lmbda))]
    # rollout=none, or (rejected by the rollout rules before this) an engine without its on-policy preset
    if ro.engine == "none" or not isinstance(ro, OnPolicyRolloutConfig):
        return args + ["--use_vllm", "false"]
    if ro.max_completion_length is not None:
        args += ["--max_completion_length", _fmt(ro.max_completion_length)]
    if ro.log_completions:
        args += ["--log_completions", "true"]
    # rollout.temperature is validated equal to gkd.temperature; the gkd mapping emits --temperature.
    if ro.engine == "hf" or not isinstance(ro, (VllmColocateRolloutConfig, VllmServerRolloutConfig)):
        return args + ["--use_vllm", "false"]
    args += ["--use_vllm", "true", "--vllm_mode", ro.vllm.mode]
    if isinstance(ro, VllmColocateRolloutConfig):
        vllm = ro.vllm
        args += [
            "--vllm_gpu_memory_utilization",
            _fmt(float(vllm.gpu_memory_utilization)),
            "--vllm_tensor_parallel_size",
            _fmt(vllm.tensor_parallel_size),
        ]
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
        if ro.vllm.server.timeout is not None:
            args += ["--vllm_server_timeout", _fmt(float(ro.vllm.server.timeout))]
    return args


def rollout_engine_name(cfg: TrainConfig) -> str:
    """Label of the rollout engine for run metadata: ``none``, ``hf``, ``vllm-colocate`` or ``vllm-server``."""
    ro = cfg.rollout
    if ro.engine == "vllm" and isinstance(ro, (VllmColocateRolloutConfig, VllmServerRolloutConfig)):
        return f"vllm-{ro.vllm.mode}"
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
      (``gkd_harness.harness.rank.rollout_patches.disable_vllm_cpu_prepack``).
    - ``VLLM_CPU_KVCACHE_SPACE``: KV cache in GiB (vLLM's CPU default of 4 GiB is larger than a tiny run needs).

    Every on-policy engine also gets ``GKD_ROLLOUT_ENGINE`` (:func:`rollout_engine_name`), which switches on the
    rollout instrumentation in the ms-swift process. Returns an empty dict for ``rollout.engine=none``.
    """
    if cfg.rollout.engine == "none":
        return {}
    env = {ROLLOUT_ENGINE_ENV: rollout_engine_name(cfg)}
    if cfg.rollout.engine != "vllm":
        return env
    if vllm_device(cfg, device) == "cpu":
        env.update(VLLM_PLUGINS="none", GKD_VLLM_CPU_NO_PREPACK="1", VLLM_TARGET_DEVICE="cpu")
        if isinstance(cfg.rollout, VllmColocateRolloutConfig):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.rollout.vllm.cpu_kvcache_space_gb)
    return env


__all__ = ["ROLLOUT_ENGINE_ENV", "rollout_args", "rollout_engine_name", "rollout_env", "needs_torchrun"]
