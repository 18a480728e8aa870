"""``gkd-bench`` group ``e2e``: CPU time per training step of the tiny embedded model, three sides.

* ``e2e/bare`` (the baseline): ms-swift's own ``swift rlhf`` with the argv ``gkd-train monitor=off`` would run
  (its dry-run plan), minus the harness's ``--external_plugins`` and ``--callbacks``: upstream's loss, no plugin,
  same model, data, seed, wandb (offline) and logging.
* ``e2e/monitor_off``: ``gkd-train monitor=off`` (the plumbing: plugin, dtype boundary, the fp32 loss, callbacks,
  run folder, the ``gkd-train`` parent watching the run).
* ``e2e/monitor_default``: ``gkd-train`` with the default monitoring (counts every call, FP64 spot check every
  step: ``configs/monitor/default.yaml``).

Every side is one fresh run per round; ``gkd-bench`` interleaves the sides over ``--rounds``. Steps are timed on
the arrival of the lines of ms-swift's ``logging.jsonl`` (one per step with ``logging_steps=1``, written by
ms-swift on all three sides alike; the worker polls it every 5 ms). At each arrival the worker reads the CPU time
of the run's whole process tree from ``/proc``, so a step's CPU time (steadier than wall time on a shared
machine; 10 ms resolution) is the difference between two lines. The first ``SKIP`` steps (warm-up) are dropped.
Ratios are of the **mean** CPU time per step (a median would hide the rare slower step); the last line, which
arrives as the run's processes exit, is not a step.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from gkd_harness.harness.contract import SWIFT_DIR, WANDB_DIR

SKIP = 2
SIDES = ("bare", "monitor_off", "monitor_default")
#: ms-swift's per-step log, relative to its --output_dir
SWIFT_LOG_LINES = "logging.jsonl"
#: the harness's flags in a plan's argv (each followed by its value)
PLUGIN_FLAGS = ("--external_plugins", "--callbacks")


def _exe(name: str, module: str) -> List[str]:
    exe = Path(sys.executable).with_name(name)
    return [str(exe)] if exe.exists() else [sys.executable, "-m", module]


_TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """User+system CPU seconds of the processes under ``root`` (itself included), from ``/proc``: each live
    process's own time plus that of its children it has already waited for (``cutime``, ``cstime``), so the total
    does not drop when a helper process ends."""
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
        cpu[pid] = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICK
    children: Dict[int, List[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def _step_times(lines: Path, proc: subprocess.Popen, poll_s: float = 0.005) -> Tuple[List[float], List[float]]:
    """Arrival wall time of each complete step line of ``lines`` (ms-swift's ``logging.jsonl``) while ``proc``
    runs, and the CPU time of the process tree at that moment. Returns ``(arrivals, cpu_at_arrivals)``."""
    arrivals: List[float] = []
    cpus: List[float] = []
    buf, pos = "", 0
    while True:
        done = proc.poll() is not None
        if lines.exists():
            with open(lines) as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            now = time.perf_counter()
            buf += chunk
            cpu_now = _tree_cpu_s(proc.pid) if "\n" in buf else 0.0
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                if line.strip() and "global_step/max_steps" in json.loads(line):
                    arrivals.append(now)
                    cpus.append(cpu_now)
        if done:
            return arrivals, cpus
        time.sleep(poll_s)


def parse_plan(text: str) -> Tuple[Dict[str, str], List[str]]:
    """``(env, argv)`` of a ``gkd-train run.dry_run=true`` plan: ``KEY=VALUE`` lines, then the command with
    backslash continuations (comment lines skipped)."""
    env: Dict[str, str] = {}
    cmd: List[str] = []
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    for i, ln in enumerate(lines):
        key, eq, value = ln.partition("=")
        if eq and key.isidentifier() and key.upper() == key and not cmd:
            env[key] = value
            continue
        cmd = shlex.split(" ".join(x.rstrip("\\").strip() for x in lines[i:]))
        break
    return env, cmd


def bare_command(env: Dict[str, str], argv: List[str], out_dir: Path) -> Tuple[Dict[str, str], List[str]]:
    """The plan's command without the harness: no ``--external_plugins`` / ``--callbacks``, no plugin settings,
    ``--output_dir`` and wandb's folder in ``out_dir``."""
    out: List[str] = []
    skip = False
    for i, tok in enumerate(argv):
        if skip:
            skip = False
            continue
        if tok in PLUGIN_FLAGS:
            skip = True
            continue
        if i > 0 and argv[i - 1] == "--output_dir":
            tok = str(out_dir / SWIFT_DIR)
        out.append(tok)
    env = {k: v for k, v in env.items() if not k.startswith("GKD_HARNESS")}
    env.update(WANDB_DIR=str(out_dir / WANDB_DIR), WANDB_RUN_ID=f"bare{os.getpid()}{int(time.time())}")
    return env, out


def _gkd_train_args(side: str, steps: int, out_dir: Path) -> List[str]:
    monitor = {"bare": "off", "monitor_off": "off", "monitor_default": "default"}[side]
    return [
        f"monitor={monitor}",
        f"run.max_steps={steps}",
        "run.seed=42",
        f"run.output_dir={out_dir}",
        "tracking.wandb.mode=offline",
        "tracking.wandb.group=bench",
    ]


def _command(side: str, steps: int, out_dir: Path, env: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    gkd_train = _exe("gkd-train", "gkd_harness.harness.launcher.cli")
    args = _gkd_train_args(side, steps, out_dir)
    if side != "bare":
        return env, gkd_train + args
    plan = subprocess.run(
        gkd_train + args + ["run.dry_run=true"], env=env, capture_output=True, text=True, check=True
    ).stdout
    plan_env, argv = parse_plan(plan)
    benv, bargv = bare_command(plan_env, argv, out_dir)
    if bargv and bargv[0] == "swift":
        bargv = _exe("swift", "swift.cli.main") + bargv[1:]
    return {**env, **benv}, bargv


def measure_e2e(side: str, quick: bool, work_dir: str, steps: int = 0) -> Dict:
    """One run of ``side`` (:data:`SIDES`); per-step CPU and wall seconds after the warm-up."""
    steps = steps or (6 if quick else 40)
    out_dir = Path(work_dir) / f"e2e_{side}_{os.getpid()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    env, cmd = _command(side, steps, out_dir, env)
    log_path = Path(work_dir) / f"e2e_{side}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        arrivals, cpus = _step_times(out_dir / SWIFT_DIR / SWIFT_LOG_LINES, proc)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{side} exited {proc.returncode}: {log_path.read_text()[-1500:]}")
    # the last line arrives as the run ends (its processes exiting): not a training step
    arrivals, cpus = arrivals[:-1], cpus[:-1]
    steps_s = [b - a for a, b in zip(arrivals[SKIP:], arrivals[SKIP + 1 :])]
    steps_cpu = [b - a for a, b in zip(cpus[SKIP:], cpus[SKIP + 1 :])]
    if not steps_s:
        raise RuntimeError(f"{side} logged {len(arrivals)} steps; need more than {SKIP + 1}")
    return {
        "wall_s": steps_s,
        "cpu_s": steps_cpu,
        "round_mean_s": [statistics.mean(steps_cpu)],
        "round_mean_wall_s": [statistics.mean(steps_s)],
        "note": f"{' '.join(Path(c).name for c in cmd[:2])} ... ({side}), {steps} steps, {len(steps_s)} timed "
        f"(first {SKIP} dropped); run wall {total:.0f} s",
    }


def e2e_ratio(res: Dict, base: Dict) -> Dict:
    """Ratio of mean CPU per step (pooled over rounds) ÷ the baseline's, and its spread: the lowest and highest
    ratio of one round's mean to the same round's baseline mean."""
    mean = statistics.mean(res["cpu_s"]) / statistics.mean(base["cpu_s"])
    per_round = [a / b for a, b in zip(res.get("round_mean_s", []), base.get("round_mean_s", [])) if b > 0]
    wall = statistics.mean(res["wall_s"]) / statistics.mean(base["wall_s"])
    return {
        "time_ratio": mean,
        "time_ratio_range": (min(per_round), max(per_round)) if per_round else (mean, mean),
        "wall_ratio": wall,
        "round_ratios": per_round,
    }
