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
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence

from gkd_harness.harness.config.schema import ConfigError, TrainConfig, to_dict, to_typed
from gkd_harness.harness.contract import (
    CANDIDATE,
    LOSS_CALLS_FIELD,
    PLUGIN_SETTINGS_FILE,
    STEPS_TRAINED_FIELD,
    SWIFT_LOG,
    PluginSettings,
    swift_node_log,
)
from gkd_harness.harness.launcher.plan import LaunchPlan, build_plan, resolve_inputs
from gkd_harness.harness.launcher.process import Interrupted, TrainingFailed, execute, stop_signals
from gkd_harness.harness.launcher.resume import ResumePoint

if TYPE_CHECKING:
    from gkd_harness.harness.store.run_folder import RunFolder

log = logging.getLogger("gkd_harness.train")

#: ``summary.json``'s fields that describe one attempt's end, as a new attempt starts them: a resumed attempt
#: starts from these, never from the previous attempt's (its rank reports its own loss calls and steps trained)
ATTEMPT_STATUS_FIELDS: Dict[str, Any] = {
    "status": "running",
    "error": None,
    "signal": None,
    "ended_at": None,
    "wall_s": None,
    "warnings": [],
    LOSS_CALLS_FIELD: None,
    STEPS_TRAINED_FIELD: None,
}


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


def wandb_lost_warning(run_dir: Path, env: Mapping[str, str]) -> Optional[str]:
    """The warning of a run whose wandb files are gone when it ends, None otherwise (or with wandb disabled).

    ``env``: the plan's ``WANDB_*`` variables. The rank that owns the wandb run writes ``run-<WANDB_RUN_ID>.wandb``
    under the run folder's ``wandb/`` in either mode (offline: what ``wandb sync`` uploads; online: wandb's local
    transaction log). None there at the end: the folder was deleted (or moved) while the run ran, and the wandb run
    with it; before, such a run ended "completed" without a word. ``metrics.jsonl`` still holds every step.
    """
    from gkd_harness.harness.contract import WANDB_DIR
    from gkd_harness.harness.store.wandb_file import wandb_files

    run_id, mode = env.get("WANDB_RUN_ID"), env.get("WANDB_MODE", "disabled")
    if mode == "disabled" or not run_id:
        return None
    where = run_dir / WANDB_DIR
    if wandb_files(where, run_id):
        return None
    left = "the wandb server keeps what was uploaded" if mode == "online" else "nothing is left to `wandb sync`"
    return (
        f"the wandb run {run_id} is lost: {where} holds no run-{run_id}.wandb (the folder was deleted or moved while "
        f"the run ran?); metrics.jsonl holds the run's metrics, {left}"
    )


def run_name_for(cfg: TrainConfig, run_dir: Path) -> str:
    """``run.name``, else Hydra's override_dirname, else the run folder's name."""
    return cfg.run.name or _hydra_run_name() or run_dir.name


def plugin_settings(
    cfg: TrainConfig, run_dir: Path, experiment: Optional[str] = None, point: Optional[ResumePoint] = None
) -> PluginSettings:
    """What the plugin inside ms-swift's ranks receives: the run folder, the typed config serialised, the
    ``experiment=`` choice (added to the wandb run's config) and, for a resumed run (``point``), its cumulative
    totals and the ``metrics.jsonl`` rows the wandb run lacks."""
    point = point or ResumePoint()
    return PluginSettings(
        config=to_dict(cfg),
        run_dir=str(run_dir),
        experiment=experiment,
        resume_totals=dict(point.totals),
        wandb_replay=[dict(r) for r in point.wandb_replay],
    )


def attempt_plan(
    cfg: TrainConfig,
    run_dir: Path,
    experiment: Optional[str],
    point: ResumePoint,
    write_settings: Callable[[PluginSettings], Path],
) -> LaunchPlan:
    """This node's launch plan of an attempt that continues from ``point`` (an empty one: from step 0), on every
    node alike: the plugin settings (written by ``write_settings``, which returns their path) carry the resume
    totals and the wandb replay, ms-swift's argv loads the checkpoint, and the wandb run is rewound to
    ``point.wandb_step`` (:func:`gkd_harness.harness.launcher.resume.rewind_wandb_env`). Before, only node 0 got
    the totals and the rewind, while on Megatron the rank that writes the metrics and owns the wandb run is the
    last rank, on the last node: a requeued multi-node run restarted its cumulative counters at the checkpoint."""
    from gkd_harness.harness.launcher.resume import rewind_wandb_env

    settings_path = write_settings(plugin_settings(cfg, run_dir, experiment, point))
    plan = make_plan(cfg, run_dir, extra_args=point.args, settings_path=settings_path, experiment=experiment)
    if point.args:  # the same wandb run, rewound to what it holds at the checkpoint
        rewound = rewind_wandb_env(plan.env, point.wandb_step)
        plan.env.clear()
        plan.env.update(rewound)
    return plan


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
    from gkd_harness.harness.store.provenance import harness_code_sha256

    harness_code_sha256.cache_clear()  # the code identity hashed per point, at its launch (issue 48, item 10)
    cfg = to_typed(cfg)
    validate_config(cfg)
    run_dir = Path(cfg.run.output_dir).expanduser().resolve()
    if cfg.run.dry_run:
        from gkd_harness.harness.config.text import console_safe

        sys.stdout.write(console_safe(dry_run(cfg, run_dir, experiment=experiment), multiline=True))
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


def other_node_plan(cfg: TrainConfig, run_dir: Path, experiment: Optional[str], node: str) -> LaunchPlan:
    """The launch plan of node ``node`` (not node 0): with ``run.resume``, the same :class:`ResumePoint` node 0
    resumes from (read from the shared run folder: checkpoint, totals, wandb rewind and replay), its plugin
    settings in a node-local file."""
    from gkd_harness.harness.launcher.resume import resume_point

    point = resume_point(run_dir) if cfg.run.resume else ResumePoint()
    for note in point.notes:
        log.info(f"{run_dir} (node {node}): {note}")
    settings_path = Path(tempfile.mkdtemp(prefix=f"gkd-node{node}-")) / PLUGIN_SETTINGS_FILE
    return attempt_plan(cfg, run_dir, experiment, point, lambda s: s.write(settings_path))


def _train_other_node(cfg: TrainConfig, run_dir: Path, experiment: Optional[str]) -> Dict[str, Any]:
    from gkd_harness.harness.store.run_folder import RunFolder

    env = dict(os.environ)
    node = env.get("NODE_RANK") or env.get("SLURM_NODEID", "?")
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = other_node_plan(cfg, run_dir, experiment, node)
    execute(plan, run_dir / swift_node_log(node), stream=cfg.run.verbose)
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
        # this attempt's status from scratch (before, a resume kept the killed attempt's "signal": "SIGTERM")
        folder.update_summary(**ATTEMPT_STATUS_FIELDS, resumed_from=resume[1])
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
        plan = attempt_plan(
            cfg,
            run_dir,
            experiment,
            attempt.point,
            lambda s: folder.write_json(PLUGIN_SETTINGS_FILE, dataclasses.asdict(s)),
        )
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
        warnings = [w for w in (wandb_lost_warning(run_dir, plan.env),) if w]
        for line in warnings:
            log.warning(f"{run_dir}: {line}")
        folder.update_summary(warnings=warnings)
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
