"""The bypass net's counts on the rank (issue 41): the installed ``gkd_loss`` (the dtype boundary, in every monitor
mode) counts its training calls as a Python int, and the writer rank's callback keeps ``loss_calls`` and
``steps_trained`` in ``summary.json`` (at each log, at train end; a resumed attempt counts from its checkpoint's
step). ``gkd-train`` judges them (test_loss_bypass); the real runs are in test_train_e2e and test_loss_bypass_e2e."""

import json
import types

import pytest
import torch
from swift.rlhf_trainers import gkd_trainer
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.rank import callbacks, plugin
from gkd_harness.harness.rank.callbacks import _make_hf_callback
from tests.harness.rank.test_plugin import inputs, restore_swift, settings  # noqa: F401 - fixture


def _train_call(state, seed=0):
    s, t, labels = inputs(seed)
    return state.boundary(s.requires_grad_(True), TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)


@pytest.mark.parametrize("monitor", [True, False], ids=["monitor_default", "monitor_off"])
def test_the_installed_loss_counts_training_calls_not_evaluation(tmp_path, restore_swift, monitor):  # noqa: F811
    state = plugin.install(settings(tmp_path, monitor=monitor))
    assert (state.instrument is None) is (not monitor)
    assert gkd_trainer.gkd_loss is state.boundary and state.boundary.train_calls == 0
    for seed in range(3):
        _train_call(state, seed)
    s, t, labels = inputs(5)
    with torch.no_grad():  # ms-swift's prediction_step and the held-out evaluation: not training calls
        state.boundary(s, TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)
    assert state.boundary.train_calls == 3
    if monitor:  # the instrument, when there is one, saw the same calls (and the evaluation one)
        assert state.instrument.calls == 4


def _hf_state(step):
    return types.SimpleNamespace(global_step=step, is_world_process_zero=True)


def _summary(tmp_path):
    return json.loads((tmp_path / "summary.json").read_text())


@pytest.mark.parametrize("begin", [0, 5], ids=["fresh", "resumed_at_5"])
def test_the_hf_callback_records_calls_and_steps_trained(tmp_path, restore_swift, begin):  # noqa: F811
    """on_train_begin starts both counts at 0 (a resumed attempt never shows the previous attempt's), each log and
    train end write this attempt's calls and the steps it trained (from the checkpoint's step on a resume)."""
    from transformers import TrainingArguments

    (tmp_path / "summary.json").write_text(json.dumps({"loss_calls": 7, "steps_trained": 7}))  # a previous attempt
    state = plugin.install(settings(tmp_path, monitor=False))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    trainer = types.SimpleNamespace(custom_metrics={"train": {}}, model=torch.nn.Linear(2, 2))
    cb = _make_hf_callback()(args, trainer)
    cb.on_train_begin(args, _hf_state(begin), None)
    assert (_summary(tmp_path)["loss_calls"], _summary(tmp_path)["steps_trained"]) == (0, 0)
    _train_call(state)
    cb.on_log(args, _hf_state(begin + 1), None, logs={"loss": 0.5, "grad_norm": 1.0, "learning_rate": 1e-5})
    callbacks.flush_records()
    assert (_summary(tmp_path)["loss_calls"], _summary(tmp_path)["steps_trained"]) == (1, 1)
    _train_call(state, 1)
    _train_call(state, 2)
    cb.on_train_end(args, _hf_state(begin + 3), None)  # no log at the last steps: train end still counts them
    assert (_summary(tmp_path)["loss_calls"], _summary(tmp_path)["steps_trained"]) == (3, 3)


def test_a_bypassed_run_records_steps_without_calls(tmp_path, restore_swift):  # noqa: F811
    """Steps trained with the loss never called (what Liger's fused loss does): the counts gkd-train fails on."""
    from transformers import TrainingArguments

    plugin.install(settings(tmp_path))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    trainer = types.SimpleNamespace(custom_metrics={"train": {}}, model=torch.nn.Linear(2, 2))
    cb = _make_hf_callback()(args, trainer)
    cb.on_train_begin(args, _hf_state(0), None)
    for step in (1, 2):
        cb.on_log(args, _hf_state(step), None, logs={"loss": 0.5, "grad_norm": 1.0, "learning_rate": 1e-5})
    cb.on_train_end(args, _hf_state(2), None)
    summary = _summary(tmp_path)
    assert (summary["loss_calls"], summary["steps_trained"], summary["last_step"]) == (0, 2, 2)
