"""torchrun worker: the held-out evaluation (``gkd_harness.harness.rank.evaluation.EvalTap``) under Megatron parallelism on 2 gloo
CPU ranks. Started by ``tests/harness/rank/test_evaluation_parallel.py`` as::

    python -m torch.distributed.run --nproc-per-node 2 tests/harness/rank/eval_parallel_worker.py IN OUT

``IN`` is a ``torch.save`` file ``{"inputs": {student, teacher, labels}, "cases": [case dict, ...]}``; every rank
writes ``OUT/rank{R}.pt``: ``{case name: {"metrics": the eval/* dict of EvalTap.finish(), "topk": the teacher's
top-k (values, ids) [B, S, k] handed to the tap, top-k cases only}}``. The worker only *runs* the tap;
the FP64 full-vocabulary reference is computed in the test process.

The tap is called as ms-swift's Megatron GKD trainer calls ``gkd_loss`` in its evaluation loop (under
``torch.no_grad``, with ``gather_fn=tp_gather_topk, log_softmax_fn=vocab_parallel_log_softmax,
kl_div_fn=vocab_parallel_kl_div``, ms-swift's own functions), one call per micro-batch row, then ``finish()`` on
every rank (``on_eval_end``):

* ``tp`` (TP=2): rank r holds vocabulary ids ``[r·V/2, (r+1)·V/2)`` of the student and teacher logits, as
  Megatron's vocab-parallel output layer gives them; a top-k teacher comes from ``vocab_parallel_topk`` on the
  teacher shard (the trainer's local-teacher path). Both ranks see every row.
* ``dp`` (TP=1, 2 data-parallel ranks): rank r evaluates rows ``r::2`` of the batch, full vocabulary.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def _teacher_output(case, teacher, labels, fns):
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    if case.get("topk"):
        vals, ids = fns.vocab_parallel_topk(teacher, k=case["topk"])
        return TeacherOutput(topk_logprobs=vals, topk_indices=ids, labels=labels.clone())
    return TeacherOutput(full_logits=teacher, labels=labels.clone())


def run_case(case: dict, inp: dict, fns, layout: str) -> dict:
    from megatron.core import parallel_state as ps

    from gkd_harness.harness.losses import make_gkd_loss
    from gkd_harness.harness.rank.evaluation import EvalTap

    student, teacher, labels = inp["student"], inp["teacher"], inp["labels"]
    rows = range(student.shape[0])
    if layout == "tp":
        size, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        part = student.shape[-1] // size
        shard = slice(rank * part, (rank + 1) * part)
        student, teacher = student[..., shard].contiguous(), teacher[..., shard].contiguous()
    else:
        rows = range(dist.get_rank(), student.shape[0], dist.get_world_size())
    kwargs = dict(
        gather_fn=fns.tp_gather_topk, log_softmax_fn=fns.vocab_parallel_log_softmax, kl_div_fn=fns.vocab_parallel_kl_div
    )
    tap = EvalTap(None, make_gkd_loss(case["precision"], case["beta_form"]), case["beta_form"])
    topk = []
    with torch.no_grad():
        for b in rows:
            t_out = _teacher_output(case, teacher[b : b + 1], labels[b : b + 1], fns)
            tap(student[b : b + 1], t_out, labels[b : b + 1], case["beta"], case["temperature"], **kwargs)
            if t_out.is_topk_mode:
                topk.append((t_out.topk_logprobs, t_out.topk_indices))
    out = {"metrics": tap.finish()}
    if topk:
        out["topk"] = (torch.cat([v for v, _ in topk]), torch.cat([i for _, i in topk]))
    return out


def main(in_path: str, out_dir: str) -> None:
    from tests.harness.loss.parallel_gkd_worker import serve

    serve(
        in_path,
        out_dir,
        [
            (
                layout,
                dict(tensor_model_parallel_size=tp),
                lambda case, spec, fns, layout=layout: run_case(case, spec["inputs"], fns, layout),
            )
            for layout, tp in (("tp", 2), ("dp", 1))
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {os.path.basename(sys.argv[0])} IN.pt OUT_DIR")
    main(sys.argv[1], sys.argv[2])
