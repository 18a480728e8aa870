"""One run of ``gkd-train``: typed config (once) -> validation (before any model loads) -> the launch plan
(``gkd_harness.harness.launcher.plan``) -> with ``run.dry_run=true``: print the plan and stop -> the attempt decision
(``gkd_harness.harness.launcher.resume.decide_attempt``: skip, fresh, restart or resume) -> run folder (config.yaml, summary.json
"running") -> plugin settings (:class:`gkd_harness.harness.contract.PluginSettings`) -> ``swift rlhf`` / ``megatron rlhf`` as a
subprocess (``gkd_harness.harness.launcher.process``) -> the harness's checks of what the rank reported (the plugin
loaded, the process group had its ranks, the training steps called the harness's loss: :func:`loss_bypass_error`)
-> summary.json "completed", or "failed" with the error, or "interrupted" with the signal (SIGTERM / SIGHUP / SIGINT:
ms-swift's process group stopped, the lock released)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence

from gkd_harness.harness.config.schema import ConfigError, TrainConfig, to_dict, to_typed
from gkd_harness.harness.contract import (
    CANDIDATE,
    LOSS_CALLS_FIELD,
    PLUGIN_SETTINGS_FILE,
    STEPS_TRAINED_FIELD,
    SWIFT_LOG,
    PluginSettings,
)
from gkd_harness.harness.launcher.plan import LaunchPlan, build_plan, resolve_inputs
from gkd_harness.harness.launcher.process import Interrupted, TrainingFailed, execute, stop_signals

if TYPE_CHECKING:
    from gkd_harness.harness.store.run_folder import RunFolder

log = logging.getLogger("gkd_harness.train")


def _hydra_run_name() -> Optional[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().job.override_dirname or None
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        return None


def loss_bypass_error(summary: Mapping[str, Any]) -> Optional[str]:
    """The failure of a run whose training steps did not all call the harness's ``gkd_loss``, None otherwise.

    ``summary``: ``summary.json`` after ms-swift exited 0, with the writer rank's ``loss_calls`` (training calls of
    the installed loss, counted in every monitor mode) and ``steps_trained`` (optimizer steps this attempt trained).
    ms-swift's GKD trainers call ``gkd_loss`` once per training micro-batch (HF ``compute_loss``, Megatron's
    ``loss_func`` on the last stage), so a step trained is at least one call. Fewer calls than steps: something
    routed the loss past the harness (a fused-loss flag such as ``--use_liger_kernel``, a plugin that rebinds
    ``gkd_loss`` or the trainer's loss method after train begin, ...), on every step (no call at all: the run
    measured nothing of the chosen variant) or on some; such a run must not reach the sign-off as "completed". No
    judgement (None) without both counts (the rank never reported them) or without a step trained (a resume at its
    last step).
    """
    steps, calls = summary.get(STEPS_TRAINED_FIELD), summary.get(LOSS_CALLS_FIELD)
    if type(steps) is not int or type(calls) is not int or steps <= 0 or calls >= steps:  # bool is no count
        return None
    counts = f"(summary.json: {LOSS_CALLS_FIELD}={calls}, {STEPS_TRAINED_FIELD}={steps})"
    how = (
        "a fused-loss flag such as --use_liger_kernel, an external plugin rebinding gkd_loss or the trainer's loss "
        "method, ..."
    )
    s = "s" if steps != 1 else ""
    if calls == 0:
        return (
            f"the harness's gkd_loss was never called in {steps} training step{s}: something bypassed it ({how}); "
            f"the run measured nothing {counts}"
        )
    return (
        f"the harness's gkd_loss was called {calls} time{'s' if calls != 1 else ''} in {steps} training steps (each "
        f"step calls it at least once): something bypassed it on some steps ({how}); the run measured only part of "
        f"its training {counts}"
    )


def run_name_for(cfg: TrainConfig, run_dir: Path) -> str:
    """``run.name``, else Hydra's override_dirname, else the run folder's name."""
    return cfg.run.name or _hydra_run_name() or run_dir.name


def plugin_settings(
    cfg: TrainConfig, run_dir: Path, experiment: Optional[str] = None, resume_totals: Optional[Dict[str, float]] = None
) -> PluginSettings:
    """What the plugin inside ms-swift's ranks receives: the run folder, the typed config serialised, the
    ``experiment=`` choice (added to the wandb run's config) and, for a resumed run, its cumulative totals."""
    return PluginSettings(
        config=to_dict(cfg), run_dir=str(run_dir), experiment=experiment, resume_totals=dict(resume_totals or {})
    )


def _wandb_mode(cfg: TrainConfig, dry_run: bool) -> str:
    from gkd_harness.harness.launcher.wandb_env import resolve_wandb_mode

    mode = cfg.tracking.wandb.mode
    return mode if dry_run else resolve_wandb_mode(mode)


def _wandb_vars(cfg: TrainConfig, mode: str, run_dir: Path, run_name: str, experiment: Optional[str]) -> Dict[str, str]:
    from gkd_harness.harness.config.flat import flatten
    from gkd_harness.harness.config.secrets import redact
    from gkd_harness.harness.launcher.wandb_env import experiment_name, wandb_env
    from gkd_harness.harness.loss.candidate import candidate_tags
    from gkd_harness.harness.store.fingerprint import config_fingerprint

    return wandb_env(
        dataclasses.asdict(cfg.tracking.wandb),
        mode,
        run_dir,
        run_name,
        precision=cfg.loss.precision,
        beta_form=cfg.loss.beta_form,
        experiment=experiment or experiment_name(),
        fingerprint=config_fingerprint(flatten(redact(to_dict(cfg)))),
        loss_tags=candidate_tags(cfg.loss.precision, cfg.loss.source, cfg.loss.name),
    )


def make_plan(
    cfg: TrainConfig,
    run_dir: Path,
    base_env: Optional[Dict[str, str]] = None,
    dry_run: bool = False,
    extra_args: Sequence[str] = (),
    settings_path: Optional[Path] = None,
    experiment: Optional[str] = None,
) -> LaunchPlan:
    """The launch plan of this node for ``cfg`` (nothing is built in a dry run).

    ``experiment``: the ``experiment=`` choice (a wandb tag); None reads it from the running Hydra app.
    """
    base_env = dict(os.environ if base_env is None else base_env)
    run_name = run_name_for(cfg, run_dir)
    mode = _wandb_mode(cfg, dry_run)
    wandb_vars = _wandb_vars(cfg, mode, run_dir, run_name, experiment)
    return build_plan(
        cfg,
        base_env,
        run_dir,
        run_name,
        mode,
        wandb_vars,
        settings_path,
        resolve_inputs(cfg, build=not dry_run),
        extra_args=extra_args,
    )


def dry_run(
    cfg: TrainConfig, run_dir: Path, base_env: Optional[Dict[str, str]] = None, experiment: Optional[str] = None
) -> str:
    """The plan as text (argv and torchrun variables); loads nothing, starts nothing, writes nothing."""
    plan = make_plan(cfg, run_dir, base_env=base_env, dry_run=True, experiment=experiment)
    return f"# gkd-train dry run: run folder {run_dir}\n" + plan.render()


def train(
    cfg: Any, experiment: Optional[str] = None, hydra_task_cfg: Any = None, multirun: bool = False
) -> Dict[str, Any]:
    """Run one GKD training through ms-swift; returns the final ``summary.json`` content.

    ``hydra_task_cfg``: the job's config as Hydra composed it (saved, redacted, as ``.hydra/config.yaml``; None
    outside a Hydra app); ``multirun``: a sweep point (no live progress line of its own).

    Multi-node: every node runs this; only the main node (``gkd_harness.harness.launcher.node.is_main_node``) owns the run folder
    (its lock, config.yaml, summary.json; the rank that computes the loss writes metrics.jsonl from inside
    ms-swift). Other nodes start their ms-swift process with node-local plugin settings and raise if it fails.

    Raises:
        ConfigError: an invalid config (before any model loads or anything is written).
        RunFolderError: the folder is owned by a live run, holds a completed run of another config, or cannot be
            written (the message names the folder / file).
        TrainingFailed: ms-swift failed, or the run did not meet the harness's checks.
    """
    from gkd_harness.harness.config.validate import validate_config
    from gkd_harness.harness.launcher.node import is_main_node

    cfg = to_typed(cfg)
    validate_config(cfg)
    run_dir = Path(cfg.run.output_dir).expanduser().resolve()
    if cfg.run.dry_run:
        sys.stdout.write(dry_run(cfg, run_dir, experiment=experiment))
        return {"status": "dry_run"}
    make_plan(cfg, run_dir, dry_run=True, experiment=experiment)  # the layout's checks, before anything is written
    # SIGTERM / SIGHUP / SIGINT raise Interrupted: ms-swift's process group is stopped, summary.json says
    # "interrupted", the lock is released on the way out (the caller exits 128 + signum)
    with stop_signals():
        if not is_main_node(dict(os.environ)):
            return _train_other_node(cfg, run_dir, experiment)
        from gkd_harness.harness.store.run_folder import RunFolder

        folder = RunFolder(run_dir)
        with folder.lock():
            return _train_main_node(cfg, run_dir, folder, experiment, hydra_task_cfg, multirun)


def _train_other_node(cfg: TrainConfig, run_dir: Path, experiment: Optional[str]) -> Dict[str, Any]:
    from gkd_harness.harness.launcher.resume import resume_args
    from gkd_harness.harness.store.run_folder import RunFolder

    env = dict(os.environ)
    node = env.get("NODE_RANK") or env.get("SLURM_NODEID", "?")
    settings_path = Path(tempfile.mkdtemp(prefix=f"gkd-node{node}-")) / PLUGIN_SETTINGS_FILE
    plugin_settings(cfg, run_dir, experiment).write(settings_path)
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan(
        cfg,
        run_dir,
        extra_args=resume_args(cfg.run.resume, run_dir),
        settings_path=settings_path,
        experiment=experiment,
    )
    execute(plan, run_dir / f"swift.node{node}.log", stream=cfg.run.verbose)
    return RunFolder(run_dir).read_summary_quietly() or {}


def _train_main_node(
    cfg: TrainConfig, run_dir: Path, folder: RunFolder, experiment: Optional[str], hydra_task_cfg: Any, multirun: bool
) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    from gkd_harness.harness.config.flat import flatten
    from gkd_harness.harness.config.secrets import redact
    from gkd_harness.harness.launcher.resume import decide_attempt
    from gkd_harness.harness.store.provenance import data_sha256
    from gkd_harness.harness.store.records import Command

    flat = flatten(redact(to_dict(cfg)))
    attempt = decide_attempt(folder, flat, overwrite=cfg.run.overwrite, resume=cfg.run.resume)
    for note in attempt.notes:
        log.info(f"{run_dir}: {note}")
    if attempt.action == "skip":  # decide_attempt skips only a completed run, so its summary is there
        return attempt.summary or {}
    resume = attempt.resume_args
    _save_hydra_files(run_dir, hydra_task_cfg)
    ckpt_step = attempt.checkpoint_step
    if resume and ckpt_step is not None:  # a resume always names its checkpoint's step (decide_attempt)
        kept = folder.truncate_metrics(ckpt_step)
        log.info(f"{run_dir}: resuming from {resume[1]} (metrics kept up to step {ckpt_step}: {kept} lines)")
        folder.update_summary(
            status="running",
            error=None,
            ended_at=None,
            resumed_from=resume[1],
            **{LOSS_CALLS_FIELD: None, STEPS_TRAINED_FIELD: None},  # this attempt's rank reports its own
        )
    else:
        folder.create()
        folder.write_config(OmegaConf.to_yaml(OmegaConf.create(redact(to_dict(cfg)))))
        folder.start_summary(run_name_for(cfg, run_dir), cfg.tracking.wandb.group, flat)
    if cfg.loss.precision == CANDIDATE:  # its source copied into the folder; name and sha256 in summary.json
        from gkd_harness.harness.loss.candidate import keep_in_run_folder

        if not cfg.loss.source:  # validate_config refuses this before; a caller that skipped it gets the same line
            raise ConfigError("loss.source", "must be set with loss.precision=candidate")
        folder.update_summary(candidate=keep_in_run_folder(cfg.loss.source, cfg.loss.name, str(run_dir)))
    try:
        totals = None
        if resume:
            from gkd_harness.harness.contract import CUMULATIVE_METRICS
            from gkd_harness.harness.store.metrics_io import read_metrics

            rows = read_metrics(folder.metrics_path)
            totals = {k: rows[-1][k] for k in CUMULATIVE_METRICS if rows and k in rows[-1]}
        settings = plugin_settings(cfg, run_dir, experiment, resume_totals=totals)
        settings_path = folder.write_json(PLUGIN_SETTINGS_FILE, dataclasses.asdict(settings))
        plan = make_plan(cfg, run_dir, extra_args=resume, settings_path=settings_path, experiment=experiment)
        if resume:  # the same wandb run, rewound to the checkpoint (harness/launcher/resume.py)
            from gkd_harness.harness.launcher.resume import rewind_wandb_env

            rewound = rewind_wandb_env(plan.env, attempt.wandb_step)
            plan.env.clear()
            plan.env.update(rewound)
        folder.update_summary(
            wandb_mode=plan.env.get("WANDB_MODE", "disabled"),
            experiment=experiment,
            inputs={"student": plan.inputs.student, "teacher": plan.inputs.teacher, "dataset": plan.inputs.dataset},
            data_sha256=data_sha256({**flat, "run.dataset": plan.inputs.dataset}),  # the files as resolved
            device=plan.device,  # cpu or cuda, as planned (the rank adds its torch build's CUDA and GPU: "runtime")
        )
        folder.write_command(Command(tuple(plan.argv), plan.shown_env()))
        execute(
            plan,
            run_dir / SWIFT_LOG,
            stream=cfg.run.verbose,
            progress_of=None if multirun else (run_name_for(cfg, run_dir), folder.metrics_path, cfg.run.max_steps),
        )
        reported = folder.read_summary() or {}
        seen = reported.get("world_size")
        if seen is None:
            raise TrainingFailed("the harness plugin never reported (was --external_plugins loaded?)")
        expected = plan.layout.world_size
        if expected > 1 and int(seen) != expected:
            raise TrainingFailed(
                f"expected a process group of {expected} ranks but training saw world size {seen}: "
                "ranks trained alone (on CPU, --use_cpu true is required for gloo DDP)"
            )
        bypassed = loss_bypass_error(reported)
        if bypassed:
            raise TrainingFailed(bypassed)
    except Interrupted as e:
        folder.record_interrupt(e.signal_name)
        raise
    except BaseException as e:
        folder.record_failure(f"{type(e).__name__}: {e}")
        raise
    return folder.finish_summary("completed", None)


def _save_hydra_files(run_dir: Path, hydra_task_cfg: Any) -> None:
    """Hydra's .hydra/ files, written once the run owns its folder and will run (``hydra.output_subdir`` is null,
    so a skipped point's .hydra/ stays untouched); nothing without a Hydra job's config (a direct call)."""
    if hydra_task_cfg is None:
        return
    from gkd_harness.harness.store.hydra_files import save_hydra_files

    save_hydra_files(run_dir, hydra_task_cfg)
