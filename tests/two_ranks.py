"""One job on 2 gloo ranks, the way the suite's parallel tests start their workers.

``run_two_ranks(worker, spec, work)`` saves ``spec`` as ``work/in.pt``, starts ``worker`` under torchrun (one node,
2 processes, a c10d rendezvous on a free port of 127.0.0.1, the repository root on ``PYTHONPATH``) with
``IN.pt WORK`` as its arguments, and returns what each rank saved as ``work/rank<r>.pt``. The workers' common body
is ``tests.harness.loss.parallel_gkd_worker.serve``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
MEGATRON_EXTRAS = ("megatron", "mcore_bridge")


def run_two_ranks(worker: Path, spec: dict, work: Path, timeout: float = 900) -> list:
    """``[results of rank 0, results of rank 1]`` of ``worker`` run on ``spec``; a failed job fails the test with
    the workers' output."""
    missing = [m for m in MEGATRON_EXTRAS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(
            f"{missing} not installed; the parallel tests need ms-swift's Megatron extras: "
            'pip install "megatron-core>=0.16,<0.20" "mcore-bridge>=1.6.3" "torch==<the installed torch>"'
        )
    torch.save(spec, work / "in.pt")
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        str(worker),
        str(work / "in.pt"),
        str(work),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"torchrun worker failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return [torch.load(work / f"rank{r}.pt", weights_only=True) for r in range(2)]
