"""``gkd-train``: one GKD training run through ms-swift's own CLI (thin Hydra entry point).

``main`` only hands the composed config to :func:`train`, which does the work:

validate (before any model loads) -> skip if the run folder already says completed (sweep resume) ->
prepare the embedded assets if needed -> run folder (config.yaml, summary.json "running") -> plugin settings,
``WANDB_*`` and torchrun variables -> ``swift rlhf`` / ``megatron rlhf`` as a subprocess (output teed to
``swift.log``) -> check the world size -> summary.json "completed", or "failed" with the error (then raise).
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from harness.swift_args import ResolvedInputs, build_argv
from harness.tracking import RunFolder, flatten, redact, resolve_wandb_mode, wandb_env
from harness.validate import EMBEDDED, get, validate_config

log = logging.getLogger("gkd_harness.train")
PLUGIN_SETTINGS_FILE = "plugin_settings.json"
#: The repository's config tree (absolute: Hydra would read a relative path as a Python package).
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


class TrainingFailed(RuntimeError):
    """ms-swift's process failed, or the run did not meet the harness's own checks."""


def _container(cfg: Any) -> Dict[str, Any]:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


def resolve_inputs(cfg: Any) -> ResolvedInputs:
    """Concrete student / teacher / dataset; builds (or reuses) the embedded assets when asked for."""
    student, teacher, dataset = str(get(cfg, "model.student")), str(get(cfg, "model.teacher")), get(cfg, "run.dataset",
                                                                                                     None)
    if EMBEDDED in (student, teacher) or dataset is None:
        from harness.embedded import EmbeddedSpec, prepare_embedded

        assets = prepare_embedded(EmbeddedSpec.from_mapping(get(cfg, "model.embedded", None)))
        student = str(assets.student_dir) if student == EMBEDDED else student
        teacher = str(assets.teacher_dir) if teacher == EMBEDDED else teacher
        dataset = str(assets.dataset_path) if dataset is None else dataset
    return ResolvedInputs(student=student, teacher=teacher, dataset=str(dataset))


def resolve_device(cfg: Any) -> str:
    device = get(cfg, "run.device", "auto")
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _run_name(cfg: Any, run_dir: Path) -> str:
    name = get(cfg, "run.name", None)
    if name:
        return str(name)
    try:
        from hydra.core.hydra_config import HydraConfig

        override = HydraConfig.get().job.override_dirname
        if override:
            return str(override)
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        pass
    return run_dir.name


def plugin_settings(cfg: Any, run_dir: Path, flat_config: Dict[str, Any]) -> Dict[str, Any]:
    """What the plugin inside ms-swift needs (written to ``run_dir/plugin_settings.json``)."""
    return {
        "run_dir": str(run_dir),
        "precision": get(cfg, "loss.precision"),
        "beta_form": get(cfg, "loss.beta_form"),
        "student_dtype": get(cfg, "model.student_dtype", None),
        "teacher_dtype": get(cfg, "model.teacher_dtype", None),
        "monitor": {
            "enabled": bool(get(cfg, "monitor.enabled", True)),
            "spot_every": int(get(cfg, "monitor.spot_check.every_n_steps", 0) or 0),
            "spot_max_tokens": int(get(cfg, "monitor.spot_check.max_tokens", 256)),
            "param_grad": bool(get(cfg, "monitor.spot_check.param_grad", False)),
            "capture": bool(get(cfg, "monitor.capture", False)),
        },
        "backend": get(cfg, "backend.name"),
        "harness_config": flat_config,
    }


def subprocess_env(cfg: Any, run_dir: Path, run_name: str, wandb_mode: str, settings_path: Path,
                   launch_env: Dict[str, str], device: str = "cpu") -> Dict[str, str]:
    """Environment of the ms-swift process: ``launch_env`` (torchrun variables, from
    ``launch.env.swift_launch_env``) plus rollout extras, WANDB_* and the plugin settings path."""
    env = dict(launch_env)
    from harness.rollout import rollout_env

    extra = rollout_env(cfg, device=device)
    env.update(extra)
    if "NPROC_PER_NODE" in extra and not env.get("MASTER_PORT"):
        from launch.env import free_port

        env["MASTER_PORT"] = str(free_port())
    wcfg = _container(get(cfg, "tracking.wandb", {}))
    env.update(wandb_env(wcfg, wandb_mode, run_dir, run_name))
    env["GKD_HARNESS_PLUGIN_SETTINGS"] = str(settings_path)
    if get(cfg, "model.student") == EMBEDDED:
        env.setdefault("HF_HUB_OFFLINE", "1")  # the embedded models never need a hub
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _expected_world_size(env: Dict[str, str]) -> int:
    return int(env.get("NPROC_PER_NODE") or 1) * int(env.get("NNODES") or 1)


def _last_error_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    # Wrappers' errors (torchrun's ChildFailedError, ms-swift's CalledProcessError) only say that a rank died;
    # the rank's own error, printed before them, is the one worth reporting.
    wrappers = ("ChildFailedError", "CalledProcessError")
    errors = [line.strip() for line in lines
              if re.match(r"^\s*([A-Za-z_][\w.]*(Error|Exception)|AssertionError|KeyboardInterrupt)\b", line)]
    for line in reversed(errors):
        if not any(w in line for w in wrappers):
            return line
    if errors:
        return errors[-1]
    return lines[-1].strip() if lines else ""


def _run_subprocess(argv: List[str], env: Dict[str, str], log_path: Path) -> int:
    """Run ms-swift, teeing its output to the console and ``log_path``; returns the exit code."""
    # The CLI of the interpreter's own environment (e.g. .venv-vllm/bin/swift), even when that bin is not on PATH.
    local = Path(sys.executable).parent / argv[0]
    if local.is_file() and os.access(local, os.X_OK):
        argv = [str(local), *argv[1:]]
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for chunk in iter(lambda: proc.stdout.readline(), b""):
                logf.write(chunk)
                logf.flush()
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        return proc.wait()


def _failure(argv: List[str], rc: int, log_path: Path) -> TrainingFailed:
    how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
    return TrainingFailed(f"ms-swift ({argv[0]} {argv[1]}) failed with {how}: {_last_error_line(log_path)}")


def _launch(cfg: Any, run_dir: Path, run_name: str, wandb_mode: str, settings_path: Path, launch_env: Dict[str, str],
            log_path: Path, folder: Optional[RunFolder] = None, extra_args: Optional[List[str]] = None) -> Dict[str, str]:
    """Build argv / env, start ms-swift, raise :class:`TrainingFailed` on a non-zero exit; returns the env used.

    ``folder`` (main node only): record the resolved inputs in summary.json and the command in command.json.
    """
    inputs = resolve_inputs(cfg)
    device = resolve_device(cfg)
    env = subprocess_env(cfg, run_dir, run_name, wandb_mode, settings_path, launch_env, device=device)
    argv = build_argv(cfg, inputs, run_dir, device=device, wandb_mode=wandb_mode, run_name=run_name)
    argv += list(extra_args or [])
    if folder is not None:
        folder.update_summary(inputs={"student": inputs.student, "teacher": inputs.teacher, "dataset": inputs.dataset})
        shown = {k: v for k, v in env.items() if k.startswith(("WANDB_", "NPROC", "NNODES", "NODE_RANK", "MASTER_",
                                                                "GKD_", "VLLM_")) and k != "WANDB_API_KEY"}
        (run_dir / "command.json").write_text(json.dumps({"argv": argv, "env": shown}, indent=1))
    log.info("running: " + " ".join(argv))
    rc = _run_subprocess(argv, env, log_path)
    if rc != 0:
        raise _failure(argv, rc, log_path)
    return env


def train(cfg: Any) -> Dict[str, Any]:
    """Run one GKD training through ms-swift; returns the final ``summary.json`` content.

    Multi-node: every node runs this; only the main node (``launch.env.is_main_node``) owns the run folder's
    config.yaml / summary.json (global rank 0 writes metrics.jsonl from inside ms-swift). Other nodes start their
    ms-swift process with node-local plugin settings and raise if it fails.
    """
    from launch.env import is_main_node, swift_launch_env
    from launch.resume import resume_args

    run_dir = Path(str(get(cfg, "run.output_dir", "") or "outputs/unnamed")).expanduser().resolve()
    folder = RunFolder(run_dir)
    try:
        validate_config(cfg)
        launch_env = swift_launch_env(cfg, dict(os.environ))
    except ValueError as e:
        log.error(f"invalid config: {e}")
        raise
    if folder.is_completed():
        log.info(f"{run_dir}: summary.json says completed, skipping (sweep resume)")
        return folder.read_summary()
    container = redact(_container(cfg))
    flat = flatten(container)
    run_name = _run_name(cfg, run_dir)
    wandb_mode = resolve_wandb_mode(get(cfg, "tracking.wandb.mode", "disabled"))
    # run.resume: continue an unfinished run from its newest complete ms-swift checkpoint (launch.resume)
    resume = resume_args(bool(get(cfg, "run.resume", False)), run_dir) if folder.read_summary() else []

    if not is_main_node(launch_env):
        node = launch_env.get("NODE_RANK", "?")
        node_dir = Path(tempfile.mkdtemp(prefix=f"gkd-node{node}-"))
        settings_path = node_dir / PLUGIN_SETTINGS_FILE
        settings_path.write_text(json.dumps(plugin_settings(cfg, run_dir, flat), indent=1, default=str))
        run_dir.mkdir(parents=True, exist_ok=True)
        _launch(cfg, run_dir, run_name, wandb_mode, settings_path, launch_env, run_dir / f"swift.node{node}.log",
                extra_args=resume)
        return folder.read_summary() or {}

    if resume:
        ckpt_step = int(Path(resume[1]).name.split("-")[-1])
        kept = folder.truncate_metrics(ckpt_step)
        log.info(f"{run_dir}: resuming from {resume[1]} (metrics kept up to step {ckpt_step}: {kept} lines)")
        folder.update_summary(status="running", error=None, ended_at=None, resumed_from=resume[1])
    else:
        previous = folder.archive_previous_attempt()
        if previous is not None:
            log.info(f"{run_dir}: an earlier attempt did not complete; its files moved to {previous}")
        folder.create()
        folder.write_config(OmegaConf.to_yaml(OmegaConf.create(container)))
        folder.start_summary(run_name, get(cfg, "tracking.wandb.group", None), flat)
    try:
        folder.update_summary(wandb_mode=wandb_mode)
        settings = plugin_settings(cfg, run_dir, flat)
        if resume:
            from harness.instrument import CUMULATIVE_METRICS
            from harness.tracking import read_metrics

            rows = read_metrics(folder.metrics_path)
            settings["resume_totals"] = {k: rows[-1][k] for k in CUMULATIVE_METRICS if rows and k in rows[-1]}
        settings_path = run_dir / PLUGIN_SETTINGS_FILE
        settings_path.write_text(json.dumps(settings, indent=1, default=str))
        env = _launch(cfg, run_dir, run_name, wandb_mode, settings_path, launch_env, run_dir / "swift.log", folder,
                      extra_args=resume)
        expected = _expected_world_size(env)
        seen = (folder.read_summary() or {}).get("world_size")
        if seen is None:
            raise TrainingFailed("the harness plugin never reported (was --external_plugins loaded?)")
        if expected > 1 and int(seen) != expected:
            raise TrainingFailed(f"expected a process group of {expected} ranks but training saw world size {seen}: "
                                 "ranks trained alone (on CPU, --use_cpu true is required for gloo DDP)")
    except BaseException as e:
        folder.finish_summary("failed", f"{type(e).__name__}: {e}")
        raise
    return folder.finish_summary("completed", None)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> Optional[float]:
    """Hydra entry point (``gkd-train``): compose, then :func:`train`."""
    summary = train(cfg)
    return summary.get("last_step") if summary else None


if __name__ == "__main__":  # pragma: no cover
    main()
