"""Process layout of one node for ms-swift's own CLI (``swift rlhf`` / ``megatron rlhf``).

ms-swift starts ``torch.distributed.run`` itself when ``NPROC_PER_NODE`` or ``NNODES`` is set and forwards
``NPROC_PER_NODE``, ``MASTER_PORT``, ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR`` as torchrun flags
(``swift/cli/main.py``). The harness therefore never runs one torchrun per GPU: it runs **one task per node**
(submitit ``tasks_per_node=1``) and each task sets these five variables; ms-swift's torchrun takes it from there.

Where the values come from, highest priority first:

1. the config, under ``backend``: ``backend.nproc_per_node`` (int, or null = one per visible GPU in SLURM, else 1),
   ``backend.nnodes``, ``backend.node_rank``, ``backend.master_addr``, ``backend.master_port`` (each null = derive);
2. the SLURM job environment (a submitit_slurm task, or any ``srun``): ``SLURM_JOB_NUM_NODES``, ``SLURM_NODEID``,
   the first host of ``SLURM_JOB_NODELIST``, a port derived from ``SLURM_JOB_ID`` (same on every node);
3. variables already present in ``base_env`` (e.g. a hand-started node process with ``NNODES=2 NODE_RANK=1``);
4. single-node defaults: ``NNODES=1``, ``NODE_RANK=0``, ``MASTER_ADDR=127.0.0.1``, a free local port (so parallel
   submitit_local points never collide on torchrun's default 29500).

A single process on a single node gets neither ``NPROC_PER_NODE`` nor ``NNODES`` (ms-swift then runs plain
``python`` without torchrun) unless the backend needs torchrun anyway (Megatron, colocated vLLM), but always
``MASTER_ADDR`` and a free ``MASTER_PORT``, because ms-swift's single-process default is port 29500 for everyone.
This module is the one copy of that arithmetic: ``gkd_harness.harness.launcher.plan`` uses it in ``gkd-train`` and
``gkd_harness.launch.slurm`` prints it for every node.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Mapping

# submitit has no public function that takes a node list as a string (its public JobEnvironment().hostnames reads
# os.environ, and the SLURM dry run lays out the nodes of a job that does not exist yet): its parser is private
from submitit.slurm.slurm import SlurmParseException, _parse_node_list

from gkd_harness.harness.config.schema import BackendConfig, ConfigError

DIST_KEYS = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
_PORT_BASE, _PORT_SPAN = 20000, 20000


def _as_int(value: Any, key: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"must be an integer, got {value!r}") from None
    return out


def slurm_hosts(nodelist: str) -> list[str]:
    """The host names of a SLURM node list (``gpu[01-02]-ib``, ``a[1-2],b5``, ``r[1-2]n[01-02]``), in order, by
    submitit's own parser: the one its ``SlurmJobEnvironment().hostnames`` applies to ``SLURM_JOB_NODELIST``.

    Raises:
        ConfigError: naming ``SLURM_JOB_NODELIST`` when submitit cannot read the list.
    """
    try:
        hosts = _parse_node_list(nodelist)
    except SlurmParseException:
        raise ConfigError("SLURM_JOB_NODELIST", f"not a SLURM node list: {nodelist!r}") from None
    if not hosts or not all(hosts):
        raise ConfigError("SLURM_JOB_NODELIST", f"not a SLURM node list: {nodelist!r}")
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


@dataclass(frozen=True)
class NodeLayout:
    """The process layout of one node of a job, and how ms-swift must start it.

    ``torchrun`` is true when ms-swift must start ``torch.distributed.run`` (it does so when ``NPROC_PER_NODE`` or
    ``NNODES`` is set): several processes or nodes, the Megatron backend (Megatron's ``init_process_group(env://)``
    needs ``RANK``/``WORLD_SIZE`` even for one process) and a colocated vLLM (``external_launcher``).
    """

    nproc_per_node: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    torchrun: bool

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def env(self) -> dict[str, str]:
        """The torchrun variables ms-swift's CLI reads (``MASTER_*`` only, without torchrun)."""
        out = {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}
        if self.torchrun:
            out.update(NPROC_PER_NODE=str(self.nproc_per_node), NNODES=str(self.nnodes), NODE_RANK=str(self.node_rank))
        return out


