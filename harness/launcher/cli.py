"""``gkd-train``: one GKD training run through ms-swift's own CLI (thin Hydra entry point).

``main`` hands the composed config to :func:`train`, which does the work:

typed config (once) -> validation (before any model loads) -> the launch plan (``harness.launcher.plan``) ->
with ``run.dry_run=true``: print the plan and stop -> skip if the run folder already completed with the same
config -> run folder (config.yaml, summary.json "running") -> plugin settings (the typed config serialised) ->
``swift rlhf`` / ``megatron rlhf`` as a subprocess (output to ``swift.log``) -> summary.json "completed", or
"failed" with the error.

Exit codes: 0 completed (or skipped), 1 the run failed, 2 a config or input error.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from harness.config.schema import ConfigError, TrainConfig, to_dict, to_typed
from harness.launcher.plan import LaunchPlan, build_plan, resolve_inputs
from harness.store.run_folder import harness_version
from harness.contract import PLUGIN_SETTINGS_FILE, SWIFT_LOG

log = logging.getLogger("gkd_harness.train")
EXIT_FAILED, EXIT_CONFIG = 1, 2


class TrainingFailed(RuntimeError):
    """ms-swift's process failed, or the run did not meet the harness's own checks."""


def _hydra_run_name() -> Optional[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().job.override_dirname or None
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        return None


def run_name_for(cfg: TrainConfig, run_dir: Path) -> str:
    """``run.name``, else Hydra's override_dirname, else the run folder's name."""
    return cfg.run.name or _hydra_run_name() or run_dir.name


def plugin_settings(cfg: TrainConfig, run_dir: Path, experiment: Optional[str] = None) -> Dict[str, Any]:
    """What the plugin inside ms-swift's ranks receives: the run folder, the typed config serialised and the
    ``experiment=`` choice (added to the wandb run's config)."""
    return {"run_dir": str(run_dir), "config": to_dict(cfg), "experiment": experiment,
            "harness_version": harness_version()}


def _wandb_mode(cfg: TrainConfig, dry_run: bool) -> str:
    from harness.launcher.wandb_env import resolve_wandb_mode

    mode = cfg.tracking.wandb.mode
    return mode if dry_run else resolve_wandb_mode(mode)


def _wandb_vars(cfg: TrainConfig, mode: str, run_dir: Path, run_name: str,
                experiment: Optional[str]) -> Dict[str, str]:
    import dataclasses

    from harness.store.run_folder import config_fingerprint
    from harness.launcher.wandb_env import experiment_name, wandb_env
    from harness.config.flat import flatten
    from harness.config.secrets import redact

    return wandb_env(dataclasses.asdict(cfg.tracking.wandb), mode, run_dir, run_name,
                     precision=cfg.loss.precision, beta_form=cfg.loss.beta_form,
                     experiment=experiment or experiment_name(),
                     fingerprint=config_fingerprint(flatten(redact(to_dict(cfg)))))


def make_plan(cfg: TrainConfig, run_dir: Path, base_env: Optional[Dict[str, str]] = None, dry_run: bool = False,
              extra_args: Sequence[str] = (), settings_path: Optional[Path] = None,
              experiment: Optional[str] = None) -> LaunchPlan:
    """The launch plan of this node for ``cfg`` (nothing is built in a dry run).

    ``experiment``: the ``experiment=`` choice (a wandb tag); None reads it from the running Hydra app.
    """
    base_env = dict(os.environ if base_env is None else base_env)
    run_name = run_name_for(cfg, run_dir)
    mode = _wandb_mode(cfg, dry_run)
    wandb_vars = _wandb_vars(cfg, mode, run_dir, run_name, experiment)
    return build_plan(cfg, base_env, run_dir, run_name, mode, wandb_vars, settings_path,
                      resolve_inputs(cfg, build=not dry_run), extra_args=extra_args)


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


def _run_subprocess(argv: List[str], env: Dict[str, str], log_path: Path, stream: bool) -> int:
    """Run ms-swift, writing its output to ``log_path`` (and the console when ``stream``); returns the exit code."""
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
                if stream:
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
    return TrainingFailed(f"ms-swift ({Path(argv[0]).name} {argv[1]}) failed with {how}: "
                          f"{_last_error_line(log_path)} (log: {log_path})")


def _execute(plan: LaunchPlan, log_path: Path, stream: bool, progress_of: Optional[tuple] = None) -> None:
    """Run the plan; ms-swift's output goes to ``log_path`` (and the console when ``stream``). ``progress_of``
    (label, metrics.jsonl, max_steps) shows a live progress line for a single run."""
    import threading

    log.debug("running: " + " ".join(plan.argv))
    stop = threading.Event()
    watcher = None
    if progress_of is not None and not stream and not _is_multirun():
        watcher = threading.Thread(target=_show_progress, args=(*progress_of, stop), daemon=True)
        watcher.start()
    try:
        rc = _run_subprocess(plan.argv, plan.process_env(os.environ), log_path, stream)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(timeout=5)
    if rc != 0:
        raise _failure(plan.argv, rc, log_path)


def _show_progress(label: str, metrics: Path, max_steps: int, stop, every_s: float = 2.0) -> None:
    """A single run's live progress line, fed from its metrics.jsonl until ``stop`` is set."""
    from harness.launcher.progress import ProgressDisplay, Snapshot
    from harness.store.run_folder import tail_step

    display = ProgressDisplay()

    def snapshot(final: bool) -> Snapshot:
        step = tail_step(metrics) or 0
        finished = final and step >= max_steps
        return Snapshot(label=f"run {label}", total=1, done=int(finished), failed=int(final and not finished),
                        running=None if final else label, step=step, max_steps=max_steps)

    try:
        while not stop.wait(every_s):
            display.update(snapshot(False))
        display.update(snapshot(True))
    finally:
        display.close()


def dry_run(cfg: TrainConfig, run_dir: Path, base_env: Optional[Dict[str, str]] = None,
            experiment: Optional[str] = None) -> str:
    """The plan as text (argv and torchrun variables); loads nothing, starts nothing, writes nothing."""
    plan = make_plan(cfg, run_dir, base_env=base_env, dry_run=True, experiment=experiment)
    return f"# gkd-train dry run: run folder {run_dir}\n" + plan.render()


def train(cfg: Any, experiment: Optional[str] = None) -> Dict[str, Any]:
    """Run one GKD training through ms-swift; returns the final ``summary.json`` content.

    Multi-node: every node runs this; only the main node (``harness.launcher.node.is_main_node``) owns the run folder
    (its lock, config.yaml, summary.json; the rank that computes the loss writes metrics.jsonl from inside
    ms-swift). Other nodes start their ms-swift process with node-local plugin settings and raise if it fails.

    Raises:
        ConfigError: an invalid config (before any model loads or anything is written).
        RunFolderError: the folder is owned by a live run, holds a completed run of another config, or cannot be
            written (the message names the folder / file).
        TrainingFailed: ms-swift failed, or the run did not meet the harness's checks.
    """
    from harness.launcher.node import is_main_node
    from harness.config.validate import validate_config

    cfg = to_typed(cfg)
    validate_config(cfg)
    run_dir = Path(cfg.run.output_dir).expanduser().resolve()
    if cfg.run.dry_run:
        sys.stdout.write(dry_run(cfg, run_dir, experiment=experiment))
        return {"status": "dry_run"}
    make_plan(cfg, run_dir, dry_run=True, experiment=experiment)  # the layout's checks, before anything is written
    if not is_main_node(dict(os.environ)):
        return _train_other_node(cfg, run_dir, experiment)
    from harness.store.run_folder import RunFolder

    folder = RunFolder(run_dir)
    with folder.lock():
        return _train_main_node(cfg, run_dir, folder, experiment)


def _train_other_node(cfg: TrainConfig, run_dir: Path, experiment: Optional[str]) -> Dict[str, Any]:
    from harness.launcher.resume import resume_args
    from harness.store.run_folder import RunFolder

    env = dict(os.environ)
    node = env.get("NODE_RANK") or env.get("SLURM_NODEID", "?")
    settings_path = Path(tempfile.mkdtemp(prefix=f"gkd-node{node}-")) / PLUGIN_SETTINGS_FILE
    settings_path.write_text(json.dumps(plugin_settings(cfg, run_dir, experiment), indent=1))
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan(cfg, run_dir, extra_args=resume_args(cfg.run.resume, run_dir), settings_path=settings_path,
                     experiment=experiment)
    _execute(plan, run_dir / f"swift.node{node}.log", stream=cfg.run.verbose)
    return RunFolder(run_dir).read_summary_quietly() or {}


def _train_main_node(cfg: TrainConfig, run_dir: Path, folder, experiment: Optional[str]) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    from harness.launcher.resume import resume_args
    from harness.config.flat import flatten
    from harness.config.secrets import redact

    flat = flatten(redact(to_dict(cfg)))
    prior = folder.check_prior(flat, overwrite=cfg.run.overwrite, resume=cfg.run.resume)
    if prior.action == "skip":
        log.info(f"{run_dir}: completed earlier with the same config, skipping")
        return prior.summary
    resume = resume_args(True, run_dir) if prior.action == "resume" else []
    if prior.action == "restart":
        if prior.differing:
            log.info(f"{run_dir}: the earlier attempt differs in {', '.join(prior.differing)}")
        reason = "run.overwrite=true" if cfg.run.overwrite else "an unfinished attempt is restarted"
        previous = folder.archive_previous_attempt(reason=reason)
        if previous is not None:
            log.info(f"{run_dir}: the earlier attempt moved to {previous}")
    _save_hydra_files(run_dir)
    if resume:
        ckpt_step = int(Path(resume[1]).name.split("-")[-1])
        kept = folder.truncate_metrics(ckpt_step)
        log.info(f"{run_dir}: resuming from {resume[1]} (metrics kept up to step {ckpt_step}: {kept} lines)")
        folder.update_summary(status="running", error=None, ended_at=None, resumed_from=resume[1])
    else:
        folder.create()
        folder.write_config(OmegaConf.to_yaml(OmegaConf.create(redact(to_dict(cfg)))))
        folder.start_summary(run_name_for(cfg, run_dir), cfg.tracking.wandb.group, flat)
    try:
        settings = plugin_settings(cfg, run_dir, experiment)
        if resume:
            from harness.contract import CUMULATIVE_METRICS
            from harness.store.run_folder import read_metrics

            rows = read_metrics(folder.metrics_path)
            settings["resume_totals"] = {k: rows[-1][k] for k in CUMULATIVE_METRICS if rows and k in rows[-1]}
        settings_path = folder.write_json(PLUGIN_SETTINGS_FILE, settings)
        plan = make_plan(cfg, run_dir, extra_args=resume, settings_path=settings_path, experiment=experiment)
        folder.update_summary(wandb_mode=plan.env.get("WANDB_MODE", "disabled"), experiment=experiment,
                              inputs={"student": plan.inputs.student, "teacher": plan.inputs.teacher,
                                      "dataset": plan.inputs.dataset})
        folder.write_json("command.json", {"argv": plan.argv, "env": plan.shown_env()})
        _execute(plan, run_dir / SWIFT_LOG, stream=cfg.run.verbose,
                 progress_of=(run_name_for(cfg, run_dir), folder.metrics_path, cfg.run.max_steps))
        seen = (folder.read_summary() or {}).get("world_size")
        if seen is None:
            raise TrainingFailed("the harness plugin never reported (was --external_plugins loaded?)")
        expected = plan.layout.world_size
        if expected > 1 and int(seen) != expected:
            raise TrainingFailed(f"expected a process group of {expected} ranks but training saw world size {seen}: "
                                 "ranks trained alone (on CPU, --use_cpu true is required for gloo DDP)")
    except BaseException as e:
        folder.record_failure(f"{type(e).__name__}: {e}")
        raise
    return folder.finish_summary("completed", None)


def _save_hydra_files(run_dir: Path) -> None:
    """Hydra's .hydra/ files, written once the run owns its folder and will run (``hydra.output_subdir`` is null,
    so a skipped point's .hydra/ stays untouched); nothing outside a Hydra app."""
    try:
        from hydra.core.hydra_config import HydraConfig

        HydraConfig.get()
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        return
    from harness.store.run_folder import save_hydra_files

    save_hydra_files(run_dir, _TASK_CFG[0] if _TASK_CFG else None)


# ------------------------------------------------------------------------------------------------ entry point
def _is_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001
        return False


def _verbose(cfg: Any) -> bool:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return True
    try:
        return bool(cfg.run.verbose)
    except Exception:  # noqa: BLE001
        return False


@dataclass(frozen=True)
class PointFailed:
    """What a sweep point's job returns when it failed: Hydra then goes on with the other points, and the sweep
    callback records the failure and makes the sweep exit 1, without a traceback per point."""

    code: int
    error: str


_TASK_CFG: list = []  # the Hydra task config of this job (for .hydra/ files written by the harness)


def _exit_code(e: BaseException) -> tuple[int, str]:
    from harness.store.run_folder import ConfigMismatch, RunFolderBusy

    if isinstance(e, ConfigError):
        return EXIT_CONFIG, "invalid config"
    if isinstance(e, (RunFolderBusy, ConfigMismatch)):
        return EXIT_CONFIG, "refused"
    return EXIT_FAILED, "run failed"


def _job(cfg) -> Optional[int]:
    """The Hydra job: :func:`train`, with one-line errors. A single run exits 2 (config error, busy or mismatched
    folder) or 1 (failed run); in a sweep the error is re-raised so Hydra records the point as failed and the
    other points go on."""
    from harness.store.run_folder import RunFolderError
    from harness.launcher.wandb_env import experiment_name

    _TASK_CFG[:] = [cfg]
    try:
        summary = train(cfg, experiment=experiment_name())
    except (ConfigError, TrainingFailed, RunFolderError) as e:
        code, what = _exit_code(e)
        print(f"gkd-train: {what}: {e}", file=sys.stderr)
        if _verbose(cfg):
            raise
        if _is_multirun():
            return PointFailed(code, f"{type(e).__name__}: {e}")
        sys.exit(code)
    return summary.get("last_step") if summary else None


def _hydra_main() -> None:
    import hydra

    from harness.launcher.compose import CONFIG_NAME, CONFIG_PATH, register

    register()
    hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(_job)()


def _flag_value(args: Sequence[str], key: str) -> Optional[str]:
    for a in args:
        k, sep, v = a.partition("=")
        if sep and k.lstrip("+~") == key:
            return v
    return None


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``gkd-train [overrides]``: ``--version``; credential overrides refused before Hydra writes anything;
    ``run.dry_run=true`` composes the config and prints the plan without creating a run folder."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args:
        print(f"gkd-train (gkd-harness) {harness_version()}")
        return
    from harness.config.secrets import secret_overrides, secret_refusal

    overrides = [a for a in args if not a.startswith("-")]
    try:
        for key in secret_overrides(overrides):
            raise ConfigError(key, secret_refusal(key))
        dry = (_flag_value(overrides, "run.dry_run") or "").lower() in ("true", "1", "yes")
        if dry and not any(a in ("-m", "--multirun") or a.startswith("--") for a in args):
            from harness.launcher.compose import compose_point

            point = compose_point(overrides)
            train(point.cfg, experiment=point.experiment)
            return
    except ConfigError as e:
        print(f"gkd-train: invalid config: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    if argv is not None:
        sys.argv = [sys.argv[0], *args]
    _hydra_main()


if __name__ == "__main__":  # pragma: no cover
    # `python -m harness.launcher.cli`: run the importable module's main, so that what a job returns (PointFailed) is the
    # class launch.sweep imports, not a __main__ copy of it
    from harness.launcher.cli import main as _module_main

    _module_main()
