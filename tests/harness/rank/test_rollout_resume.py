"""A resumed λ = 0.5 run draws the same on/off-policy sequence as one never stopped (issue 41, item 6).

ms-swift's Megatron rollout mixin starts ``_step`` at 0 and never restores it, and the GKD trainer draws with
``random.Random(seed + _step)``: after a resume at iteration k the draws replayed steps 0, 1, ... The HF trainer draws
with ``seed + state.global_step`` (restored) but buffers by its own ``_step`` (restarted at 0), so with
``steps_per_generation`` above the accumulation steps a resume inside a cycle drew at the wrong step.

Megatron's trainer cannot be imported on this CPU machine (``mcore_bridge`` needs Transformer Engine), so its real
methods (``MegatronRolloutMixin._replace_data_iterator``, ``MegatronGKDTrainer._get_random_num`` and
``_determine_data_source``) are compiled from ms-swift's own source files onto a test class; only
``_build_rollout_buffer`` is replaced, by one that draws as the real one does (one ``_determine_data_source`` per
generation cycle) and returns the cycle's ``steps_per_generation`` labelled micro-batches. The HF trainer is the real
``GKDTrainer`` class (``_prepare_inputs``, ``_get_random_num``), with ``_generate_and_score_completions`` replaced
by one that draws as ``_rollout_samples`` does.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import random
from types import SimpleNamespace

import pytest
from megatron.core.rerun_state_machine import RerunDataIterator
from swift.rlhf_trainers.gkd_loss import DataSource

from gkd_harness.harness.rank.rollout_patches import continue_hf_rollout_step, continue_megatron_rollout_step

STEPS, SEED, LMBDA = 24, 42, 0.5


def _methods(module: str, cls: str, names: tuple[str, ...]) -> dict:
    """The functions ``names`` of class ``cls``, compiled from ``module``'s source file (not imported)."""
    path = importlib.util.find_spec(module).origin
    tree = ast.parse(open(path).read())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    ns = {
        "random": random,
        "DataSource": DataSource,
        "RerunDataIterator": RerunDataIterator,
        "logger": SimpleNamespace(warning_once=lambda *a, **k: None),
    }
    found = {}
    for fn in node.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in names:
            fn.decorator_list = []
            exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)
            found[fn.name] = ns[fn.name]
    assert set(found) == set(names), f"ms-swift's {cls} changed: {set(names) - set(found)}"
    return found


def _megatron_class(patched: bool):
    real = {
        **_methods("swift.megatron.trainers.rollout_mixin", "MegatronRolloutMixin", ("_replace_data_iterator",)),
        **_methods(
            "swift.megatron.trainers.gkd_trainer", "MegatronGKDTrainer", ("_get_random_num", "_determine_data_source")
        ),
    }

    class Trainer:
        def __init__(self, spg: int, iteration: int):
            self.args = SimpleNamespace(seed=SEED)
            self.lmbda, self.use_vllm, self.steps_per_generation = LMBDA, True, spg
            self.unwrapped_models = [SimpleNamespace(training=True)]
            self.state = SimpleNamespace(iteration=iteration)  # MegatronTrainer._load_checkpoint restored it
            self._step, self._buffered_inputs = 0, None  # MegatronRolloutMixin._init_rollout_params

        def _build_rollout_buffer(self, data_iterator):
            source = self._determine_data_source()  # once per cycle, as _generate_and_score_completions does
            return [[{"source": source, "batch": next(data_iterator)}] for _ in range(self.steps_per_generation)]

        def _on_train_step_batch(self, encoded_batches):
            pass

    for name, fn in real.items():
        setattr(Trainer, name, fn)
    if patched:
        continue_megatron_rollout_step(Trainer)
    return Trainer


def _megatron_sources(cls, spg: int, start: int) -> list[str]:
    """The data source of each training iteration from ``start`` to ``STEPS``, as MegatronTrainer runs them."""
    trainer, data, out = cls(spg, start), iter(range(10**6)), []
    while trainer.state.iteration < STEPS:
        batch = next(trainer._replace_data_iterator(data))  # MegatronTrainer.train_step: one micro-batch
        out.append(batch["source"].value)
        trainer.state.iteration += 1  # MegatronTrainer.run_train_step
    return out


@pytest.mark.parametrize("spg", [1, 3])
def test_a_resumed_megatron_run_draws_as_one_never_stopped(spg):
    cls = _megatron_class(patched=True)
    whole = _megatron_sources(cls, spg, 0)
    assert set(whole) == {"student", "dataset"}  # both sources occur at λ = 0.5
    for k in (1, 5, 6, 12, 23):
        assert _megatron_sources(cls, spg, k) == whole[k:], (spg, k)


