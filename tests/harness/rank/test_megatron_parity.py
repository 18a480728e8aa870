"""Megatron parity with HF, driven through ms-swift's real Megatron callbacks (``swift.megatron.callbacks``):

- ``monitor.spot_check.param_grad=true`` measures ``spot/param_grad_rel_l2`` from the Megatron trainer's model
  (``trainer.unwrapped_models``), as the HF callback does from ``trainer.model``, checked against an independent
  FP64 parameter gradient (chain rule through the linear "model" on ``reference_gkd``'s logit gradient);
- ms-swift's Megatron wandb callback, given gkd-train's real ``--output_dir <run>/swift`` (its ``wandb.init(dir=...)``
  argument), writes its offline files into ``<run>/wandb/wandb/offline-run-*`` as HF runs do, which the
  documented ``wandb sync`` glob and the offline loader find (before: ``<run>/swift/wandb/``);
- with the check on, gkd-train's Megatron argv turns activation recompute off (ms-swift's default ``selective``
  makes megatron-core's checkpointing raise under the check's ``torch.autograd.grad``), and an explicit
  recompute with the check is refused naming the keys.

The Megatron trainer itself needs Transformer Engine (no CPU build), so a namespace with the attributes the
callbacks read stands in for it, as in ``test_plugin.MEGATRON_LOG_PROBE``.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gkd_harness.harness.contract import SPOT_PARAM_GRAD_REL_L2, SWIFT_DIR
from gkd_harness.harness.rank import plugin
from tests.harness.rank.test_plugin import settings

ROOT = Path(__file__).resolve().parents[3]

PARITY_PROBE = r"""
import importlib, importlib.util, json, math, os, sys
from types import SimpleNamespace

# Import-only stand-in for Transformer Engine's absence (see test_plugin.MEGATRON_LOG_PROBE): mcore_bridge's
# package __init__ runs its patcher, which imports transformer_engine; the callbacks are ms-swift's own code.
spec = importlib.util.find_spec("mcore_bridge")
pkg = importlib.util.module_from_spec(spec)
sys.modules["mcore_bridge"] = pkg
importlib.import_module("mcore_bridge.patcher").apply_patch = lambda: None
spec.loader.exec_module(pkg)

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.losses import make_gkd_loss
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.rank import plugin

settings = plugin.load_settings()
state = plugin.install(settings)
from swift.megatron.callbacks import megatron_callbacks_map

output_dir = sys.argv[1]  # gkd-train's --output_dir for this run folder (megatron_argv)
torch.manual_seed(0)
model = torch.nn.Linear(16, 32)  # the student "model": one chunk of unwrapped_models
trainer = SimpleNamespace(args=SimpleNamespace(output_dir=output_dir, wandb_exp_name="megatron-parity",
                                               wandb_project="gkd-harness-test", recompute_granularity=None),
                          state=SimpleNamespace(iteration=0), unwrapped_models=[model])
callbacks = [megatron_callbacks_map[name](trainer) for name in ("gkd_harness", "wandb")]
for cb in callbacks:
    cb.on_train_begin()
for cb in callbacks:
    cb.on_step_begin()
g = torch.Generator().manual_seed(0)
h = torch.randn(2, 6, 16, generator=g)
labels = torch.randint(0, 32, (2, 6), generator=g)
labels[:, :2] = -100
beta, temperature = 0.5, 0.9
logits = model(h)  # FP32 student, BF16 teacher (the boundary casts nothing)
teacher = (logits.detach() + 0.5 * torch.randn(2, 6, 32, generator=g)).bfloat16()
total, n = state.boundary(logits, TeacherOutput(full_logits=teacher, labels=labels), labels, beta, temperature)
(total / n).backward()  # the training step's own backward still works after the check
trainer.state.iteration = 1
logs = {"loss": float(total / n), "grad_norm": 1.5, "learning_rate": 1e-5}
for cb in callbacks:
    cb.on_log(logs)
for cb in callbacks:
    cb.on_train_end()

# independent: the FP64 reference's logit gradient carried to W and b by hand (logits = h W^T + b), against the
# run variant's parameter gradient
beta_form = settings.config["loss"]["beta_form"]
_, _, grad = reference_gkd(logits.detach(), labels, beta, temperature, beta_form, teacher_full=teacher)
h64 = h.double()
g_ref = [torch.einsum("bsv,bsi->vi", grad, h64), grad.sum((0, 1))]
precision = settings.config["loss"]["precision"]
t_run, n_run = make_gkd_loss(precision, beta_form)(model(h), TeacherOutput(full_logits=teacher, labels=labels),
                                                 labels, beta, temperature)
