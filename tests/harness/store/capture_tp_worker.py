"""torchrun worker: one instrumented GKD loss call per case at Megatron TP=2 on 2 gloo CPU ranks, captures on.

Started by ``tests/harness/store/test_captures_tp.py`` as::

    python -m torch.distributed.run --nproc-per-node 2 tests/harness/store/capture_tp_worker.py IN OUT

``IN`` is a ``torch.save`` file ``{"inputs": {student [B,S,V], teacher [B,S,V], labels [B,S]}, "cases": [...]}``.
Each rank holds its vocabulary shard (rank r: ids ``[r·V/2, (r+1)·V/2)``, as Megatron's vocab-parallel output
layer), the top-k teacher comes from ms-swift's ``vocab_parallel_topk`` on the teacher shard (the trainer's
local-teacher path), and the call goes through ``gkd_harness.harness.rank.instrument.LossInstrument`` with the functions
ms-swift's Megatron GKD trainer passes (``tp_gather_topk``, ``vocab_parallel_log_softmax``,
``vocab_parallel_kl_div``). Spot check every step, captures to ``OUT/<case>/captures``. Every rank writes
``OUT/rank{R}.pt``: per case the logged ``spot/*`` values (ms-swift's ``compute_custom_metrics``) and the teacher's
global top-k. The captures are written when the process exits (the writer's ``atexit`` close), as in a run that
ends without the trainer's train-end callback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from tests.harness.loss.parallel_gkd_worker import serve  # the repository root on PYTHONPATH


def run_case(case: dict, inp: dict, fns, out_dir: Path) -> dict:
    from megatron.core import parallel_state as ps
    from swift.rlhf_trainers.gkd_loss import TeacherOutput
    from swift.trainers.mixin import SwiftMixin

    from gkd_harness.harness.losses import make_gkd_loss_terms
    from gkd_harness.harness.rank.instrument import LossInstrument, build_metrics

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    student, teacher, labels = inp["student"], inp["teacher"], inp["labels"]
    part = student.shape[-1] // size
    shard = slice(rank * part, (rank + 1) * part)
    out = {}
    if case["teacher"] == "topk":
        vals, ids = fns.vocab_parallel_topk(teacher[..., shard].contiguous(), k=case["topk"])
        t_out = TeacherOutput(topk_logprobs=vals, topk_indices=ids, labels=labels.clone())
        out.update(topk_vals=vals, topk_ids=ids)
    else:
        t_out = TeacherOutput(full_logits=teacher[..., shard].contiguous(), labels=labels.clone())
    inst = LossInstrument(
        make_gkd_loss_terms(case["precision"], case["beta_form"]),
        make_gkd_loss_terms("fp64", case["beta_form"]),
        build_metrics(),
        spot_every=1,
        capture_dir=str(out_dir / case["name"] / "captures"),
        rank=dist.get_rank(),
        meta={"precision": case["precision"], "beta_form": case["beta_form"]},
    )
    s = student[..., shard].contiguous().requires_grad_(True)
    total, n = inst(
        s,
        t_out,
        labels,
        case["beta"],
        case["temperature"],
        gather_fn=fns.tp_gather_topk,
        log_softmax_fn=fns.vocab_parallel_log_softmax,
        kl_div_fn=fns.vocab_parallel_kl_div,
    )
    out.update(total=total.detach(), n=int(n), logs=SwiftMixin.compute_custom_metrics(inst.metrics))
    return out


def main(in_path: str, out_dir: str) -> None:
    serve(
        in_path,
        out_dir,
        [
            (
                None,
                dict(tensor_model_parallel_size=2),
                lambda case, spec, fns: run_case(case, spec["inputs"], fns, Path(out_dir)),
            )
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {Path(sys.argv[0]).name} IN.pt OUT_DIR")
    main(sys.argv[1], sys.argv[2])
