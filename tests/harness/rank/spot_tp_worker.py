"""torchrun worker: the instrument's FP64 spot check of one full-vocabulary loss call at Megatron TP=2 on 2 gloo
CPU ranks (ms-swift's real vocab-parallel functions), for ``tests/harness/rank/test_spot_check_tp.py``::

    python -m torch.distributed.run --nproc-per-node 2 tests/harness/rank/spot_tp_worker.py IN OUT

Each rank holds its vocabulary shard (rank r: ids ``[r·V/2, (r+1)·V/2)``). The run's variant is the FP64 loss on a
teacher perturbed by ``0.5 sin(7 t)`` on shard 0 only against the FP64 loss: a gradient error known to FP64 rounding,
so the logged ``spot/grad_rel_l2`` can be held to the whole vocabulary's relative L2 tightly. Every rank saves its logged
``spot/*`` values (ms-swift's ``compute_custom_metrics``, the reduction the trainer logs) as ``OUT/rank{R}.pt``.
"""

from __future__ import annotations

import sys

from tests.harness.loss.parallel_gkd_worker import serve  # the repository root on PYTHONPATH


def run_case(case: dict, spec: dict, fns) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from swift.rlhf_trainers.gkd_loss import TeacherOutput
    from swift.trainers.mixin import SwiftMixin

    from gkd_harness.harness.losses import make_gkd_loss_terms
    from gkd_harness.harness.rank.instrument import LossInstrument, build_metrics

    inp = spec["inputs"]
    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    student, teacher, labels = inp["student"], inp["teacher"], inp["labels"]
    part = student.shape[-1] // size
    shard = slice(rank * part, (rank + 1) * part)
    fp64 = make_gkd_loss_terms("fp64", case["beta_form"])

    def perturbed(s, t, lab, beta, temperature, *args, **kwargs):
        if rank == 0:  # the run's teacher, wrong on shard 0 only (element-wise, so any rows the check takes)
            t = TeacherOutput(full_logits=t.full_logits + 0.5 * torch.sin(7 * t.full_logits), labels=t.labels)
        return fp64(s, t, lab, beta, temperature, *args, **kwargs)

    inst = LossInstrument(perturbed, fp64, build_metrics(), spot_every=1, rank=dist.get_rank())
    s = student[..., shard].contiguous().requires_grad_(True)
    t_out = TeacherOutput(full_logits=teacher[..., shard].contiguous(), labels=labels.clone())
    inst(
        s,
        t_out,
        labels,
        case["beta"],
        case["temperature"],
        gather_fn=fns.tp_gather_topk,
        log_softmax_fn=fns.vocab_parallel_log_softmax,
        kl_div_fn=fns.vocab_parallel_kl_div,
    )
    return {"logs": SwiftMixin.compute_custom_metrics(inst.metrics)}


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], [(None, dict(tensor_model_parallel_size=2), run_case)])
