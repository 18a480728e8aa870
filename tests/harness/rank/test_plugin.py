"""The ms-swift plugin: rebinding gkd_loss, the dtype boundary, the callbacks and wandb naming.

The end-to-end proof that the real HF trainer calls the harness loss is in test_train_e2e (the harness's call
counter equals the number of training steps); here the real ``GKDTrainer._compute_jsd_loss`` is called directly.
"""

import dataclasses
import json
import logging
import math
import types

import pytest
import torch
from swift.rlhf_trainers import gkd_loss as upstream
from swift.rlhf_trainers import gkd_trainer
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.contract import CALLBACK_NAME
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.losses import make_gkd_loss
from gkd_harness.harness.rank import plugin
from gkd_harness.harness.rank import state as rank_state
from gkd_harness.harness.rank.callbacks import _make_hf_callback
from gkd_harness.harness.rank.wandb_run import keep_harness_names_in_wandb


@pytest.fixture
def restore_swift():
    """Undo the plugin's process-wide patches after each test."""
    from swift.callbacks import callbacks_map
    from transformers.integrations import integration_utils as iu

    trainer_attrs = dict(vars(gkd_trainer.GKDTrainer))  # every method the plugin wraps (rollout step included)
    saved = (gkd_trainer.gkd_loss, iu.rewrite_logs, dict(callbacks_map), rank_state.STATE)
    yield
    for name in set(vars(gkd_trainer.GKDTrainer)) - set(trainer_attrs):
        delattr(gkd_trainer.GKDTrainer, name)
    for name, value in trainer_attrs.items():
        if vars(gkd_trainer.GKDTrainer).get(name) is not value:
            setattr(gkd_trainer.GKDTrainer, name, value)
    gkd_trainer.gkd_loss, iu.rewrite_logs = saved[:2]
    callbacks_map.clear()
    callbacks_map.update(saved[2])
    rank_state.STATE = saved[3]


def settings(tmp_path, precision="fp32", monitor=True, overrides=(), **extra):
    """The plugin settings ``gkd-train`` writes (``gkd_harness.harness.launcher.run.plugin_settings``) for the default config with
    ``loss.precision=precision``, spot checks on every step (or ``monitor=off``) and ``overrides``."""
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import plugin_settings

    ov = ["loss=fp32" if precision == "fp32" else "loss=original"]
    ov += ["monitor.spot_check.every_n_steps=1", "monitor.spot_check.max_tokens=64"] if monitor else ["monitor=off"]
    cfg, run_dir = point_config([*ov, *overrides], run_dir=tmp_path)
    return dataclasses.replace(plugin_settings(cfg, run_dir), **extra)


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

    assert CALLBACK_NAME in callbacks_map


def test_the_hf_trainer_calls_the_harness_loss(tmp_path, restore_swift):
    state = plugin.install(settings(tmp_path))
    s, t, labels = inputs()
    stub = types.SimpleNamespace(gkd_logits_topk=None, beta=0.5, temperature=0.9)
    x = s.clone().requires_grad_(True)
    loss = gkd_trainer.GKDTrainer._compute_jsd_loss(
        stub, x, TeacherOutput(full_logits=t, labels=labels.clone()), labels
    )
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
    result = plugin.rebind_gkd_loss(lambda *a: None, modules=("no_such_pkg.trainer",))
    assert result["no_such_pkg.trainer"].startswith("skipped: ModuleNotFoundError")


