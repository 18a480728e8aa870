"""Running the real ``gkd-train`` from tests (subprocesses; no mocks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from gkd_harness.harness.config.schema import TrainConfig
from gkd_harness.harness.launcher.compose import CONFIG_MODULE, point_config, register
from gkd_harness.harness.launcher.compose import compose as compose_train

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def compose(overrides, config_name="train"):
    """Hydra's compose API on the packaged config tree (``gkd_harness.configs``): ``train`` with its hydra node
    (``gkd_harness.harness.launcher.compose.compose``), or any other config of the tree composed on its own (e.g. ``signoff/default``)."""
    if config_name == "train":
        return compose_train(overrides)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    register()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def task_config(overrides: Sequence[str], run_dir="/tmp/run", multirun: bool = False) -> TrainConfig:
    """The typed config a ``gkd-train`` job of ``overrides`` sees (real Hydra composition), run folder ``run_dir``."""
    return point_config(list(overrides), run_dir=Path(run_dir), multirun=multirun)[0]


def harness_env(output_root: Path, **extra: str) -> dict[str, str]:
    """Environment for a gkd-train subprocess: outputs under ``output_root``, no hub, no stale rendezvous.

    The embedded models are cached where gkd_harness.harness.fixtures.embedded puts them (``$GKD_HARNESS_CACHE``, set by the
    session fixture ``embedded_cache`` in tests/conftest.py), so every test shares one build.
    """
    env = dict(os.environ)
    for key in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "WANDB_API_KEY"):
        env.pop(key, None)
    env.update(
        GKD_OUTPUT_ROOT=str(output_root),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        WANDB_SILENT="true",
    )
    env.update(extra)
    return env


def gkd_train_cmd(overrides: Sequence[str], multirun: bool = False) -> list[str]:
    """``gkd-train [-m] overrides...`` through the same entry point as the console script."""
    return [sys.executable, "-m", "gkd_harness.harness.launcher.cli", *(["-m"] if multirun else []), *overrides]


def run_gkd_train(
    overrides: Sequence[str], env: dict[str, str], cwd: Path, multirun: bool = False, timeout: float = 900
) -> subprocess.CompletedProcess:
    return subprocess.run(
        gkd_train_cmd(overrides, multirun), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_two_localhost_nodes(tmp_path: Path, port: str, node_overrides) -> tuple[list[int], dict[int, str]]:
    """``gkd-train`` as node 0 and node 1 of a 2-node localhost rendezvous at ``port``, in parallel;
    ``node_overrides(node)`` gives each node's overrides. Returns the exit codes and each node's console output."""
    procs, logs = [], []
    for node in (0, 1):
        env = harness_env(tmp_path / "out", NNODES="2", NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        log = open(tmp_path / f"node{node}.log", "w")
        logs.append(log)
        cmd = gkd_train_cmd([*node_overrides(node), f"hydra.run.dir={tmp_path}/hydra{node}"])
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        rcs = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    return rcs, {n: (tmp_path / f"node{n}.log").read_text() for n in (0, 1)}


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


def wandb_records(path: Path):
    """Protobuf ``Record``s of an offline ``run-*.wandb`` file, read by the harness's one reader
    (:func:`gkd_harness.analysis.sweep.wandb_file.read_records`)."""
    from gkd_harness.analysis.sweep.wandb_file import read_records

    yield from read_records(Path(path))


def wandb_offline_run(run_dir: Path):
    """(RunRecord, [history dicts]) of the single offline wandb run under ``run_dir/wandb``."""
    files = sorted(Path(run_dir, "wandb").rglob("run-*.wandb"))
    assert len(files) == 1, f"expected one offline wandb run under {run_dir}/wandb, found {files}"
    run, history = None, []
    for rec in wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "run" and run is None:
            run = rec.run
        elif kind == "history":
            history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            )
    return run, history


def with_value(cfg: TrainConfig, key: str, value) -> TrainConfig:
    """A copy of ``cfg`` with the dotted ``key`` set to ``value``, rebuilt through ``gkd_harness.harness.config.schema.from_dict`` (for
    values a Hydra override cannot express, such as an empty string where the job would see its run folder)."""
    from gkd_harness.harness.config.schema import from_dict, to_dict

    data = to_dict(cfg)
    node = data
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return from_dict(data)