g_run = torch.autograd.grad(t_run / n_run, [model.weight, model.bias])
num = sum(float((a.double() - r).pow(2).sum()) for a, r in zip(g_run, g_ref))
den = sum(float(r.pow(2).sum()) for r in g_ref)
print("OUT=" + json.dumps({"logs": {k: (v if isinstance(v, (int, float)) else None) for k, v in logs.items()},
                           "independent": math.sqrt(num) / math.sqrt(den)}))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One run of :data:`PARITY_PROBE` as global rank 1 of 2 (the last rank: it owns the wandb run and writes the
    run folder) on the run folder ``sweep/point``, loss=original (the upstream loss: its parameter-gradient error
    on an FP32 student with a BF16 teacher is well above FP32 rounding). Returns (run folder, probe output)."""
    tmp_path = tmp_path_factory.mktemp("megatron_parity")
    run_dir = tmp_path / "sweep" / "point"
    path = tmp_path / "settings.json"
    settings(run_dir, precision="original", overrides=["monitor.spot_check.param_grad=true"]).write(path)
    env = dict(
        os.environ,
        RANK="1",
        LOCAL_RANK="1",
        WORLD_SIZE="2",
        WANDB_MODE="offline",
        WANDB_DIR=str(run_dir / "wandb"),
        **{plugin.SETTINGS_ENV: str(path)},
    )
    proc = subprocess.run(
        [sys.executable, "-c", PARITY_PROBE, str(run_dir / SWIFT_DIR)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir, json.loads(proc.stdout.split("OUT=")[-1].splitlines()[0])


def test_megatron_param_grad_spot_check_uses_the_trainers_model(probe):
    """The Megatron callback hands the model's parameters to the instrument: ``spot/param_grad_rel_l2`` is logged
    and equals the independent FP64 value (the HF test's tolerance,
    ``test_instrument.test_param_grad_check_through_a_model``). Before, the Megatron callback handed none and the
    metric was never measured (``None`` in the logs)."""
    run_dir, out = probe
    value = out["logs"].get(SPOT_PARAM_GRAD_REL_L2)
    assert value is not None and math.isfinite(value), out["logs"]
    assert value == pytest.approx(out["independent"], rel=0.05, abs=1e-7)
    assert value > 1e-5  # a measured error, not rounding noise
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row[SPOT_PARAM_GRAD_REL_L2] == value  # and it reaches metrics.jsonl


def test_megatron_last_rank_records_the_loss_calls(probe):
    """The bypass net's counts (issue 41) from ms-swift's Megatron callback on the last rank (the writer): one
    training call of the installed loss in the one iteration trained."""
    run_dir, _ = probe
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["loss_calls"], summary["steps_trained"]) == (1, 1)


def test_megatron_wandb_files_land_in_the_run_folders_wandb(probe, tmp_path):
    """ms-swift's Megatron wandb callback with its real ``dir`` (``args.output_dir`` = gkd-train's
    ``<run>/swift``) writes into ``<run>/wandb/wandb/offline-run-*``, as HF does: every glob of the documented
    ``wandb sync`` commands (docs/cluster.md, docs/wandb.md) finds it, nothing is left under ``<run>/swift/``,
    and the offline loader puts the run at its run folder. Before: ``<run>/swift/wandb/offline-run-*``, which
    the loader still places at its run folder (a run made before the change)."""
    import shutil

    from gkd_harness.analysis.sweep.offline import OfflineRun, find_offline_runs, group_attempts

    run_dir, _ = probe
    files = sorted(run_dir.rglob("run-*.wandb"))
    assert len(files) == 1 and files[0].parent.parent == run_dir / "wandb" / "wandb", files
    assert not list((run_dir / SWIFT_DIR).rglob("*.wandb"))
    sweep = run_dir.parent
    for doc in ("docs/cluster.md", "docs/wandb.md"):
        lines = [ln for ln in (ROOT / doc).read_text().splitlines() if ln.startswith("wandb sync ")]
        assert lines, doc
        for line in lines:
            globs = [re.sub(r"^outputs/multirun/[^/]+/", "", g) for g in line.split()[2:]]
            found = {p for g in globs for p in sweep.glob(g)}
            assert found == {files[0].parent}, (doc, line, found)

    def located(root):
        return [Path(r.path_str) for r in group_attempts([OfflineRun(f) for f in find_offline_runs(root)], root)]

    assert located(sweep) == [run_dir]
    old = tmp_path / "old_sweep" / "point"  # the layout before: <run>/swift/wandb/offline-run-*
    shutil.copytree(files[0].parent, old / SWIFT_DIR / "wandb" / files[0].parent.name)
    shutil.copy(run_dir / "summary.json", old / "summary.json")
    assert located(old.parent) == [old]


def test_megatron_param_grad_turns_recompute_off_or_is_refused(tmp_path):
    """gkd-train's Megatron argv: with the check on and ``backend.recompute_granularity`` null, ms-swift's
    default (``selective``) is replaced by ``--recompute_granularity none``; off, nothing is passed; an explicit
    ``selective`` with the check is refused in one line naming both keys (exit 2 from the CLI)."""
    from gkd_harness.harness.config.schema import ConfigError
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import dry_run

    def argv(*overrides):
        cfg, run_dir = point_config(["backend=megatron", "run.dataset=x.jsonl", *overrides], run_dir=tmp_path)
        return dry_run(cfg, run_dir)

    on = argv("monitor.spot_check.every_n_steps=1", "monitor.spot_check.param_grad=true")
    assert re.search(r"--recompute_granularity\s+none\b", on), on
    assert "--recompute_granularity" not in argv("monitor.spot_check.param_grad=false")
    with pytest.raises(ConfigError, match=r"backend\.recompute_granularity.*monitor\.spot_check\.param_grad"):
        argv(
            "monitor.spot_check.every_n_steps=1",
            "monitor.spot_check.param_grad=true",
            "backend.recompute_granularity=selective",
        )


def test_megatron_param_grad_turns_gradient_accumulation_fusion_off_or_is_refused(tmp_path):
    """With the check on, gkd-train passes ``--gradient_accumulation_fusion false`` (ms-swift turns the fusion on
    wherever apex imports, and its fused backward writes main_grad); ``--gradient_accumulation_fusion true`` in
    run.extra_args with the check is refused in one line naming the key and the flag; off, nothing is passed."""
    from gkd_harness.harness.config.schema import ConfigError
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import dry_run

    def argv(*overrides):
        cfg, run_dir = point_config(["backend=megatron", "run.dataset=x.jsonl", *overrides], run_dir=tmp_path)
        return dry_run(cfg, run_dir)

    on = ("monitor.spot_check.every_n_steps=1", "monitor.spot_check.param_grad=true")
    assert re.search(r"--gradient_accumulation_fusion\s+false\b", argv(*on))
    assert "--gradient_accumulation_fusion" not in argv("monitor.spot_check.param_grad=false")
    for extra in ("[--gradient_accumulation_fusion,true]", "['--gradient_accumulation_fusion=true']"):
        with pytest.raises(
            ConfigError,
            match=r"^monitor\.spot_check\.param_grad: .*--gradient_accumulation_fusion "
            r"true .*main_grad",
        ):
            argv(*on, f"run.extra_args={extra}")
    argv(*on, "run.extra_args=[--gradient_accumulation_fusion,false]")  # explicitly off: accepted


@pytest.mark.parametrize("where", ["args", "model config"])
def test_megatron_param_grad_is_refused_at_train_begin_where_the_backward_writes_main_grad(where):
    """On the rank: ms-swift's resolved args (or a model chunk's config) with gradient_accumulation_fusion on stop
    the check before it runs, naming the flag to turn off."""
    from gkd_harness.harness.rank.callbacks import ParamGradRefusedError, _megatron_params

    model = torch.nn.Linear(4, 4)
    model.config = SimpleNamespace(gradient_accumulation_fusion=where == "model config")
    trainer = SimpleNamespace(
        args=SimpleNamespace(recompute_granularity=None, gradient_accumulation_fusion=where == "args"),
        unwrapped_models=[model],
    )
    with pytest.raises(ParamGradRefusedError, match="pass --gradient_accumulation_fusion false"):
        _megatron_params(trainer)
    model.config.gradient_accumulation_fusion = trainer.args.gradient_accumulation_fusion = False
    assert _megatron_params(trainer)() == [model.weight, model.bias]
