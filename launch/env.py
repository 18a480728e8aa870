"""Process-group environment for ms-swift's own CLI (``swift rlhf`` / ``megatron rlhf``).

ms-swift starts ``torch.distributed.run`` itself when ``NPROC_PER_NODE`` or ``NNODES`` is set and forwards
``NPROC_PER_NODE``, ``MASTER_PORT``, ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR`` as torchrun flags
(``swift/cli/main.py``). The harness therefore never runs one torchrun per GPU: it runs **one task per node**
(submitit ``tasks_per_node=1``) and each task sets these five variables; ms-swift's torchrun takes it from there.

Where the values come from, highest priority first:

1. the config, under ``backend``: ``backend.nproc_per_node`` (int, or null = one per visible GPU, else 1),
   ``backend.nnodes``, ``backend.node_rank``, ``backend.master_addr``, ``backend.master_port`` (each null = derive);
2. the SLURM job environment (a submitit_slurm task, or any ``srun``): ``SLURM_JOB_NUM_NODES``, ``SLURM_NODEID``,
   the first host of ``SLURM_JOB_NODELIST``, a port derived from ``SLURM_JOB_ID`` (same on every node);
3. variables already present in ``base_env`` (e.g. a hand-started node process with ``NNODES=2 NODE_RANK=1``);
4. single-node defaults: ``NNODES=1``, ``NODE_RANK=0``, ``MASTER_ADDR=127.0.0.1``, a free local port (so parallel
   submitit_local points never collide on torchrun's default 29500).

A single process on a single node gets neither ``NPROC_PER_NODE`` nor ``NNODES`` (ms-swift then runs plain
``python`` without torchrun) but still ``MASTER_ADDR`` and a free ``MASTER_PORT``, because ms-swift's single-process
default is port 29500 for everyone.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any, Mapping

DIST_KEYS = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
_PORT_BASE, _PORT_SPAN = 20000, 20000


def _select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """Read ``dotted`` from a DictConfig / nested dict, ``default`` when absent or null."""
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node[part] if part in node else None
        except TypeError:
            return default
    return default if node is None else node


def _as_int(value: Any, key: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be an integer, got {value!r}") from None
    return out


def parse_slurm_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list (``gpu[01-03,07],login1``) into host names, in order."""
    try:
        from submitit.slurm.slurm import _parse_node_list  # same parser submitit's JobEnvironment uses

        return list(_parse_node_list(nodelist))
    except ImportError:  # pragma: no cover - submitit is a dependency
        pass
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            hosts.append(plain)
            continue
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(lo))}")
    return hosts


def slurm_port(job_id: str | int) -> int:
    """A MASTER_PORT every node of one SLURM job computes identically, spread over [20000, 40000)."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return _PORT_BASE + int(digits) % _PORT_SPAN


def free_port() -> int:
    """An unused local TCP port (single-node runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _visible_gpus(env: Mapping[str, str]) -> int | None:
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        val = env.get(key, "")
        m = re.search(r"(\d+)\s*$", val)  # "8" or "h100:8"
        if m:
            return int(m.group(1))
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() not in ("", "-1")])
    return None


def in_slurm_job(env: Mapping[str, str]) -> bool:
    """True inside a SLURM allocation that spans a known node list (submitit_slurm task or srun step)."""
    return bool(env.get("SLURM_JOB_ID")) and bool(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"))


def swift_launch_env(cfg: Any, base_env: Mapping[str, str]) -> dict[str, str]:
    """Environment for ms-swift's CLI subprocess on this node.

    Args:
        cfg: the resolved harness config (DictConfig or nested dict); reads the optional ``backend.*`` keys above.
        base_env: the environment to start from (usually ``os.environ``); not modified.

    Returns:
        A new dict: ``base_env`` plus ``NPROC_PER_NODE``, ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``,
        ``MASTER_PORT`` (all strings); for a one-process, one-node run only ``MASTER_ADDR`` and ``MASTER_PORT``.

    Raises:
        ValueError: naming the ``backend.*`` key or environment variable that holds an invalid value.
    """
    env = dict(base_env)
    slurm = in_slurm_job(env)

    # -- processes per node
    nproc = _select(cfg, "backend.nproc_per_node")
    if nproc is None:
        nproc = _visible_gpus(env) if slurm else None
        if nproc is None and env.get("NPROC_PER_NODE"):
            nproc = _as_int(env["NPROC_PER_NODE"], "NPROC_PER_NODE")
        nproc = nproc or 1
    nproc = _as_int(nproc, "backend.nproc_per_node")

    # -- nodes, rank, rendezvous
    if slurm:
        hosts = parse_slurm_nodelist(env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"])
        derived = {
            "NNODES": env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or str(len(hosts)),
            "NODE_RANK": env.get("SLURM_NODEID", "0"),
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": str(slurm_port(env["SLURM_JOB_ID"])),
        }
    else:
        derived = {
            "NNODES": env.get("NNODES") or "1",
            "NODE_RANK": env.get("NODE_RANK") or "0",
            "MASTER_ADDR": env.get("MASTER_ADDR") or "127.0.0.1",
            "MASTER_PORT": env.get("MASTER_PORT") or "",
        }
    nnodes = _as_int(_select(cfg, "backend.nnodes", derived["NNODES"]), "backend.nnodes")
    node_rank = _as_int(_select(cfg, "backend.node_rank", derived["NODE_RANK"]), "backend.node_rank")
    master_addr = str(_select(cfg, "backend.master_addr", derived["MASTER_ADDR"]))
    port = _select(cfg, "backend.master_port", derived["MASTER_PORT"] or None)

    if nproc < 1:
        raise ValueError(f"backend.nproc_per_node must be >= 1, got {nproc}")
    if nnodes < 1:
        raise ValueError(f"backend.nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"backend.node_rank / NODE_RANK must be in [0, {nnodes}), got {node_rank}")

    if nproc == 1 and nnodes == 1:
        # no torchrun (ms-swift starts it only for NPROC_PER_NODE / NNODES), but a private rendezvous port: a
        # single process that still initialises a process group (Megatron, colocated vLLM) falls back to
        # MASTER_PORT or 29500, and parallel submitit_local points would collide on 29500.
        for key in ("NPROC_PER_NODE", "NNODES", "NODE_RANK"):
            env.pop(key, None)
        env["MASTER_ADDR"] = master_addr
        env["MASTER_PORT"] = str(_as_int(port, "backend.master_port") if port is not None else free_port())
        return env

    if port is None:
        if nnodes > 1:
            raise ValueError(
                "backend.master_port / MASTER_PORT must be set for a multi-node run outside SLURM "
                "(every node needs the same rendezvous port)"
            )
        port = free_port()
    port = _as_int(port, "backend.master_port")
    if not 0 < port < 65536:
        raise ValueError(f"backend.master_port must be a TCP port, got {port}")

    env.update(
        NPROC_PER_NODE=str(nproc),
        NNODES=str(nnodes),
        NODE_RANK=str(node_rank),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
    )
    return env


def is_main_node(env: Mapping[str, str] | None = None) -> bool:
    """True on node 0 of a (possibly multi-node) job: the node that owns the run folder's summary/config.

    Every node of a submitit_slurm job runs the same Hydra job; only node 0 should write ``summary.json`` and
    ``config.yaml`` (the metrics stream is written by global rank 0 anyway).
    """
    env = os.environ if env is None else env
    if in_slurm_job(env):
        return env.get("SLURM_NODEID", "0") == "0"
    return env.get("NODE_RANK", "0") in ("", "0")
