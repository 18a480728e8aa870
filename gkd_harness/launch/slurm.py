"""Dry run of a SLURM sweep: the sbatch script, the srun line and the ms-swift command on every node.

Usage (same overrides as ``gkd-train -m``; nothing is submitted, no model loads)::

    .venv/bin/python -m gkd_harness.launch.slurm experiment=precision_ab hydra/launcher=submitit_slurm \
        hydra.launcher.nodes=2 hydra.launcher.gpus_per_node=8

It runs on a login node or a laptop, where the nodes' shared storage may not be mounted: a local path
(``model.student``, ``model.teacher``, ``run.dataset``, ``monitor.eval.dataset``) that does not exist on this
machine is listed as *unchecked* and the plan is still shown, as a hub id is only named in a dry run; values that
are still the example's placeholders (``YOUR_...``, ``/path/to/...``) are listed too. ``gkd-train`` on the node
checks them all.

What it prints is produced by the real parts:

- the sbatch script from submitit's own ``SlurmExecutor`` (the same parameters the Hydra submitit launcher passes,
  submitted as one job array over the sweep's points), including the ``srun`` line that starts one task per node;
- for each point and each node, the launch plan ``gkd-train`` builds on that node from its SLURM variables
  (``gkd_harness.harness.launcher.plan``, the same function ``gkd-train`` executes and ``gkd-train run.dry_run=true`` prints):
  the torchrun variables, the ms-swift CLI command, and the torchrun command ms-swift's CLI turns it into
  (``swift.cli.main.get_torchrun_args``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Sequence, cast

from omegaconf import OmegaConf

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.launcher.compose import compose, point_config
from gkd_harness.harness.launcher.plan import format_command
from gkd_harness.harness.launcher.run import make_plan
from gkd_harness.harness.launcher.sweep_points import point_name, sweep_points

DRY_JOB_ID = "4242"
DIST_KEYS = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
#: the keys that name a file or folder the nodes read, checked on the node when this machine does not have it
NODE_PATH_KEYS = ("model.student", "model.teacher", "run.dataset", "monitor.eval.dataset")
#: what marks a value as the example's placeholder (configs/local/slurm.example.yaml)
PLACEHOLDER_MARKS = ("YOUR_", "/path/to/")


def _slurm_executor_cls():
    from submitit.slurm.slurm import SlurmExecutor

    class DryRunSlurmExecutor(SlurmExecutor):
        """submitit's SlurmExecutor minus the check that ``srun`` exists; never submits."""

        @classmethod
        def affinity(cls) -> int:
            return 1

    return DryRunSlurmExecutor


def sbatch_script(launcher: dict[str, Any], num_points: int) -> str:
    """The sbatch file submitit would submit for a job array of ``num_points`` points.

    Args:
        launcher: the resolved ``hydra.launcher`` node of a submitit_slurm config.
        num_points: number of sweep points (array size).
    """
    params = {k: v for k, v in launcher.items() if k not in ("_target_", "submitit_folder", "max_num_timeout")}
    params = {k: v for k, v in params.items() if v is not None}
    if int(params.get("tasks_per_node", 1)) != 1:
        raise ValueError(
            f"hydra.launcher.tasks_per_node must be 1 (one task per node; ms-swift's torchrun starts the GPU "
            f"processes), got {params['tasks_per_node']}"
        )
    executor = _slurm_executor_cls()(
        folder=launcher["submitit_folder"], max_num_timeout=int(launcher.get("max_num_timeout", 0))
    )
    # as submitit's AutoExecutor does for the Hydra launcher: generic names -> sbatch names (timeout_min -> time, ...)
    executor.update_parameters(**executor._convert_parameters(params))
    if num_points > 1:
        executor.parameters["map_count"] = num_points
    return executor._make_submission_file_text(executor._submitit_command_str, uid="dryrun")


