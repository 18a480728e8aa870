"""torchrun worker: the patched GKD loss under Megatron tensor / context parallelism on 2 gloo CPU ranks.

Started by ``tests/harness/loss/test_losses_parallel.py`` as::

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/harness/loss/parallel_gkd_worker.py IN OUT

``IN`` is a ``torch.save`` file ``{"inputs": {name: {...tensors...}}, "cases": [case dict, ...]}`` written by the
test; every rank writes ``OUT/rank{R}.pt`` with one result dict per case name. The worker only *runs* the loss;
all comparisons against the FP64 reference happen in the test process.

The loss is called exactly as ms-swift's Megatron GKD trainer calls ``gkd_loss``
(``swift/megatron/trainers/gkd_trainer.py``: ``gather_fn=tp_gather_topk, log_softmax_fn=vocab_parallel_log_softmax,
kl_div_fn=vocab_parallel_kl_div``), with ms-swift's own functions:

* TP=1 (layout ``tp1``, 2 data-parallel ranks computing the same call): the same functions at TP=1, where they are
  ``F.log_softmax`` and the textbook KL (distinct objects from ms-swift's default primitives).
* TP=2: student and teacher logits are split along the vocabulary (rank r holds ids ``[r·V/2, (r+1)·V/2)``, as
  Megatron's vocab-parallel output layer does); top-k teachers come from ``vocab_parallel_topk`` on the teacher
  shard, as the trainer's local-teacher path does.
* CP=2: student logits and labels are split along the sequence with ``split_cp_inputs`` (zigzag), the teacher
  with ms-swift's ``cp_slice_teacher_output`` (the teacher-API path); the local sums go through ``cp_reduce`` (the
  Megatron/Ray GKD loss's CP reduction).
* CP=2 instrumented (layout ``cpi``): the same slices through ``gkd_harness.harness.rank.instrument.LossInstrument`` (one loss call
  per CP rank, as the Megatron trainer makes them), its metrics computed with ms-swift's own
  ``SwiftMixin.compute_custom_metrics`` (the logging-step reduction), next to ``cp_reduce`` of the call's total.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist


def import_megatron_gkd_fns() -> SimpleNamespace:
    """ms-swift's Megatron GKD functions (``gkd_utils``, ``vocab_parallel_utils``) and mcore-bridge's CP split.

    ``swift.megatron.trainers.gkd_utils`` does ``from mcore_bridge import split_cp_inputs``, and the
    ``mcore_bridge`` package ``__init__`` unconditionally applies Transformer Engine patches
    (``import transformer_engine``), which has no CPU build. Where Transformer Engine is missing, the real
    ``mcore_bridge`` package is registered *without running its patcher* (its ``__path__`` points at the installed
    package, so ``mcore_bridge.utils.megatron_utils.split_cp_inputs`` is the installed code, unchanged). Nothing
    under test is replaced: the gkd_utils / vocab_parallel_utils functions are ms-swift's own.
    """
    if importlib.util.find_spec("transformer_engine") is None and "mcore_bridge" not in sys.modules:
        spec = importlib.util.find_spec("mcore_bridge")
        if spec is None:
            raise ModuleNotFoundError("mcore-bridge is not installed (pip install mcore-bridge)")
        pkg = types.ModuleType("mcore_bridge")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__file__ = spec.origin
        sys.modules["mcore_bridge"] = pkg
        pkg.split_cp_inputs = importlib.import_module("mcore_bridge.utils.megatron_utils").split_cp_inputs
    from mcore_bridge import split_cp_inputs
    from swift.megatron.trainers.gkd_utils import (
        cp_reduce,
        cp_slice_teacher_output,
        tp_gather_topk,
        vocab_parallel_topk,
    )
    from swift.megatron.trainers.vocab_parallel_utils import vocab_parallel_kl_div, vocab_parallel_log_softmax

    return SimpleNamespace(
        cp_reduce=cp_reduce,
        cp_slice_teacher_output=cp_slice_teacher_output,
        tp_gather_topk=tp_gather_topk,
        vocab_parallel_topk=vocab_parallel_topk,
        vocab_parallel_kl_div=vocab_parallel_kl_div,
        vocab_parallel_log_softmax=vocab_parallel_log_softmax,
        split_cp_inputs=split_cp_inputs,
    )


def _loss_kwargs(fns, case) -> dict:
    """The injected functions exactly as ``MegatronGKDTrainer.loss_func`` passes them."""
    return dict(
        gather_fn=fns.tp_gather_topk,
        log_softmax_fn=fns.vocab_parallel_log_softmax,
        kl_div_fn=fns.vocab_parallel_kl_div,
        chunk_size=case["chunk_size"],
    )


def run_tp_case(case: dict, inp: dict, fns) -> dict:
    """One case at TP=2: this rank's vocab shard of ``[B, S, V]`` student/teacher logits.

    Returns (per rank): ``total``, ``n``, ``grad`` (d(total/n)/d student shard, ``[B, S, V/2]``), the
    ``make_gkd_loss_terms`` outputs and, for top-k, the teacher's global top-k values/ids.
    """
    from megatron.core import parallel_state as ps
    from swift.rlhf_trainers.gkd_loss import TeacherOutput
    from swift.rlhf_trainers.gkd_loss import gkd_loss as upstream_gkd_loss

    from gkd_harness.harness.losses import make_gkd_loss, make_gkd_loss_terms

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    student, teacher, labels = inp["student"], inp["teacher"], inp["labels"]
    vocab = student.shape[-1]
    assert vocab % size == 0 and teacher.shape[-1] % size == 0, f"vocab {vocab} not divisible by TP size {size}"
    part, t_part = vocab // size, teacher.shape[-1] // size  # unequal widths: each side sharded by its own width
    shard = slice(rank * part, (rank + 1) * part)
    t_shard = teacher[..., rank * t_part : (rank + 1) * t_part].contiguous()
    out = {}
    if case["teacher"] == "topk":
        vals, ids = fns.vocab_parallel_topk(t_shard, k=case["topk"])
        t_out = TeacherOutput(topk_logprobs=vals, topk_indices=ids, labels=labels.clone())
        out.update(topk_vals=vals, topk_ids=ids)
    else:
        t_out = TeacherOutput(full_logits=t_shard, labels=labels.clone())
    kwargs = _loss_kwargs(fns, case)
    args = (case["beta"], case["temperature"])

    s = student[..., shard].contiguous().requires_grad_(True)
    total, n = make_gkd_loss(case["precision"], case["beta_form"])(s, t_out, labels, *args, **kwargs)
    (grad,) = torch.autograd.grad(total / n, s)
    out.update(total=total.detach(), n=int(n), grad=grad, loss_dtype=str(total.dtype))

    s2 = student[..., shard].contiguous().requires_grad_(True)
    terms = make_gkd_loss_terms(case["precision"], case["beta_form"])(s2, t_out, labels, *args, **kwargs)
    (grad_terms,) = torch.autograd.grad(terms.total / terms.num_valid, s2)
    out.update(
        terms_total=terms.total.detach(),
        terms_n=int(terms.num_valid),
        per_position=terms.per_position.detach(),
        grad_terms=grad_terms,
    )

    if case["precision"] == "native":
        s3 = student[..., shard].contiguous().requires_grad_(True)
        up_total, up_n = upstream_gkd_loss(s3, t_out, labels, *args, **kwargs)
        (up_grad,) = torch.autograd.grad(up_total / up_n, s3)
        out.update(upstream_total=up_total.detach(), upstream_grad=up_grad)
    return out


def run_cp_case(case: dict, inp: dict, fns) -> dict:
    """One case at CP=2: this rank's zigzag sequence slice, reduced with ms-swift's ``cp_reduce``.

    Returns (per rank): ``positions`` (``[B, S/2]`` global sequence index of each local column), local ``total``
    and ``n`` (the Megatron trainer's per-shard values), ``cp_loss`` (``cp_reduce`` output = global mean),
    ``grad`` (d cp_loss / d local student slice, ``[B, S/2, V]``), ``per_position``, top-k values/ids.
    """
    from megatron.core import parallel_state as ps
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    from gkd_harness.harness.losses import make_gkd_loss, make_gkd_loss_terms

    size = ps.get_context_parallel_world_size()
    student, teacher, labels = inp["student"], inp["teacher"], inp["labels"]
    bsz, seq = labels.shape
    out = {}
    if case["teacher"] == "topk":
        vals, ids = fns.vocab_parallel_topk(teacher, k=case["topk"])  # TP=1 here: a plain torch.topk
        t_full = TeacherOutput(topk_logprobs=vals, topk_indices=ids, labels=labels.clone())
        out.update(topk_vals=vals, topk_ids=ids)
    else:
        t_full = TeacherOutput(full_logits=teacher, labels=labels.clone())
    t_out = fns.cp_slice_teacher_output(t_full, None, "zigzag")
    split = lambda x: fns.split_cp_inputs(x, None, 1)  # noqa: E731
    positions = split(torch.arange(seq).expand(bsz, seq).contiguous())
    labels_loc = split(labels)
    kwargs = _loss_kwargs(fns, case)
    args = (case["beta"], case["temperature"])

    s = split(student).contiguous().requires_grad_(True)
    total, n = make_gkd_loss(case["precision"], case["beta_form"])(s, t_out, labels_loc, *args, **kwargs)
    out.update(positions=positions, total=total.detach().clone(), n=int(n), loss_dtype=str(total.dtype))
    cp_loss = fns.cp_reduce(total, n, cp_size=size)
    (grad,) = torch.autograd.grad(cp_loss, s)
    out.update(cp_loss=cp_loss.detach(), grad=grad)

    s2 = split(student).contiguous().requires_grad_(True)
    terms = make_gkd_loss_terms(case["precision"], case["beta_form"])(s2, t_out, labels_loc, *args, **kwargs)
    out.update(terms_total=terms.total.detach(), terms_n=int(terms.num_valid), per_position=terms.per_position.detach())
    return out


def run_cp_instrument_case(case: dict, inp: dict, fns) -> dict:
    """One training step's loss call at CP=2 through the instrument; returns (per rank) the logged metrics
    (``logs``), the local ``total`` / ``n`` of this shard and ``cp_loss`` (``cp_reduce`` of the call's output)."""
    from megatron.core import parallel_state as ps
    from swift.rlhf_trainers.gkd_loss import TeacherOutput
    from swift.trainers.mixin import SwiftMixin

    from gkd_harness.harness.losses import make_gkd_loss_terms
    from gkd_harness.harness.rank.instrument import LossInstrument, build_metrics

    size = ps.get_context_parallel_world_size()
    student, teacher, labels = inp["student"], inp["teacher"], inp["labels"]
    t_out = fns.cp_slice_teacher_output(TeacherOutput(full_logits=teacher, labels=labels.clone()), None, "zigzag")
    split = lambda x: fns.split_cp_inputs(x, None, 1)  # noqa: E731
    inst = LossInstrument(
        make_gkd_loss_terms(case["precision"], case["beta_form"]),
        make_gkd_loss_terms("fp64", case["beta_form"]),
        build_metrics(),
    )
    s = split(student).contiguous().requires_grad_(True)
    total, n = inst(s, t_out, split(labels), case["beta"], case["temperature"], **_loss_kwargs(fns, case))
    local_total, local_n = total.detach().clone(), int(n)
    cp_loss = fns.cp_reduce(total.detach().clone(), n, cp_size=size)
    logs = SwiftMixin.compute_custom_metrics(inst.metrics)
    return dict(logs=logs, total=local_total, n=local_n, cp_loss=cp_loss, device=str(inst.where.device))


def serve(in_path: str, out_dir: str, layouts) -> None:
    """The body every 2-rank gloo worker of the suite shares.

    Joins the gloo group (one thread), imports ms-swift's Megatron GKD functions, loads the test's spec
    (``{"cases": [...], "inputs": ...}``) and, for each ``(layout, parallel sizes, run)`` of ``layouts``, runs
    ``run(case, spec, fns)`` for the spec's cases of that layout (``layout`` None: every case) under
    ``initialize_model_parallel(**sizes)``. Saves ``{case name: result}`` as ``OUT_DIR/rank<r>.pt``.
    """
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    torch.set_num_threads(1)
    from megatron.core import parallel_state as ps

    fns = import_megatron_gkd_fns()
    spec = torch.load(in_path, weights_only=True)
    results = {}
    for layout, sizes, run in layouts:
        cases = [c for c in spec["cases"] if layout is None or c["layout"] == layout]
        if not cases:
            continue
        ps.initialize_model_parallel(**sizes)
        for case in cases:
            results[case["name"]] = run(case, spec, fns)
        ps.destroy_model_parallel()
    torch.save(results, Path(out_dir) / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


def main(in_path: str, out_dir: str) -> None:
    def on_inputs(runner):
        return lambda case, spec, fns: runner(case, spec["inputs"][case["inputs"]], fns)

    serve(
        in_path,
        out_dir,
        (
            ("tp1", dict(tensor_model_parallel_size=1), on_inputs(run_tp_case)),
            ("tp", dict(tensor_model_parallel_size=2), on_inputs(run_tp_case)),
            ("cp", dict(context_parallel_size=2), on_inputs(run_cp_case)),
            ("cpi", dict(context_parallel_size=2), on_inputs(run_cp_instrument_case)),
        ),
    )


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {os.path.basename(sys.argv[0])} IN.pt OUT_DIR")
    main(sys.argv[1], sys.argv[2])