def test_unpatched_megatron_resume_replays_the_first_draws():
    """ms-swift as shipped: the resumed run's draws are those of steps 0, 1, ... (the defect; this is what the
    patched test above fails on without the patch)."""
    cls = _megatron_class(patched=False)
    whole = _megatron_sources(cls, 1, 0)
    assert _megatron_sources(cls, 1, 12) == whole[:12] != whole[12:]


def _hf_class():
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    class Trainer(GKDTrainer):  # real _prepare_inputs and _get_random_num
        def __init__(self, ga: int, spg: int, global_step: int):  # noqa: D107 - no GKDTrainer.__init__ (models)
            self.args = SimpleNamespace(
                seed=SEED, gradient_accumulation_steps=ga, steps_per_generation=spg, report_to=[]
            )
            self.state = SimpleNamespace(global_step=global_step)
            self.model = SimpleNamespace(training=True)
            self.lmbda, self._step, self._buffered_inputs = LMBDA, 0, None

        def _generate_and_score_completions(self, inputs):
            student = self._get_random_num() <= self.lmbda  # as _rollout_samples draws
            return [{"source": "student" if student else "dataset"} for _ in range(self.args.steps_per_generation)]

    return Trainer


def _hf_sources(cls, ga: int, spg: int, start: int) -> list[str]:
    """The data source of each micro-batch from global step ``start`` to ``STEPS``, as transformers runs them."""
    trainer, out = cls(ga, spg, start), []
    while trainer.state.global_step < STEPS:
        for _ in range(ga):
            out.append(trainer._prepare_inputs({})["source"])
        trainer.state.global_step += 1
    return out


@pytest.mark.parametrize("ga,spg", [(1, 1), (2, 2), (1, 4), (2, 6)])
def test_a_resumed_hf_run_draws_as_one_never_stopped(ga, spg):
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    original = GKDTrainer._prepare_inputs
    try:
        cls = _hf_class()
        continue_hf_rollout_step(GKDTrainer)
        whole = _hf_sources(cls, ga, spg, 0)
        assert set(whole) == {"student", "dataset"}
        for k in (1, 5, 6, 13):
            assert _hf_sources(cls, ga, spg, k) == whole[k * ga :], (ga, spg, k)
    finally:
        GKDTrainer._prepare_inputs = original


def test_unpatched_hf_resume_inside_a_cycle_draws_at_the_wrong_step():
    """ms-swift as shipped, steps_per_generation 4 over 1 accumulation step, resumed at global step 5 (inside the
    cycle that started at 4): the first draw is made at step 5, not 4."""
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    assert not getattr(GKDTrainer._prepare_inputs, "_gkd_resume", False), "an earlier test left the patch installed"
    cls = _hf_class()
    whole = _hf_sources(cls, 1, 4, 0)
    assert any(_hf_sources(cls, 1, 4, k) != whole[k:] for k in (5, 6, 13))


def test_the_plugin_installs_the_hf_step_patch(caplog):
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    from gkd_harness.harness.rank.rollout_patches import continue_rollout_steps

    original = GKDTrainer._prepare_inputs
    try:
        with caplog.at_level(logging.INFO):
            assert "hf_rollout_step" in continue_rollout_steps()
        patched = GKDTrainer._prepare_inputs
        assert getattr(patched, "_gkd_resume", False)
        assert continue_hf_rollout_step(GKDTrainer) and GKDTrainer._prepare_inputs is patched  # idempotent
    finally:
        GKDTrainer._prepare_inputs = original


def test_the_plugin_patches_megatrons_mixin_once_its_trainer_is_imported(monkeypatch):
    """In a Megatron process the plugin's rebinding has imported ms-swift's trainer (and its rollout mixin) before
    the rollout patches run; the mixin found there is patched, and a resumed run then draws as one never stopped."""
    import sys

    from gkd_harness.harness.rank.rollout_patches import continue_rollout_steps

    mixin = _megatron_class(patched=False)
    module = SimpleNamespace(MegatronRolloutMixin=mixin)
    monkeypatch.setitem(sys.modules, "swift.megatron.trainers.rollout_mixin", module)
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    monkeypatch.setattr(GKDTrainer, "_prepare_inputs", GKDTrainer._prepare_inputs)
    assert continue_rollout_steps() == ["hf_rollout_step", "megatron_rollout_step"]
    whole = _megatron_sources(mixin, 1, 0)
    assert _megatron_sources(mixin, 1, 9) == whole[9:]