def node_slurm_env(
    node_rank: int,
    nodes: int,
    gpus_per_node: int | None,
    base_env: dict[str, str] | None = None,
    job_id: str = DRY_JOB_ID,
) -> dict[str, str]:
    """The SLURM variables one task of an ``nodes``-node job sees on node ``node_rank`` (hosts node[01-NN])."""
    env = dict(base_env or {})
    for key in DIST_KEYS:
        env.pop(key, None)
    env.update(
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NODELIST=f"node[01-{nodes:02d}]" if nodes > 1 else "node01",
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NODEID=str(node_rank),
        SLURM_PROCID=str(node_rank),
        SLURM_NTASKS=str(nodes),
        SLURM_LOCALID="0",
    )
    if gpus_per_node:
        env["SLURM_GPUS_ON_NODE"] = str(gpus_per_node)
    return env


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def torchrun_command(cli_argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """What ms-swift's CLI (``swift ...`` / ``megatron ...``) runs for ``cli_argv`` under ``env``.

    Mirrors ``swift.cli.main.cli_main``: with any of NPROC_PER_NODE/NNODES set it starts
    ``python -m torch.distributed.run <torchrun args> <route file> <args>``; the torchrun arguments come from
    ms-swift's own ``get_torchrun_args``.
    """
    import importlib.util

    from swift.cli import main as swift_main

    program, method, *args = cli_argv
    if os.path.basename(program) == "megatron":
        from swift.cli._megatron.main import ROUTE_MAPPING
    else:
        ROUTE_MAPPING = swift_main.ROUTE_MAPPING
    spec = importlib.util.find_spec(ROUTE_MAPPING[method.replace("_", "-")])
    if spec is None or spec.origin is None:
        raise ValueError(f"ms-swift has no module for {method!r}")
    route = spec.origin
    with _environ(env):
        torchrun_args = swift_main.get_torchrun_args()
    if torchrun_args is None:
        return ["python", route, *args]
    return ["python", "-m", "torch.distributed.run", *torchrun_args, route, *args]


def node_plan(
    cfg, run_dir: Path, node: int, nodes: int, gpus_per_node: int | None, base_env: dict[str, str] | None = None
):
    """The launch plan ``gkd-train`` builds for ``cfg`` on node ``node`` of a ``nodes``-node SLURM job."""
    return make_plan(cfg, run_dir, base_env=node_slurm_env(node, nodes, gpus_per_node, base_env), dry_run=True)


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def unchecked_paths(cfg) -> dict[str, str]:
    """``{key: value}`` of the :data:`NODE_PATH_KEYS` whose value is a local path this machine does not have."""
    from gkd_harness.harness.config.validate import is_local_path

    values = {key: _get(cfg, key) for key in NODE_PATH_KEYS}
    return {
        k: str(v)
        for k, v in values.items()
        if isinstance(v, str) and is_local_path(v) and not Path(v.split("#")[0]).expanduser().exists()
    }


def _replace(obj: Any, dotted: str, value: Any) -> Any:
    """A copy of the dataclass tree ``obj`` with the field at ``dotted`` set to ``value``."""
    head, _, rest = dotted.partition(".")
    return dataclasses.replace(obj, **{head: _replace(getattr(obj, head), rest, value) if rest else value})


def _as_node_names(cfg, unchecked: dict[str, str]):
    """``cfg`` with each unchecked path replaced by a name that validation, in a dry run, only names (as a hub id):
    the rules that need no file still run on every other value."""
    for key, value in unchecked.items():
        cfg = _replace(cfg, key, "unchecked/" + Path(value.split("#")[0]).name.replace(".", "-"))
    return cfg


def placeholders(tree: Any, prefix: str = "") -> list[str]:
    """``key=value`` of every string in ``tree`` (nested dicts and lists) that is still a placeholder
    (:data:`PLACEHOLDER_MARKS`)."""
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in placeholders(v, f"{prefix}{k}.")]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in placeholders(v, f"{prefix}{i}.")]
    if isinstance(tree, str) and any(m in tree for m in PLACEHOLDER_MARKS):
        return [f"{prefix.rstrip('.')}={tree}"]
    return []


