"""``gkd-bench`` group ``e2e``: step time of a tiny real ``gkd-train`` run, monitoring on vs off, same seed.

Each measurement is one real run of ``gkd-train`` (real Hydra, real ms-swift CLI, real wandb offline) on the
embedded tiny default: ``monitor=sparse`` (counts on every call, FP64 spot check every 50 steps) or ``monitor=off``.
The run folder's ``metrics.jsonl`` is written and flushed once per step (``logging_steps=1``), so the time between
the arrival of consecutive lines is the wall time of one training step (the worker polls the file every 5 ms).
At each line's arrival the worker also reads the CPU time of the run's whole process tree from ``/proc``, so a
step's CPU time (steadier than wall time on a shared machine; 10 ms resolution) is the difference between two lines.
The first ``SKIP`` steps (warm-up) are dropped. The ratio is of the **mean** CPU time per step (spot-check steps are
2 of 100, so a median would hide them); wall-time figures are reported beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from gkd_harness.harness.contract import METRICS_FILE, SPOT_LOSS_FP64, TRAIN_LOSS

SKIP = 2


def _gkd_train() -> List[str]:
    exe = Path(sys.executable).with_name("gkd-train")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gkd_harness.harness.launcher.cli"]


_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """User+system CPU seconds of the live processes under ``root`` (itself included), from ``/proc``."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _TICK
    children: Dict[int, List[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def _step_times(metrics: Path, proc: subprocess.Popen, poll_s: float = 0.005):
    """Arrival wall time of each complete line of ``metrics`` while ``proc`` runs, and the CPU time of the
    process tree at that moment. Returns ``(arrivals, cpu_at_arrivals)``."""
    arrivals: List[float] = []
    cpus: List[float] = []
    buf, pos = "", 0
    while True:
        done = proc.poll() is not None
        if metrics.exists():
            with open(metrics) as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            now = time.perf_counter()
            buf += chunk
            cpu_now = _tree_cpu_s(proc.pid) if "\n" in buf else None
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                if line.strip():
                    json.loads(line)
                    arrivals.append(now)
                    cpus.append(cpu_now)
        if done:
            return arrivals, cpus
        time.sleep(poll_s)


def measure_e2e(monitor_on: bool, quick: bool, work_dir: str) -> Dict:
    steps = 6 if quick else 100
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    out_dir = Path(work_dir) / ("e2e_on" if monitor_on else "e2e_off")
    monitor = "sparse" if monitor_on else "off"
    cmd = _gkd_train() + [
        f"monitor={monitor}",
        f"run.max_steps={steps}",
        "run.seed=42",
        f"run.output_dir={out_dir}",
        "tracking.wandb.mode=offline",
        "tracking.wandb.group=bench",
    ]
    if quick:
        cmd.append("monitor.spot_check.every_n_steps=" + ("3" if monitor_on else "0"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    t0 = time.perf_counter()
    with open(Path(work_dir) / f"e2e_{monitor}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        arrivals, cpus = _step_times(out_dir / METRICS_FILE, proc)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (Path(work_dir) / f"e2e_{monitor}.log").read_text()[-1500:]
        raise RuntimeError(f"gkd-train {monitor} exited {proc.returncode}: {tail}")
    steps_s = [b - a for a, b in zip(arrivals[SKIP:], arrivals[SKIP + 1 :])]
    steps_cpu = [b - a for a, b in zip(cpus[SKIP:], cpus[SKIP + 1 :])]
    if not steps_s:
        raise RuntimeError(f"gkd-train wrote {len(arrivals)} metrics lines; need more than {SKIP + 1}")
    last = json.loads((out_dir / METRICS_FILE).read_text().splitlines()[-1])
    spots = sum(
        1
        for line in (out_dir / METRICS_FILE).read_text().splitlines()
        if json.loads(line).get(SPOT_LOSS_FP64) is not None
    )
    return {
        "wall_s": steps_s,
        "cpu_s": steps_cpu,
        "mean_step_s": statistics.mean(steps_cpu),
        "mean_step_wall_s": statistics.mean(steps_s),
        "note": (
            f"gkd-train monitor={monitor}, {steps} steps, seed 42, {len(steps_s)} steps timed "
            f"(first {SKIP} dropped), {spots} spot-checked steps; run wall {total:.0f} s"
        ),
        "loss": last.get(TRAIN_LOSS),
    }
