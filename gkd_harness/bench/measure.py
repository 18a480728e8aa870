"""Timing and peak-memory primitives for ``gkd-bench`` workers (one measurement per process).

Time: wall clock (``perf_counter``, with a device sync on CUDA) and process CPU time (``process_time``) of each
repetition. On a shared CPU machine the CPU time is the steadier of the two; both are reported.

Peak memory, measured honestly (no ``tracemalloc``, which does not see torch's allocations):

* CPU, process: the worker runs with glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` (set by the parent), so every
  allocation of 64 KiB or more is its own mmap and leaves the resident set when freed. The kernel's peak resident
  set (``VmHWM``) is reset through ``/proc/self/clear_refs`` just before the measured call; the peak is
  ``VmHWM`` after the call minus ``VmRSS`` before it.
* CPU, allocator: the same call under ``torch.profiler`` with ``profile_memory=True``; the peak of live torch
  allocations created during the call (the profiler's memory timeline, tensors alive before the call excluded).
* CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus what was allocated before.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

MIB = 2.0**20


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_calls(fn: Callable[[], object], device: str, warmup: int, reps: int) -> Dict[str, List[float]]:
    """Run ``fn`` ``warmup`` times untimed, then ``reps`` timed times.

    Returns:
        ``{"wall_s": [reps], "cpu_s": [reps]}``.
    """
    for _ in range(warmup):
        fn()
        sync(device)
    wall, cpu = [], []
    for _ in range(reps):
        gc.collect()
        sync(device)
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync(device)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return {"wall_s": wall, "cpu_s": cpu}


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (``VmHWM``) of this process; False if the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_delta_mib(fn: Callable[[], object]) -> Optional[float]:
    """Peak resident memory of this process during ``fn()`` above the resident memory before it, in MiB.

    None if the peak counter cannot be reset (then a delta would include earlier peaks).
    """
    gc.collect()
    if not reset_peak_rss():
        return None
    rss0 = _proc_status_kib("VmRSS")
    out = fn()
    peak = _proc_status_kib("VmHWM")
    del out
    return (peak - rss0) / 1024.0


def allocator_peak_mib(fn: Callable[[], object]) -> Optional[float]:
    """Peak of live torch CPU allocations made during ``fn()``, from the profiler's memory timeline, in MiB.

    Tensors alive before the call (``PREEXISTING`` in the timeline) are excluded. None if the profiler's memory
    timeline is unavailable in this torch build.
    """
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import Action
    except ImportError:
        return None
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        out = fn()
        del out
    try:
        timeline = prof._memory_profile().timeline
    except Exception:  # private API; report "n/a" rather than a wrong figure
        return None
    cur = peak = 0
    for _t, action, (key, _version), size in timeline:
        if action == Action.PREEXISTING or key.device.type != "cpu":
            continue
        if action == Action.CREATE:
            cur += size
        elif action == Action.DESTROY:
            cur -= size
        peak = max(peak, cur)
    return peak / MIB


def cuda_peak_mib(fn: Callable[[], object]) -> float:
    """Peak CUDA memory allocated during ``fn()`` above what was allocated before it, in MiB."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - base) / MIB


def quantiles(xs: List[float]) -> Dict[str, float]:
    """Median, quartiles, min and max of a sample (quartiles by the inclusive method)."""
    xs = sorted(xs)
    if len(xs) == 1:
        q1 = q3 = xs[0]
    else:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1], "n": len(xs)}


def malloc_env() -> Dict[str, str]:
    """Environment for a memory worker: glibc returns every freed block of >= 64 KiB to the kernel at once."""
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    env["MALLOC_TRIM_THRESHOLD_"] = "65536"
    return env
