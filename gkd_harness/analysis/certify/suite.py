"""Regression tests for a GKD loss with ms-swift's ``gkd_loss`` interface, against an FP64 reference.

Written by ``gkd-certify --export-pytest`` (gkd-harness, docs/certify.md): one self-contained module that imports
only torch, pytest, the standard library and the module under test (``TARGET``); the FP64 reference, the
tolerances and the inputs are written into it. It covers the families ms-swift's GKD precision bug report asks
for: mixed FP32/BF16, β = 0 / 0.5 / 1 and interior β (0.1, 0.25, 0.75, 0.9) in the form ``FORM``, temperature ≠ 1,
top-k, the full vocabulary, empty masks, a BF16 student's gradient of ``total / num_valid``, the contract ms-swift's
callers rely on (return types, the graph of an empty partition, bit-identical repeats, no_grad / inference_mode,
exceptions reaching the caller, no global torch state or input changed by any call), and vocab-parallel primitives
on 2 gloo ranks where megatron-core is importable (skipped with that reason elsewhere). Run: ``pytest THIS_FILE``.
"""

import importlib
import importlib.util
import math
import os
import socket
import sys
import tempfile
import zlib  # noqa: F401 (the inputs' seeds)
from typing import Any, Dict, List, Optional  # noqa: F401

import pytest
import torch

TARGET = "swift.rlhf_trainers.gkd_loss"  # EXPORT: target
FORM = "paper"  # EXPORT: form

# EXPORT: inline gkd_harness.harness.loss.reference
from gkd_harness.harness.loss.reference import reference_gkd  # noqa: E402

# EXPORT: inline gkd_harness.harness.loss.tolerances
from gkd_harness.harness.loss.tolerances import ONE_ROUNDING_GRAD_FACTOR, grad_tol, loss_tol  # noqa: E402


def _load_target():
    if TARGET.endswith(".py"):
        spec = importlib.util.spec_from_file_location("gkd_loss_under_test", TARGET)
        if spec is None or spec.loader is None:
            raise ImportError(f"{TARGET}: cannot be loaded as a module")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(TARGET)


target = _load_target()
TeacherOutput = target.TeacherOutput

# EXPORT: inline gkd_harness.analysis.certify.cases:DTYPES,seed_of,problem
from gkd_harness.analysis.certify.cases import DTYPES, problem, seed_of  # noqa: E402,F401

# EXPORT: inline gkd_harness.analysis.certify.evaluate:torch_state,_equal_state
from gkd_harness.analysis.certify.evaluate import _equal_state, torch_state  # noqa: E402


# ------------------------------------------------------------------------------------------------ judging
def _copy(t):
    return t.clone() if torch.is_tensor(t) else t


def call(student, teacher, labels, beta, temperature, **kwargs):
    """``target.gkd_loss`` once; asserts that it left the global torch state (default dtype, RNG, grad mode,
    deterministic flags) as it found it and wrote into no input, not even one it restored (the version counter)."""
    fields = ("full_logits", "topk_logprobs", "topk_indices", "labels")
    tensors = {"student_logits": student, "labels": labels}
    tensors.update({f"teacher_output.{f}": getattr(teacher, f) for f in fields if torch.is_tensor(getattr(teacher, f))})
    versions = {k: v._version for k, v in tensors.items()}
    torch.rand(())  # the RNG moves on between calls, so a reseed to any seed shows
    before = torch_state()
    out = target.gkd_loss(student, teacher, labels, beta, temperature, **kwargs)
    after = torch_state()
    changed = [k for k in before if not _equal_state(before[k], after.get(k))]
    assert not changed, f"gkd_loss changed global torch state: {changed}"
    moved = [k for k, v in tensors.items() if v._version != versions[k]]
    assert not moved, f"gkd_loss wrote into {moved} in place"
    assert isinstance(out, (tuple, list)) and len(out) == 2, f"gkd_loss returned {type(out).__name__}"
    return out


def run(student, teacher, labels, beta, temperature, **kwargs):
    """``(total, num_valid, grad of total / num_valid)`` of the target on copies of the inputs; asserts that the
    caller's tensors are unchanged."""
    fields = ("full_logits", "topk_logprobs", "topk_indices", "labels")
    t_copy = TeacherOutput(**{f: _copy(getattr(teacher, f)) for f in fields})
    s = student.detach().clone().requires_grad_(True)
    lab = labels.clone()
    total, num_valid = call(s, t_copy, lab, beta, temperature, **kwargs)
    n = int(num_valid)
    loss = total / n if n else total * 0
    if loss.requires_grad:
        loss.backward()
    for f in fields:
        a, b = getattr(t_copy, f), getattr(teacher, f)
        if torch.is_tensor(b):
            assert torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all()), (
                f"gkd_loss wrote into teacher_output.{f}"
            )
    assert torch.equal(s.detach(), student) and torch.equal(lab, labels), "gkd_loss wrote into its inputs"
    return total.detach(), n, (s.grad if s.grad is not None else torch.zeros_like(s))