def test_wandb_keeps_design_names(tmp_path, restore_swift):
    plugin.install(settings(tmp_path))
    from transformers.integrations import integration_utils as iu

    out = iu.rewrite_logs({"loss": 1.0, "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 0.1, "eval_loss": 3.0})
    assert out == {"train/loss": 1.0, "gkd/neg_loss_calls": 2.0, "spot/grad_rel_l2": 0.1, "eval/loss": 3.0}


def test_settings_from_env_file(tmp_path, monkeypatch, restore_swift):
    path = tmp_path / "s.json"
    settings(tmp_path).write(path)
    monkeypatch.setenv(plugin.SETTINGS_ENV, str(path))
    rank_state.STATE = None
    state = plugin.ensure_installed()
    assert state is not None and state.config.loss.precision == "fp32"
    assert plugin.ensure_installed() is state  # once per process


def test_resumed_run_continues_cumulative_counts(tmp_path, restore_swift):
    state = plugin.install(
        settings(tmp_path, resume_totals={"gkd/loss_calls_total": 6.0, "gkd/neg_loss_calls_total": 4.0})
    )
    s, t, labels = inputs()
    state.boundary(s, TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)
    assert state.instrument.metrics["gkd/loss_calls_total"].compute() == 7.0
    assert state.instrument.metrics["gkd/neg_loss_calls_total"].compute() == 4.0


# ----------------------------------------------------------------------------------------------------------
# no device query at import / install (ms-swift imports plugins before it sets each rank's device)
# ----------------------------------------------------------------------------------------------------------
DEVICE_QUERY_PROBE = r"""
import json, os, sys
import torch

counts = {}


def counting(name, fn):
    def wrapper(*a, **k):
        counts[name] = counts.get(name, 0) + 1
        return fn(*a, **k)
    return wrapper


for name in ("current_device", "set_device", "_lazy_init"):
    setattr(torch.cuda, name, counting(f"torch.cuda.{name}", getattr(torch.cuda, name)))
import swift.utils
import swift.utils.torch_utils

original = swift.utils.torch_utils.get_current_device
wrapped = counting("swift.utils.get_current_device", original)
for mod in list(sys.modules.values()):  # every module that already bound the function by name
    if getattr(mod, "__dict__", {}).get("get_current_device") is original:  # no getattr: lazy modules import
        setattr(mod, "get_current_device", wrapped)

from swift.utils import import_external_file  # exactly how ms-swift loads --external_plugins

import_external_file(sys.argv[1])
from gkd_harness.harness.rank import plugin

from gkd_harness.harness.rank import state
assert state.STATE is not None and state.STATE.instrument is not None, "the plugin did not install"
print("COUNTS=" + json.dumps(counts))
"""


def test_importing_and_installing_the_plugin_queries_no_device(tmp_path):
    """Counting wrappers around ``torch.cuda.current_device`` / ``set_device`` / ``_lazy_init`` and ms-swift's
    ``get_current_device`` (every binding of it): loading the plugin file as ms-swift does, with settings, so it
    installs the instrumented loss, calls none of them (the old ``build_metrics`` called get_current_device 4x)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "settings.json"
    settings(tmp_path).write(path)
    env = dict(os.environ, **{plugin.SETTINGS_ENV: str(path)})
    proc = subprocess.run(
        [sys.executable, "-c", DEVICE_QUERY_PROBE, str(Path(plugin.__file__).resolve())],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = json.loads(proc.stdout.split("COUNTS=")[-1].splitlines()[0])
    assert counts == {}


# ----------------------------------------------------------------------------------------------------------
# Megatron: same names as HF, records on the rank that owns the wandb run
# ----------------------------------------------------------------------------------------------------------
MEGATRON_LOG_PROBE = r"""
import importlib, importlib.util, json, os, sys
from types import SimpleNamespace

# Import-only stand-in for Transformer Engine's absence: mcore_bridge's package __init__ runs its patcher, which
# imports transformer_engine (no CPU build). The real package is loaded with that one call skipped; the Megatron
# callback modules under test (swift.megatron.callbacks.*) are ms-swift's own code, unchanged.
spec = importlib.util.find_spec("mcore_bridge")
pkg = importlib.util.module_from_spec(spec)
sys.modules["mcore_bridge"] = pkg
importlib.import_module("mcore_bridge.patcher").apply_patch = lambda: None
spec.loader.exec_module(pkg)

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.rank import plugin

settings = plugin.load_settings()
state = plugin.install(settings)
from swift.megatron.callbacks import megatron_callbacks_map

# ms-swift builds trainer.callbacks from args.callbacks = [--callbacks..., 'print', 'default_flow', *report_to]
# and BaseMegatronTrainer.call_event('on_log', logs=logs) calls each in that order; the trainer itself needs
# Transformer Engine, so a namespace with the attributes the callbacks read stands in for it.
run_dir = settings.run_dir
trainer = SimpleNamespace(args=SimpleNamespace(output_dir=run_dir, wandb_exp_name="megatron-names",
                                               wandb_project="gkd-harness-test"),
                          state=SimpleNamespace(iteration=0))
callbacks = [megatron_callbacks_map[name](trainer) for name in ("gkd_harness", "wandb")]
for cb in callbacks:
    cb.on_train_begin()
for cb in callbacks:
    cb.on_step_begin()
g = torch.Generator().manual_seed(0)
s = torch.randn(2, 6, 32, generator=g) * 2
labels = torch.randint(0, 32, (2, 6), generator=g)
state.boundary(s, TeacherOutput(full_logits=s + 0.01 * torch.randn(2, 6, 32, generator=g), labels=labels), labels,
               0.5, 0.9)
trainer.state.iteration = 1
logs = {"loss": 0.25, "grad_norm": 1.5, "learning_rate": 1e-5}
for cb in callbacks:
    cb.on_log(logs)
for cb in callbacks:
    cb.on_train_end()
print("LOGS=" + json.dumps(sorted(logs)))
"""


def _wandb_history_keys(run_dir):
    """Keys of the history rows and the config keys of the offline wandb run under ``run_dir``."""
    from gkd_harness.analysis.sweep.wandb_file import read_records

    files = sorted(run_dir.rglob("run-*.wandb"))
    history, config = set(), set()
    for f in files:
        for rec in read_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                history |= {item.key or "/".join(item.nested_key) for item in rec.history.item}
            elif kind == "config":
                config |= {item.key or "/".join(item.nested_key) for item in rec.config.update}
    return files, history, config


@pytest.mark.parametrize("rank", [1, 0])
def test_megatron_logs_harness_metrics_under_the_hf_names(tmp_path, rank):
    """ms-swift's own Megatron wandb callback (its ``rewrite_logs`` turns ``gkd/x`` into ``train/gkd_x``) logs the
    harness metrics under their DESIGN names, the names HF logs; ``metrics.jsonl``, the dtypes in summary.json and
    the harness config on the wandb run come from the last rank (the one with the wandb run, on the last pipeline
    stage), and nothing from the others. ``RANK``/``WORLD_SIZE`` say which rank the process is (no process group)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from transformers.integrations import integration_utils as iu

    path = tmp_path / "settings.json"
    settings(tmp_path).write(path)
    env = dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path / "wandb"),
        **{plugin.SETTINGS_ENV: str(path)},
    )
    proc = subprocess.run(
        [sys.executable, "-c", MEGATRON_LOG_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    logged = json.loads(proc.stdout.split("LOGS=")[-1].splitlines()[0])
    assert "gkd/loss_calls_total" in logged and "spot/loss" in logged  # the harness callback added its metrics
    files, history, config = _wandb_history_keys(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text()) if (tmp_path / "summary.json").exists() else {}
    if rank == 0:  # not the last rank: no wandb run, no records
        assert files == [] and not (tmp_path / "metrics.jsonl").exists() and "dtypes_seen" not in summary
        return
    # the names HF gives the same logs (the plugin's wrapper of transformers' rewrite_logs, installed here)
    keep_harness_names_in_wandb()
    hf_names = set(iu.rewrite_logs({k: 1.0 for k in logged}))
    assert {k for k in history if not k.startswith("_")} == hf_names
    assert {"gkd/jsd_loss", "gkd/loss_calls_total", "spot/grad_rel_l2", "train/loss", "train/grad_norm"} <= history
    assert not any(k.startswith("train/gkd_") or k.startswith("train/spot_") for k in history)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["step"] == 1 and records[0]["gkd/loss_calls_total"] == 1.0
    assert set(records[0]) - {"step"} == {k for k in hf_names if not k.startswith("train/learning")} | {
        "train/learning_rate"
    }
    assert summary["dtypes_seen"] == {"student": "float32", "teacher": "bfloat16"}
    assert "harness" in config  # the harness config is on this rank's wandb run (nested under "harness")


# ----------------------------------------------------------------------------------------------------------
# NaN / Inf in the logs; fail_on_nonfinite
# ----------------------------------------------------------------------------------------------------------
def _hf_callback(state_args):
    cls = _make_hf_callback()
    return cls(state_args, types.SimpleNamespace())


@pytest.mark.parametrize("key", ["loss", "grad_norm"])
def test_nonfinite_logged_loss_or_grad_norm_stops_the_run_naming_the_step(tmp_path, restore_swift, key):
    from gkd_harness.harness.rank.instrument import NonFiniteError

    plugin.install(settings(tmp_path))
    cb = _hf_callback(types.SimpleNamespace())
    state = types.SimpleNamespace(global_step=2, is_world_process_zero=True)
    cb.on_log(None, state, None, logs={"loss": 0.1, "grad_norm": 1.0, "learning_rate": 1e-5})  # finite: fine
    with pytest.raises(NonFiniteError, match=rf"non-finite {key} \(nan\) at step 3"):
        state.global_step = 3
        cb.on_log(None, state, None, logs={"loss": 0.1, "grad_norm": 1.0, "learning_rate": 1e-5, key: float("nan")})
    # the non-finite value reached metrics.jsonl as itself before the run stopped
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert math.isnan(rows[-1][f"train/{key}"]) and rows[-1]["step"] == 3


def test_fail_on_nonfinite_off_logs_nan_and_continues(tmp_path, restore_swift):
    state = plugin.install(settings(tmp_path, overrides=["monitor.fail_on_nonfinite=false"]))
    s, t, labels = inputs()
    s[0, 3, 0] = float("nan")
    state.boundary(s, TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)  # no error
    cb = _hf_callback(types.SimpleNamespace())
    cb.on_log(
        None,
        types.SimpleNamespace(global_step=1, is_world_process_zero=True),
        None,
        logs={"loss": float("nan"), "grad_norm": float("inf")},
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert math.isnan(rows[-1]["train/loss"]) and rows[-1]["train/grad_norm"] == math.inf


def test_first_nonfinite_loss_call_stops_the_run(tmp_path, restore_swift):
    """At the logging step that reads the calls (ms-swift's ``compute_custom_metrics``), naming the call's step."""
    from swift.trainers.mixin import SwiftMixin

    from gkd_harness.harness.rank.instrument import NonFiniteError

    state = plugin.install(settings(tmp_path))
    state.instrument.step = 4
    s, t, labels = inputs()
    s[0, 3, 0] = float("inf")
    state.boundary(s, TeacherOutput(full_logits=t, labels=labels), labels, 0.5, 0.9)
    with pytest.raises(NonFiniteError, match="non-finite GKD loss at step 4"):
        SwiftMixin.compute_custom_metrics(state.instrument.metrics)


def test_hf_nan_filter_is_turned_off_at_train_begin(tmp_path, restore_swift):
    """transformers' ``logging_nan_inf_filter`` (default True) replaces a NaN/Inf step loss by the window's mean,
    which is 0.0 right after a log: the run would log ``train/loss: 0.0``. The callback turns it off."""
    from transformers import TrainingArguments

    plugin.install(settings(tmp_path))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    assert args.logging_nan_inf_filter is True
    trainer = types.SimpleNamespace(custom_metrics={"train": {}}, model=torch.nn.Linear(2, 2))
    cb = _make_hf_callback()(args, trainer)
    cb.on_train_begin(args, types.SimpleNamespace(global_step=0, is_world_process_zero=True), None)
    assert args.logging_nan_inf_filter is False
    assert rank_state.STATE.instrument.where.device == torch.device("cpu")  # bound to the rank's device at train begin
    assert set(trainer.custom_metrics["train"]) >= {"gkd/jsd_loss", "gkd/loss_calls_total"}


@pytest.mark.parametrize("how", ["import_failed", "rebound_elsewhere"])
def test_train_begin_stops_when_the_active_call_site_holds_another_loss(tmp_path, restore_swift, how):
    """The HF call site did not import when the plugin loaded (or something rebound it since): at train begin the
    callback stops the run naming the module and why, instead of training on upstream's loss."""
    from transformers import TrainingArguments

    state = plugin.install(settings(tmp_path))
    gkd_trainer.gkd_loss = upstream.gkd_loss
    if how == "import_failed":
        state.rebound["swift.rlhf_trainers.gkd_trainer"] = "skipped: ImportError: cannot import name 'x' (boom)"
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
    trainer = types.SimpleNamespace(custom_metrics={"train": {}}, model=torch.nn.Linear(2, 2))
    cb = _make_hf_callback()(args, trainer)
    with pytest.raises(plugin.LossNotInstalledError) as err:
        cb.on_train_begin(args, types.SimpleNamespace(global_step=0, is_world_process_zero=True), None)
    msg = str(err.value)
    assert "loss.precision=fp32 is not installed in swift.rlhf_trainers.gkd_trainer" in msg
    if how == "import_failed":
        assert "ImportError: cannot import name 'x' (boom)" in msg
    else:
        assert "its gkd_loss is swift.rlhf_trainers.gkd_loss.gkd_loss" in msg
    gkd_trainer.gkd_loss = state.boundary  # rebound: train begin goes on
    assert plugin.check_rebound() == "swift.rlhf_trainers.gkd_trainer"
