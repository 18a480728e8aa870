"""Megatron's evaluation logs reach the harness callback as ``eval_*`` keys (``BaseMegatronTrainer.evaluate`` calls
``self.on_log(logs=eval_metrics, prefix='eval_')``): they are recognised as evaluation, so no extra ``metrics.jsonl``
record (the instrument's cumulative counters again, at the same step) is written and the training window is left
for the next training log (issue 31 item 6).

ms-swift's Megatron trainer needs Transformer Engine (no CPU build), so its logging path is taken from the installed
``swift/megatron/trainers/base.py`` itself: the methods ``on_log``, ``_log_callback``, ``evaluate``,
``_aggregated_metrics`` and ``compute_eval_metrics`` are compiled from that file's source, unchanged, onto a stand-in
trainer with what they read (one evaluation step whose forward returns a loss, as ``forward_step`` does)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.harness.rank.test_plugin import settings

PROBE = r"""
import ast, importlib, importlib.util, json, sys
from types import SimpleNamespace

spec = importlib.util.find_spec("mcore_bridge")  # its package __init__ imports transformer_engine: skipped
pkg = importlib.util.module_from_spec(spec)
sys.modules["mcore_bridge"] = pkg
importlib.import_module("mcore_bridge.patcher").apply_patch = lambda: None
spec.loader.exec_module(pkg)

import torch
from swift.dataset import RowPreprocessor
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.rank import plugin

torch.cuda.current_device = lambda: "cpu"  # _aggregated_metrics puts its sums on the current CUDA device
base = importlib.util.find_spec("swift.megatron.trainers").submodule_search_locations[0] + "/base.py"
tree = ast.parse(open(base).read())
cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BaseMegatronTrainer")
wanted = {"on_log", "_log_callback", "evaluate", "_aggregated_metrics", "compute_eval_metrics", "call_event"}
methods = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in wanted]
assert {f.name for f in methods} == wanted, [f.name for f in methods]
module = ast.Module(body=[ast.ClassDef(name="Real", bases=[], keywords=[], body=methods, decorator_list=[])],
                    type_ignores=[])
ns = {"torch": torch, "RowPreprocessor": RowPreprocessor, "mpu": SimpleNamespace(is_pipeline_last_stage=lambda: True)}
eval_loss = torch.tensor(0.75)
ns["get_forward_backward_func"] = lambda: (lambda **kw: [{"loss": eval_loss}])
exec(compile(ast.fix_missing_locations(module), base, "exec"), ns)

settings = plugin.load_settings()
state = plugin.install(settings)
from swift.megatron.callbacks import megatron_callbacks_map

trainer = ns["Real"]()
trainer.args = SimpleNamespace(output_dir=settings.run_dir, recompute_granularity=None, eval_iters=1,
                               num_microbatches=1, seq_length=8, micro_batch_size=1, mtp_num_layers=None,
                               dsa_indexer_loss_coeff=None)
trainer.config = SimpleNamespace(num_moe_experts=None)
trainer.state = SimpleNamespace(iteration=0)
trainer.wrapped_models, trainer.eval_metrics = [torch.nn.Linear(1, 1)], None
trainer.forward_step = None
trainer._replace_data_iterator = lambda it: it
trainer.callbacks = [megatron_callbacks_map["gkd_harness"](trainer)]
trainer.call_event("on_train_begin")
g = torch.Generator().manual_seed(0)
seen = []
orig = trainer.callbacks[0].on_log
trainer.callbacks[0].on_log = lambda logs: (seen.append(sorted(logs)), orig(logs))
for it in (1, 2):
    trainer.call_event("on_step_begin")
    s = torch.randn(2, 6, 32, generator=g) * 2
    labels = torch.randint(0, 32, (2, 6), generator=g)
    state.boundary(s, TeacherOutput(full_logits=s + 0.01 * torch.randn(2, 6, 32, generator=g), labels=labels),
                   labels, 0.5, 0.9)
    trainer.state.iteration = it
    trainer.on_log({"loss": torch.tensor(0.5), "n_steps": 1})  # the training log of this iteration
    trainer.evaluate(None)  # then ms-swift's evaluation at the same iteration (eval_steps=1)
trainer.call_event("on_train_end")
print("SEEN=" + json.dumps(seen))
"""


def test_megatron_eval_logs_write_no_extra_record(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = tmp_path / "settings.json"
    settings(run_dir, precision="fp32").write(path)
    env = dict(
        os.environ, RANK="0", WORLD_SIZE="1", WANDB_MODE="disabled", **{"GKD_HARNESS_PLUGIN_SETTINGS": str(path)}
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.split("SEEN=")[-1].splitlines()[0])
    assert ["eval_loss"] in seen  # ms-swift's own prefix reached the harness callback
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2], records  # one record per training log, none for eval_loss
    assert [r["gkd/loss_calls_total"] for r in records] == [1.0, 2.0]
    assert all(r["gkd/loss_calls"] == 1.0 if "gkd/loss_calls" in r else True for r in records)
    assert records[1]["gkd/jsd_loss"] is not None  # the eval log did not consume the second training window
