"""The fused fp32 path works in row blocks sized from the vocabulary width (issue 25), never holding more than one
small block of FP32 work beside the gradient it returns; the block does not change a single bit of the result."""

from __future__ import annotations

import pytest
import torch

from gkd_harness.bench.measure import allocator_peak_mib
from gkd_harness.harness.loss.chunked import BLOCK_ELEMENTS, block_rows
from gkd_harness.harness.loss.reference import reference_jsd
from gkd_harness.harness.losses import jsd_per_position

MIB = 2.0**20


def _pair(n: int, v: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(n, v, generator=g) * 2
    return s.bfloat16(), (s + 0.03 * torch.randn(n, v, generator=g)).bfloat16()


def test_block_rows_come_from_the_width_not_chunk_size():
    assert block_rows(512, 151_936, torch.device("cpu")) == 1
    assert block_rows(16_384, 64, torch.device("cpu")) == BLOCK_ELEMENTS["cpu"] // 64
    assert block_rows(10, 64, torch.device("cpu")) == 10  # never more than N
    assert block_rows(512, 248_320, torch.device("cuda")) == BLOCK_ELEMENTS["cuda"] // 248_320


def test_fused_peak_memory_is_the_gradient_plus_one_block():
    """BF16 [128, 40,000] inputs: the call's allocations peak at dz and the returned gradient (two BF16 [N, V]
    tensors) plus one block's FP32 temporaries. Before the width-based block, chunk_size=512 gave 64-row FP32
    chunks (10 MB per temporary, about 100 MB in all)."""
    n, v = 128, 40_000
    s, t = _pair(n, v)

    def call():
        x = s.detach().requires_grad_(True)
        _, total = jsd_per_position(x, t, 0.5, precision="fp32", temperature=0.9, chunk_size=512)
        total.backward()
        return x.grad

    call()
    peak = allocator_peak_mib(call)
    if peak is None:
        pytest.skip("torch profiler memory timeline unavailable")
    bf16_nv = n * v * 2 / MIB
    block_fp32 = block_rows(n, v, torch.device("cpu")) * v * 4 / MIB
    assert peak <= 2 * bf16_nv + 16 * block_fp32, (peak, bf16_nv, block_fp32)


@pytest.mark.parametrize("form", ["paper", "continuous"])
def test_result_does_not_depend_on_chunk_size(form):
    """chunk_size keeps its meaning for native only: the fp32 per-position values and gradient are bit-identical
    for any chunk_size, and agree with the independent FP64 reference."""
    s, t = _pair(40, 3000, seed=1)
    out = []
    for chunk in (1, 7, 512):
        x = s.detach().requires_grad_(True)
        per, total = jsd_per_position(x, t, 0.3, precision="fp32", beta_form=form, temperature=0.9, chunk_size=chunk)
        total.backward()
        out.append((per.detach(), x.grad))
    for per, grad in out[1:]:
        assert torch.equal(per, out[0][0]) and torch.equal(grad, out[0][1])
    ref = reference_jsd(s, t, 0.3, form, temperature=0.9)
    assert torch.allclose(out[0][0].double(), ref, rtol=1e-4, atol=1e-9)