def check(student, teacher, labels, beta, temperature, form=FORM, ref=None, factor=None, **kwargs):
    """The target against the FP64 reference: num_valid equal, |Δtotal| ≤ loss_tol, gradient rel-L2 ≤ grad_tol."""
    total, n, grad = run(student, teacher, labels, beta, temperature, **kwargs)
    ref_total, ref_n, ref_grad = reference_gkd(student, labels, beta, temperature, form, **ref)
    assert n == ref_n, f"num_valid {n}, expected {ref_n}"
    value = float(total.double())
    assert math.isfinite(value) and bool(torch.isfinite(grad).all()), f"non-finite total {value} or gradient"
    tol = loss_tol(ref_total, ref_n)
    assert abs(value - ref_total) <= tol, (
        f"total {value:.9g} vs FP64 {ref_total:.9g} ({abs(value - ref_total) / tol:.3g}x tol)"
    )
    norm = float(ref_grad.norm())
    if norm > 0:
        rel = float((grad.double() - ref_grad).norm()) / norm
        gtol = grad_tol(ref_grad, student.dtype, factor)
        assert rel <= gtol, f"gradient rel-L2 {rel:.3g} ({rel / gtol:.3g}x tol)"
    else:
        assert float(grad.abs().max()) == 0


def case(key, student_dtype, teacher_dtype, mode, noise, **kw):
    s, t, lab, ref = problem(student_dtype, teacher_dtype, mode, noise, seed_of(*key), **kw)
    return s, t, lab, ref


NEAR, FAR = 0.03, 1.0
MODES = ["full", "topk"]


