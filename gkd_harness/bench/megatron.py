"""The loss on Megatron's call path: ``gkd-bench --only mega_tp1 mega_tp2``.

ms-swift's Megatron GKD trainer (``swift/megatron/trainers/gkd_trainer.py``) always passes its vocab-parallel
``log_softmax_fn`` / ``kl_div_fn`` to ``gkd_loss``, even at TP=1, so the patched loss runs its injected-primitive
path there, not the default one the ``full`` rows time. Inputs: a Float16Module's output, FP32 student logits
(BF16 values upcast) ``[1, N, V]``, and a BF16 near-copy teacher ``[1, N, V]`` (``cases.TEACHER_NOISE``), N =
``Sizes.mega_n`` (128), V = ``Sizes.full_v`` (151,936); β and T as every loss row.

* ``mega_tp1`` (built in :mod:`gkd_harness.bench.cases`, which this module's rank program reuses): in the worker process, with what ``vocab_parallel_log_softmax`` / ``vocab_parallel_kl_div``
  compute at TP=1 (``F.log_softmax`` and the textbook KL, distinct objects from ms-swift's default primitives; the
  real functions need an initialised Megatron parallel state, which ``mega_tp2`` has).
* ``mega_tp2``: 2 gloo CPU ranks (``torch.distributed.run``, this module as the rank program), Megatron's parallel
  state at TP=2 and ms-swift's own vocab-parallel functions, each rank holding its half of the vocabulary of both
  inputs. Per repetition the ranks start together (a barrier) and the figure is the larger of the two ranks' CPU
  (or wall) times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

import torch

from gkd_harness.bench.cases import Sizes, megatron_inputs, megatron_step, megatron_variant_loss


def measure_tp2(variant: str, sizes: Sizes, warmup: int, reps: int) -> Dict:
    """``mega_tp2/<variant>``: one 2-rank gloo job (``torch.distributed.run``); returns ``wall_s``, ``cpu_s`` (per
    repetition, the larger of the two ranks') and ``loss``."""
    with tempfile.TemporaryDirectory(prefix="gkd-bench-tp2-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        cmd += ["-m", "gkd_harness.bench.megatron", variant, str(sizes.mega_n), str(sizes.full_v)]
        cmd += [str(warmup), str(reps), str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"mega_tp2/{variant}: torchrun rc={proc.returncode}: {tail}")
        return json.loads(out.read_text())


def _rank_main(variant: str, n: int, v: int, warmup: int, reps: int, out: str) -> None:
    """One rank of :func:`measure_tp2`."""
    import gc
    import warnings
    from datetime import timedelta

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    torch.set_num_threads(1)
    from megatron.core import parallel_state as ps
    from swift.megatron.trainers.vocab_parallel_utils import vocab_parallel_kl_div, vocab_parallel_log_softmax
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    student, teacher, labels = megatron_inputs(n, v)
    part = v // size
    shard = slice(rank * part, (rank + 1) * part)
    s, t = student[..., shard].contiguous(), teacher[..., shard].contiguous()
    del student, teacher
    to = TeacherOutput(full_logits=t, labels=labels)
    step = megatron_step(
        megatron_variant_loss(variant), s, to, labels, vocab_parallel_log_softmax, vocab_parallel_kl_div
    )
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    for _ in range(reps):
        gc.collect()
        dist.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    loss = float(step())
    times = [None, None]
    dist.all_gather_object(times, (wall, cpu))
    if rank == 0:
        res = {
            "wall_s": [max(a, b) for a, b in zip(times[0][0], times[1][0])],
            "cpu_s": [max(a, b) for a, b in zip(times[0][1], times[1][1])],
            "loss": loss,
            "note": "2 gloo ranks, TP=2, ms-swift's vocab_parallel_log_softmax / vocab_parallel_kl_div",
        }
        Path(out).write_text(json.dumps(res))
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
