"""The ms-swift plugin: rebinding gkd_loss, the dtype boundary, the callbacks and wandb naming.

The end-to-end proof that the real HF trainer calls the harness loss is in test_train_e2e (the harness's call
counter equals the number of training steps); here the real ``GKDTrainer._compute_jsd_loss`` is called directly.
"""
import json
import logging
import types

import pytest
import torch
from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers import gkd_trainer
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from harness import plugin
from harness.losses import make_gkd_loss
from tests.reference import reference_gkd


@pytest.fixture
def restore_swift():
    """Undo the plugin's process-wide patches after each test."""
    from swift.callbacks import callbacks_map
    from transformers.integrations import integration_utils as iu

    saved = (gkd_trainer.gkd_loss, gkd_trainer.GKDTrainer.compute_loss, iu.rewrite_logs, dict(callbacks_map),
             plugin.STATE)
    yield
    gkd_trainer.gkd_loss, gkd_trainer.GKDTrainer.compute_loss, iu.rewrite_logs = saved[:3]
    callbacks_map.clear()
    callbacks_map.update(saved[3])
    plugin.STATE = saved[4]


def settings(tmp_path, precision="fp32", monitor=True, overrides=(), **extra):
    """The plugin settings ``gkd-train`` writes (``harness.train.plugin_settings``) for the default config with
    ``loss.precision=precision``, spot checks on every step (or ``monitor=off``) and ``overrides``."""
    from harness.compose import point_config
    from harness.train import plugin_settings

    ov = ["loss=fp32" if precision == "fp32" else "loss=original"]
    ov += (["monitor.spot_check.every_n_steps=1", "monitor.spot_check.max_tokens=64"] if monitor else ["monitor=off"])
    cfg, run_dir = point_config([*ov, *overrides], run_dir=tmp_path)
    return {**plugin_settings(cfg, run_dir), **extra}


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, 6, 32, generator=g) * 2
    t = s + 0.01 * torch.randn(2, 6, 32, generator=g)  # FP32 teacher logits, as HF delivers them
    labels = torch.randint(0, 32, (2, 6), generator=g)
    labels[:, :2] = -100
    return s, t, labels


def test_install_rebinds_hf_and_logs_skipped_modules(tmp_path, restore_swift, caplog):
    with caplog.at_level(logging.INFO, logger="gkd_harness.plugin"):
        state = plugin.install(settings(tmp_path))
    assert gkd_trainer.gkd_loss is state.boundary
    assert state.rebound["swift.rlhf_trainers.gkd_trainer"] == "rebound"
    for name in ("swift.megatron.trainers.gkd_trainer", "swift.ray.megatron.loss.gkd"):
        status = state.rebound[name]
        assert status == "rebound" or status.startswith("skipped: ")
        if status != "rebound":
            assert any(name in r.getMessage() and "cannot be imported" in r.getMessage() for r in caplog.records)
    from swift.callbacks import callbacks_map

    assert plugin.CALLBACK_NAME in callbacks_map


def test_the_hf_trainer_calls_the_harness_loss(tmp_path, restore_swift):
    state = plugin.install(settings(tmp_path))
    s, t, labels = inputs()
    stub = types.SimpleNamespace(gkd_logits_topk=None, beta=0.5, temperature=0.9)
    x = s.clone().requires_grad_(True)
    loss = gkd_trainer.GKDTrainer._compute_jsd_loss(stub, x, TeacherOutput(full_logits=t, labels=labels.clone()),
                                                    labels)
    assert state.instrument.calls == 1
    assert state.boundary.arrived == {"student": "float32", "teacher": "float32"}
    assert state.boundary.seen == {"student": "float32", "teacher": "bfloat16"}
    # the value is the patched loss on the BF16-cast teacher, per position, vs the independent FP64 reference
    shifted = torch.roll(labels, -1, 1)
    total, n, _ = reference_gkd(s, shifted, 0.5, 0.9, teacher_full=t.bfloat16())
    assert float(loss) == pytest.approx(total / n, rel=1e-4, abs=2e-6)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_monitor_off_installs_the_bare_variant(tmp_path, restore_swift):
    state = plugin.install(settings(tmp_path, precision="native", monitor=False))
    assert state.instrument is None
    assert gkd_trainer.gkd_loss.loss is upstream.gkd_loss is make_gkd_loss("native", "paper")


def test_topk_teacher_is_cast_too(tmp_path, restore_swift):
    state = plugin.install(settings(tmp_path))
    s, t, labels = inputs(1)
    teacher = TeacherOutput(full_logits=t, labels=labels).to_topk(4)
    state.boundary(s, teacher, labels, 0.5, 0.9)
    assert state.boundary.seen["teacher"] == "bfloat16"


def test_unimportable_module_is_skipped():
    result = plugin.rebind_gkd_loss(lambda *a: None, modules=("no_such_pkg.trainer", ))
    assert result["no_such_pkg.trainer"].startswith("skipped: ModuleNotFoundError")


def test_wandb_keeps_design_names(tmp_path, restore_swift):
    plugin.install(settings(tmp_path))
    from transformers.integrations import integration_utils as iu

    out = iu.rewrite_logs({"loss": 1.0, "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 0.1, "eval_loss": 3.0})
    assert out == {"train/loss": 1.0, "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 0.1, "eval/loss": 3.0}


def test_settings_from_env_file(tmp_path, monkeypatch, restore_swift):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(settings(tmp_path)))
    monkeypatch.setenv(plugin.SETTINGS_ENV, str(path))
    plugin.STATE = None
    state = plugin.ensure_installed()
    assert state is not None and plugin.settings_config(state.settings).loss.precision == "fp32"
    assert plugin.ensure_installed() is state  # once per process


def test_resumed_run_continues_cumulative_counts(tmp_path, restore_swift):
    state = plugin.install(settings(tmp_path, resume_totals={"gkd/loss_calls_total": 6.0,
                                                             "gkd/neg_loss_calls_total": 4.0}))
    s, t, labels = inputs()
    state.boundary(s, TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)
    assert state.instrument.metrics["gkd/loss_calls_total"].compute() == 7.0
    assert state.instrument.metrics["gkd/neg_loss_calls_total"].compute() == 4.0