# ------------------------------------------------------------------------------------------------ the families
@pytest.mark.parametrize("noise", [NEAR, FAR], ids=["near-identical", "different"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("mode", MODES)
def test_mixed_fp32_student_bf16_teacher(mode, beta, noise):
    s, t, lab, ref = case(("mixed", mode, beta, noise), "fp32", "bf16", mode, noise)
    check(s, t, lab, beta, 1.0, ref=ref)


@pytest.mark.parametrize(
    "pair", [("bf16", "bf16"), ("fp32", "fp32"), ("bf16", "fp32"), ("fp64", "bf16"), ("fp64", "fp64")], ids="/".join
)
@pytest.mark.parametrize("mode", MODES)
def test_dtype_pairs(pair, mode):
    s, t, lab, ref = case(("pairs", pair, mode), pair[0], pair[1], mode, NEAR)
    check(s, t, lab, 0.5, 1.0, ref=ref)


@pytest.mark.parametrize("temperature", [0.5, 0.9, 2.0])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("mode", MODES)
def test_temperature_not_1(mode, beta, temperature):
    s, t, lab, ref = case(("temperature", mode, beta, temperature), "fp32", "bf16", mode, NEAR)
    check(s, t, lab, beta, temperature, ref=ref)


@pytest.mark.parametrize("beta", [0.1, 0.25, 0.75, 0.9])
@pytest.mark.parametrize("mode", MODES)
def test_interior_beta(mode, beta):
    """β inside (0, 1), in the form this module was written for (FORM): a β rounded to BF16 (0.1, 0.9 are not
    exact) or the other form's weights (they agree only at 0, 0.5 and 1) fail here."""
    s, t, lab, ref = case(("interior", mode, beta), "fp32", "bf16", mode, NEAR)
    check(s, t, lab, beta, 1.0, ref=ref)


@pytest.mark.parametrize("k", [1, 16, 96])
def test_topk_sizes(k):
    s, t, lab, ref = case(("topk", k), "fp32", "bf16", "topk", NEAR, topk=k)
    check(s, t, lab, 0.5, 0.9, ref=ref)


@pytest.mark.parametrize("vocabs", [(96, 104), (104, 96)], ids=["teacher-wider", "student-wider"])
def test_full_vocabulary_of_different_sizes(vocabs):
    s, t, lab, ref = case(("vocab", vocabs), "fp32", "bf16", "full", NEAR, vocab=vocabs[0], teacher_vocab=vocabs[1])
    check(s, t, lab, 0.5, 1.0, ref=ref)


@pytest.mark.parametrize("mode", MODES)
def test_empty_masks(mode):
    s, t, lab, ref = case(("empty", mode), "fp32", "bf16", mode, NEAR, masked_prefix=24)
    total, n, grad = run(s, t, lab, 0.5, 1.0)
    assert n == 0 and float(total) == 0.0 and float(grad.abs().max()) == 0.0


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_uncovered_topk_rows_are_dropped(beta):
    s, t, lab, ref = case(("uncovered", beta), "fp32", "bf16", "topk", NEAR)
    lp = t.topk_logprobs.clone()
    lp[0, 5] = float("-inf")
    lp[1, 9] = float("-inf")
    t = TeacherOutput(topk_logprobs=lp, topk_indices=t.topk_indices, labels=lab)
    check(s, t, lab, beta, 1.0, ref=dict(teacher_topk=(lp, t.topk_indices)))


@pytest.mark.parametrize("masked", [3, 9], ids=["num_valid=42", "num_valid=30"])
@pytest.mark.parametrize("mode", MODES)
def test_bf16_student_gradient_of_total_over_num_valid_is_rounded_once(mode, masked):
    """num_valid not a power of two: the BF16 gradient is within ONE_ROUNDING_GRAD_FACTOR of the FP64 gradient
    rounded once to BF16."""
    s, t, lab, ref = case(
        ("scaled", mode, masked),
        "bf16",
        "bf16",
        mode,
        NEAR,
        masked_prefix=masked,
        vocab=1024 if mode == "full" else 96,
        topk=64,
    )
    check(s, t, lab, 0.5, 0.9, ref=ref, factor=ONE_ROUNDING_GRAD_FACTOR)


# ------------------------------------------------------------------------------------------------ the contract
@pytest.mark.parametrize("masked", [3, 24], ids=["positions", "empty-partition"])
@pytest.mark.parametrize("pair", [("fp32", "bf16"), ("bf16", "bf16")], ids="/".join)
@pytest.mark.parametrize("mode", MODES)
def test_contract_return_types_and_graph(mode, pair, masked):
    """``total``: a 0-dim floating tensor at least as wide as the student's dtype, on its device, connected to the
    student's graph (an empty partition too: backward() runs on every rank); ``num_valid``: a tensor."""
    s, t, lab, _ = case(("contract", mode, pair, masked), pair[0], pair[1], mode, NEAR, masked_prefix=masked)
    x = s.detach().clone().requires_grad_(True)
    total, num_valid = call(x, t, lab.clone(), 0.5, 0.9)
    assert torch.is_tensor(total) and total.dim() == 0, f"total: {total!r}"
    assert total.is_floating_point() and torch.promote_types(total.dtype, x.dtype) == total.dtype, total.dtype
    assert total.device == x.device
    assert torch.is_tensor(num_valid), f"num_valid is a {type(num_valid).__name__}"
    assert total.requires_grad, "total is not connected to the student's graph"
    (grad,) = torch.autograd.grad(total, x, allow_unused=True)
    assert grad is not None, "total does not depend on the student logits"


@pytest.mark.parametrize("mode", MODES)
def test_contract_repeat_is_bit_identical_and_grad_modes_agree(mode):
    s, t, lab, _ = case(("repeat", mode), "fp32", "bf16", mode, NEAR)
    t1, n1, g1 = run(s, t, lab, 0.5, 0.9)
    t2, n2, g2 = run(s, t, lab, 0.5, 0.9)
    assert torch.equal(t1, t2) and n1 == n2 and torch.equal(g1, g2), "two calls on the same inputs differ"
    for ctx in (torch.no_grad, torch.inference_mode):
        x, t_c, lab_c = s.clone(), TeacherOutput(**{f: _copy(getattr(t, f)) for f in _FIELDS}), lab.clone()
        with ctx():
            total, _ = call(x, t_c, lab_c, 0.5, 0.9)
        v = float(total.double())
        assert abs(v - float(t1.double())) <= loss_tol(float(t1.double()), n1), f"under {ctx.__name__}: {v}"


_FIELDS = ("full_logits", "topk_logprobs", "topk_indices", "labels")


class _Sentinel(Exception):
    pass


def _raising(*args, **kwargs):
    raise _Sentinel("raised by an injected primitive")


def test_contract_a_label_mismatch_raises():
    s, t, lab, _ = case(("mismatch",), "fp32", "bf16", "full", NEAR)
    t_labels = lab.clone()
    t_labels[0, -1] = -100
    with pytest.raises(Exception):  # noqa: B017 - any error, as long as it reaches the caller
        call(s.clone(), TeacherOutput(full_logits=t.full_logits, labels=t_labels), lab.clone(), 0.5, 1.0)


@pytest.mark.parametrize("mode,primitive", [("full", "log_softmax_fn"), ("topk", "gather_fn")])
def test_contract_an_error_in_an_injected_primitive_reaches_the_caller(mode, primitive):
    s, t, lab, _ = case(("raising", mode), "fp32", "bf16", mode, NEAR)
    with pytest.raises(_Sentinel):
        target.gkd_loss(s.clone(), t, lab.clone(), 0.5, 1.0, **{primitive: _raising})


# ------------------------------------------------------------------------------------------------ 2 gloo ranks
def _megatron_missing():
    try:
        importlib.import_module("megatron.core.parallel_state")
    except Exception as e:  # noqa: BLE001
        return f"megatron-core is not importable ({type(e).__name__}: {e})"[:200]
    return None


class _ReduceFromTP(torch.autograd.Function):
    """Sum over the tensor-parallel group; backward identity (the consumer is replicated)."""

    @staticmethod
    def forward(ctx, x):
        from megatron.core import parallel_state as ps

        x = x.clone()
        torch.distributed.all_reduce(x, group=ps.get_tensor_model_parallel_group())
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _VocabParallelLogSoftmax(torch.autograd.Function):
    """Log-softmax of this rank's vocabulary shard over the whole vocabulary (max and Σ exp all-reduced)."""

    @staticmethod
    def forward(ctx, x):
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group()
        m = x.amax(-1)
        torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=group)
        sumexp = (x - m[..., None]).exp().sum(-1)
        torch.distributed.all_reduce(sumexp, group=group)
        out = x - m[..., None] - sumexp.log()[..., None]
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        from megatron.core import parallel_state as ps

        (out,) = ctx.saved_tensors
        total = g.sum(-1)
        torch.distributed.all_reduce(total, group=ps.get_tensor_model_parallel_group())
        return g - out.exp() * total[..., None]


def vocab_parallel_log_softmax(x):
    return _VocabParallelLogSoftmax.apply(x)


def vocab_parallel_kl_div(input_log, target_log):
    p = target_log.exp()
    return _ReduceFromTP.apply(torch.where(p > 0, p * (target_log - input_log), torch.zeros_like(p)).sum(-1))


def tp_gather(logits, indices):
    from megatron.core import parallel_state as ps

    width = logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * width
    mine = (indices >= start) & (indices < start + width)
    local = torch.gather(logits, -1, torch.where(mine, indices - start, 0))
    return _ReduceFromTP.apply(torch.where(mine, local, torch.zeros_like(local)))


def _rank_main(rank, world, port, in_path, out_path):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    inp = torch.load(in_path, weights_only=False)
    s_full, t_full, lab, beta, temperature, mode = (inp[k] for k in ("s", "t", "labels", "beta", "T", "mode"))
    width = s_full.shape[-1] // world
    sl = slice(rank * width, (rank + 1) * width)
    s = s_full[..., sl].clone().requires_grad_(True)
    if mode == "topk":
        teacher = TeacherOutput(topk_logprobs=t_full[0], topk_indices=t_full[1], labels=lab)
    else:
        teacher = TeacherOutput(full_logits=t_full[..., sl].clone(), labels=lab)
    total, num_valid = target.gkd_loss(
        s,
        teacher,
        lab.clone(),
        beta,
        temperature,
        gather_fn=tp_gather,
        log_softmax_fn=vocab_parallel_log_softmax,
        kl_div_fn=vocab_parallel_kl_div,
    )
    n = int(num_valid)
    (total / n).backward()
    torch.save({"total": total.detach(), "n": n, "grad": s.grad}, f"{out_path}.{rank}")
    ps.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("mode", MODES)
def test_vocab_parallel_primitives_on_2_gloo_ranks(mode, beta):
    """Student (and full-vocabulary teacher) logits split over 2 tensor-parallel ranks; the injected primitives
    all-reduce over the vocabulary. A loss that ignores them normalises each shard on its own."""
    missing = _megatron_missing()
    if missing:
        pytest.skip(missing)
    import torch.multiprocessing as mp

    s, t, lab, ref = case(("tp2", mode, beta), "fp32", "bf16", mode, NEAR)
    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = os.path.join(tmp, "in.pt"), os.path.join(tmp, "out.pt")
        teacher = (t.topk_logprobs, t.topk_indices) if mode == "topk" else t.full_logits
        torch.save({"s": s, "t": teacher, "labels": lab, "beta": beta, "T": 0.9, "mode": mode}, in_path)
        mp.spawn(_rank_main, args=(2, _free_port(), in_path, out_path), nprocs=2, join=True)
        outs = [torch.load(f"{out_path}.{r}", weights_only=False) for r in range(2)]
    ref_total, ref_n, ref_grad = reference_gkd(s, lab, beta, 0.9, "paper", **ref)
    assert outs[0]["n"] == ref_n
    for o in outs:
        assert abs(float(o["total"]) - ref_total) <= loss_tol(ref_total, ref_n)
    grad = torch.cat([o["grad"] for o in outs], -1)
    rel = float((grad.double() - ref_grad).norm() / ref_grad.norm())
    assert rel <= grad_tol(ref_grad, s.dtype), f"gradient rel-L2 {rel:.3g}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
