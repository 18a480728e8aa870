"""torchrun worker: one held-out evaluation through the harness's real Megatron callback on 2 gloo CPU ranks at TP=2.

Started by ``tests/harness/rank/test_evaluation_parallel.py`` as::

    python -m torch.distributed.run --nproc-per-node 2 tests/harness/rank/eval_megatron_callback_worker.py IN

with ``$GKD_HARNESS_PLUGIN_SETTINGS`` naming the plugin settings gkd-train writes (held-out evaluation on). The plugin
is installed as ms-swift's ``--external_plugins`` installs it; ms-swift's Megatron trainer needs Transformer Engine
(no CPU build), so a namespace stands in for it with what the callbacks read and ``BaseMegatronTrainer``'s own
``evaluate`` sequence: ``call_event('on_eval_begin')``, the loss calls of the evaluation under ``torch.no_grad`` (the
logits sharded along the vocabulary, ms-swift's vocab-parallel functions as ``MegatronGKDTrainer.loss_func`` passes
them), then ``call_event('on_eval_end')``; ``on_log`` pops ``n_steps`` and calls every callback's ``on_log`` as
``BaseMegatronTrainer.on_log`` does. The last rank writes the run folder's ``metrics.jsonl``; the test reads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from datetime import timedelta
from types import SimpleNamespace

# Import-only stand-in for Transformer Engine's absence (as test_plugin.MEGATRON_LOG_PROBE): mcore_bridge's package
# __init__ runs its patcher, which imports transformer_engine. The real package is loaded with that call skipped.
spec = importlib.util.find_spec("mcore_bridge")
pkg = importlib.util.module_from_spec(spec)
sys.modules["mcore_bridge"] = pkg
importlib.import_module("mcore_bridge.patcher").apply_patch = lambda: None
spec.loader.exec_module(pkg)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main(in_path: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    torch.set_num_threads(1)
    from megatron.core import parallel_state as ps
    from swift.megatron.trainers.gkd_utils import tp_gather_topk
    from swift.megatron.trainers.vocab_parallel_utils import vocab_parallel_kl_div, vocab_parallel_log_softmax
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    from gkd_harness.harness.rank import plugin

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    state = plugin.install(plugin.load_settings())
    from swift.megatron.callbacks import megatron_callbacks_map

    inp = torch.load(in_path, weights_only=True)
    trainer = SimpleNamespace(
        args=SimpleNamespace(output_dir=state.settings.run_dir, recompute_granularity=None),
        state=SimpleNamespace(iteration=0),
    )
    callbacks = [megatron_callbacks_map["gkd_harness"](trainer)]

    def on_log(logs, prefix=""):
        logs.pop("n_steps")
        for cb in callbacks:
            cb.on_log(logs={f"{prefix}{k}": v for k, v in logs.items()})

    trainer.on_log = on_log
    for cb in callbacks:
        cb.on_train_begin()
    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    part = inp["student"].shape[-1] // size
    shard = slice(rank * part, (rank + 1) * part)
    student, teacher, labels = inp["student"][..., shard], inp["teacher"][..., shard], inp["labels"]
    trainer.state.iteration = inp["iteration"]
    for cb in callbacks:
        cb.on_eval_begin()
    with torch.no_grad():
        for b in range(student.shape[0]):  # one micro-batch per row
            state.boundary(
                student[b : b + 1].contiguous(),
                TeacherOutput(full_logits=teacher[b : b + 1].contiguous(), labels=labels[b : b + 1].clone()),
                labels[b : b + 1],
                inp["beta"],
                inp["temperature"],
                gather_fn=tp_gather_topk,
                log_softmax_fn=vocab_parallel_log_softmax,
                kl_div_fn=vocab_parallel_kl_div,
            )
    for cb in callbacks:
        cb.on_eval_end()
    for cb in callbacks:
        cb.on_train_end()
    ps.destroy_model_parallel()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
