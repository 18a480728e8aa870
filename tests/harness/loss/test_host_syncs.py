"""Host synchronisations of the fp32 loss (issue 41 item 10): bounded per call, independent of N and V.

On a GPU every host read of a mask (``bool(mask.any())``, boolean indexing) stalls the pipeline. The fused path
made 4 of them per row block on near-identical inputs and up to 9 where its masks had elements, so a call at GPU
block sizes (2^24 elements) made hundreds (N = 4,096, V = 151,936: ~37 blocks). Sync-free (the default on every
device but the CPU, ``chunked.SYNC_FREE``) it makes the same number as upstream's ``gkd_loss`` on the same inputs
(ms-swift's ``extract_active``), whatever N and V. The CPU runs the sync-free path here with small blocks, so one
call has many; the values are checked against the host-branching path and the FP64 reference."""

from __future__ import annotations

import pytest
import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput
from swift.rlhf_trainers.gkd_loss import gkd_loss as upstream_gkd_loss

from gkd_harness.bench.host_syncs import count_host_syncs
from gkd_harness.harness.loss import chunked
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import grad_tol, loss_tol
from gkd_harness.harness.losses import make_gkd_loss


@pytest.fixture
def gpu_like(monkeypatch):
    """The CPU takes the GPU's sync-free path, with 2^12-element blocks (many blocks per call)."""
    monkeypatch.setattr(chunked, "SYNC_FREE", {"cpu": True}, raising=False)
    monkeypatch.setitem(chunked.BLOCK_ELEMENTS, "cpu", 2**12)


def _hard_inputs(n: int, v: int, seed: int = 0, topk: int = 0):
    """``[2, n, v]`` FP32 student, BF16 teacher: near-identical rows, rows shifted by ±300 (κ far), rows whose
    argmaxes differ (the gradient's shifted elements) and a few extreme logits (direct elements at β near an
    endpoint); labels mask the first position of each sequence."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, n, v, generator=g) * 2
    t = s + 0.03 * torch.randn(2, n, v, generator=g)
    t[:, 1::4] += 300.0  # shifted teacher rows
    t[:, 2::4] = torch.randn(2, len(range(2, n, 4)), v, generator=g) * 6  # unrelated teacher rows
    s[:, 3::4, 0] += 40.0  # one very confident student token
    labels = torch.zeros(2, n, dtype=torch.long)
    labels[:, 0] = -100
    t = t.bfloat16()
    if topk:
        lp, ids = torch.log_softmax(t.float(), -1).topk(topk, -1)
        return s, TeacherOutput(topk_logprobs=lp.bfloat16(), topk_indices=ids, labels=labels), labels
    return s, TeacherOutput(full_logits=t, labels=labels), labels


def _call(fn, s, to, labels, beta):
    x = s.detach().requires_grad_(True)
    total, n = fn(x, to, labels, beta, 0.9)
    (total / n).backward()
    return float(total), int(n), x.grad


@pytest.mark.parametrize("beta", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("topk", [0, 16])
def test_fp32_syncs_per_call_do_not_grow_with_n_or_v(gpu_like, beta, topk):
    fp32 = make_gkd_loss("fp32", "continuous")
    counts = {}
    for n, v in ((8, 256), (64, 256), (64, 2048)):
        args = _hard_inputs(n, v, topk=topk)
        ours = count_host_syncs(_call, fp32, *args, beta)
        theirs = count_host_syncs(_call, upstream_gkd_loss, *args, beta)
        counts[(n, v)] = (len(ours), len(theirs))
    assert len({c for c, _ in counts.values()}) == 1, counts  # before: 29, 183, 1,036 (β = 0.05, full vocabulary)
    assert all(ours <= theirs for ours, theirs in counts.values()), counts


@pytest.mark.parametrize("form", ["paper", "continuous"])
@pytest.mark.parametrize("beta", [0.0, 0.05, 0.5, 0.95, 0.999, 1.0])
@pytest.mark.parametrize("topk", [0, 16])
def test_sync_free_values_match_the_branching_path_and_fp64(monkeypatch, form, beta, topk):
    s, to, labels = _hard_inputs(24, 512, seed=1, topk=topk)
    fn = make_gkd_loss("fp32", form)
    monkeypatch.setitem(chunked.BLOCK_ELEMENTS, "cpu", 2**12)
    branching = _call(fn, s, to, labels, beta)
    monkeypatch.setattr(chunked, "SYNC_FREE", {"cpu": True}, raising=False)
    free = _call(fn, s, to, labels, beta)
    teacher = {"teacher_topk": (to.topk_logprobs, to.topk_indices)} if topk else {"teacher_full": to.full_logits}
    ref_total, ref_n, ref_grad = reference_gkd(s, labels, beta, 0.9, form, **teacher)
    for total, n, grad in (branching, free):
        assert n == ref_n
        assert abs(total - ref_total) <= loss_tol(ref_total, n)
        rel = float((grad.double() - ref_grad).norm() / ref_grad.norm())
        assert rel <= grad_tol(ref_grad, torch.float32), rel
    assert free[0] == pytest.approx(branching[0], rel=1e-6, abs=1e-9)
    rel_paths = float((free[2].double() - branching[2].double()).norm() / branching[2].double().norm())
    assert rel_paths < 1e-6


def _tp1_log_softmax(x):
    """``vocab_parallel_log_softmax`` at TP=1 (what ms-swift's Megatron trainer injects there)."""
    return torch.nn.functional.log_softmax(x, dim=-1)


def _tp1_kl_div(input_log, target_log):
    """``vocab_parallel_kl_div`` at TP=1."""
    return (torch.exp(target_log) * (target_log - input_log)).sum(dim=-1)


def _call_injected(fn, s, to, labels, beta):
    x = s.detach().requires_grad_(True)
    total, n = fn(x, to, labels, beta, 0.9, log_softmax_fn=_tp1_log_softmax, kl_div_fn=_tp1_kl_div)
    (total / n).backward()
    return float(total), int(n), x.grad


@pytest.mark.parametrize("beta", [0.05, 0.5, 0.95])
def test_fp32_syncs_on_injected_primitives_are_upstreams_whatever_n_and_v(gpu_like, beta):
    """Megatron's call path (issue 46): sync-free, the fp32 call on the injected primitives makes no more host
    synchronisations than upstream's on the same call, and as many at every N and V; its values are the FP64
    reference's."""
    fp32 = make_gkd_loss("fp32", "continuous")
    counts = {}
    for n, v in ((8, 256), (64, 256), (64, 2048)):
        args = _hard_inputs(n, v)
        ours = count_host_syncs(_call_injected, fp32, *args, beta)
        theirs = count_host_syncs(_call_injected, upstream_gkd_loss, *args, beta)
        counts[(n, v)] = (len(ours), len(theirs))
    assert len({c for c, _ in counts.values()}) == 1, counts
    assert all(ours <= theirs for ours, theirs in counts.values()), counts
    s, to, labels = _hard_inputs(24, 512, seed=1)
    total, n, grad = _call_injected(fp32, s, to, labels, beta)
    ref_total, ref_n, ref_grad = reference_gkd(s, labels, beta, 0.9, "continuous", teacher_full=to.full_logits)
    assert n == ref_n and abs(total - ref_total) <= loss_tol(ref_total, n)
    assert float((grad.double() - ref_grad).norm() / ref_grad.norm()) <= grad_tol(ref_grad, torch.float32)