def dry_run(
    overrides: Sequence[str], max_points: int | None = None, base_env: dict[str, str] | None = None, wrap: bool = False
) -> str:
    """Render the dry run for a ``gkd-train -m <overrides>`` sweep on SLURM; returns the text.

    Raises:
        ConfigError: a point's config is invalid (``gkd_harness.harness.config.validate``), naming the key, as ``gkd-train``
            would refuse it on the node.
    """
    from gkd_harness.harness.config.validate import validate_config

    master = compose(overrides)
    launcher_target = str(master.hydra.launcher.get("_target_", ""))
    if not launcher_target.endswith("SlurmLauncher"):
        raise ValueError(f"hydra/launcher must be submitit_slurm for a SLURM dry run (got {launcher_target!r})")
    launcher = cast(Dict[str, Any], OmegaConf.to_container(master.hydra.launcher, resolve=True))
    sweep_dir = Path(str(master.hydra.sweep.dir))
    points = sweep_points(master)
    nodes = int(launcher.get("nodes") or 1)
    gpus = launcher.get("gpus_per_node")

    out: list[str] = []
    out.append(f"# SLURM dry run: {len(points)} point(s), {nodes} node(s) x {gpus} GPU(s), one task per node")
    out.append(f"# sweep folder: {sweep_dir}")
    marked = placeholders({"hydra": {"launcher": launcher}, **_without_hydra(master)})
    if marked:
        out.append(f"# placeholders to fill in (configs/local/default.yaml): {', '.join(marked)}")
    out.append("# ---- sbatch script (submitit) ----")
    out.append(sbatch_script(launcher, len(points)).rstrip())
    shown = points if max_points is None else points[:max_points]
    for job in shown:
        name = point_name(job, master)
        cfg, run_dir = point_config(job, run_dir=sweep_dir / name, multirun=True)
        # the rules gkd-train applies first, as in its own dry run (what the nodes' caches and storage hold is not
        # checked from here): a bad point fails in one line, naming the key
        unchecked = unchecked_paths(cfg)
        as_dry = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dry_run=True))
        validate_config(_as_node_names(as_dry, unchecked))
        out.append(f"# ---- point {name or '(no overrides)'}  (run folder {run_dir}) ----")
        if unchecked:
            shown_paths = ", ".join(f"{k}={v}" for k, v in unchecked.items())
            out.append(f"# unchecked (not on this machine; gkd-train checks them on the node): {shown_paths}")
        for node in range(nodes):
            plan = node_plan(cfg, run_dir, node, nodes, gpus, base_env)
            cli, env = plan.argv, plan.process_env(node_slurm_env(node, nodes, gpus, base_env))
            dist = " ".join(f"{k}={env[k]}" for k in DIST_KEYS if k in env)
            out.append(f"# node {node}: {dist}")
            out.append(format_command(cli, wrap))
            out.append("  -> ms-swift runs:" if wrap else "  -> " + shlex.join(torchrun_command(cli, env)))
            if wrap:
                out.append(format_command(torchrun_command(cli, env), wrap))
    if len(shown) < len(points):
        out.append(f"# ... {len(points) - len(shown)} more point(s) not shown")
    return "\n".join(out) + "\n"


def _without_hydra(master) -> dict[str, Any]:
    tree = OmegaConf.to_container(master, resolve=False)
    assert isinstance(tree, dict)
    tree.pop("hydra", None)
    return {str(k): v for k, v in tree.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gkd_harness.launch.slurm", description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for gkd-train -m")
    parser.add_argument("--max-points", type=int, default=None, help="show the node commands of the first N points")
    parser.add_argument("--wrap", action="store_true", help="one --flag per line")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if not any(o.startswith("hydra/launcher=") for o in overrides):
        overrides.append("hydra/launcher=submitit_slurm")
    try:
        text = dry_run(
            overrides, max_points=args.max_points, wrap=args.wrap, base_env={"PATH": os.environ.get("PATH", "")}
        )
    except (ConfigError, ValueError) as e:
        print(f"python -m gkd_harness.launch.slurm: invalid config: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