def node_layout(
    backend: BackendConfig, base_env: Mapping[str, str], force_torchrun: bool = False, port_picker=None
) -> NodeLayout:
    """The layout of this node from the ``backend`` config and the node's environment.

    Args:
        backend: the typed ``backend`` group; its null layout keys are derived from ``base_env``.
        base_env: the node's environment (``os.environ`` in gkd-train, a SLURM task's variables in the dry run).
        force_torchrun: start torchrun even for one process (Megatron, colocated vLLM).
        port_picker: returns a free local port for a single-node run (default :func:`free_port`).

    Raises:
        ConfigError: naming the ``backend.*`` key or environment variable that holds an invalid value.
    """
    env = dict(base_env)
    slurm = in_slurm_job(env)
    nproc = backend.nproc_per_node
    if nproc is None:
        nproc = _visible_gpus(env) if slurm else None
        if nproc is None and env.get("NPROC_PER_NODE"):
            nproc = _as_int(env["NPROC_PER_NODE"], "NPROC_PER_NODE")
        nproc = nproc or 1
    if slurm:
        hosts = slurm_hosts(env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"])
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
    nnodes = backend.nnodes if backend.nnodes is not None else _as_int(derived["NNODES"], "NNODES")
    node_rank = backend.node_rank if backend.node_rank is not None else _as_int(derived["NODE_RANK"], "NODE_RANK")
    master_addr = backend.master_addr or derived["MASTER_ADDR"]
    port = (
        backend.master_port
        if backend.master_port is not None
        else (_as_int(derived["MASTER_PORT"], "MASTER_PORT") if derived["MASTER_PORT"] else None)
    )
    if nproc < 1:
        raise ConfigError("backend.nproc_per_node", f"must be >= 1, got {nproc}")
    if nnodes < 1:
        raise ConfigError("backend.nnodes", f"must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(
            "backend.node_rank",
            f"node rank (backend.node_rank / NODE_RANK / SLURM_NODEID) must be in [0, {nnodes}), got {node_rank}",
        )
    if port is None:
        if nnodes > 1:
            raise ConfigError(
                "backend.master_port",
                f"must be set (or MASTER_PORT) for a multi-node run (backend.nnodes={nnodes}) outside SLURM: "
                "every node needs the same rendezvous port",
            )
        # a private port even for one process: a single process that still initialises a process group falls back
        # to 29500, and parallel submitit_local points would collide there
        port = (port_picker or free_port)()
    if not 0 < port < 65536:
        raise ConfigError("backend.master_port", f"must be a TCP port, got {port}")
    torchrun = force_torchrun or nproc > 1 or nnodes > 1
    return NodeLayout(
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=port,
        torchrun=torchrun,
    )


def is_main_node(env: Mapping[str, str] | None = None) -> bool:
    """True on node 0 of a (possibly multi-node) job: the node that owns the run folder's summary/config.

    Every node of a submitit_slurm job runs the same Hydra job; only node 0 should write ``summary.json`` and
    ``config.yaml`` (the metrics stream is written by global rank 0 anyway).
    """
    env = os.environ if env is None else env
    if in_slurm_job(env):
        return env.get("SLURM_NODEID", "0") == "0"
    return env.get("NODE_RANK", "0") in ("", "0")


def detect_device(run_device: str, env: Mapping[str, str] | None = None) -> str:
    """``run.device`` resolved without importing torch: ``auto`` is ``cuda`` when this node shows an NVIDIA device
    that ``CUDA_VISIBLE_DEVICES`` does not hide, else ``cpu``."""
    if run_device != "auto":
        return run_device
    env = os.environ if env is None else env
    if (_visible_gpus(env) or 0) > 0 and in_slurm_job(env):
        return "cuda"  # a SLURM task with GPUs (the login node that prints a dry run may have none)
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and not [d for d in cvd.split(",") if d.strip() not in ("", "-1")]:
        return "cpu"
    return "cuda" if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl") else "cpu"


def local_gpu_count(nproc_per_node: Any, run_device: str, env: Mapping[str, str] | None = None) -> int:
    """GPUs a submitit_local job must see: ``backend.nproc_per_node`` (or every visible GPU when null) when the
    run's device is CUDA, else 0. submitit_local sets ``CUDA_VISIBLE_DEVICES`` to this many devices, and to the
    empty string for 0, which hides every GPU from the job."""
    env = os.environ if env is None else env
    if detect_device(str(run_device), env) != "cuda":
        return 0
    if nproc_per_node not in (None, "None", "null"):
        return int(nproc_per_node)
    visible = _visible_gpus(env)
    if visible is None:
        visible = len([n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)]) if os.path.isdir("/dev") else 0
    return visible
