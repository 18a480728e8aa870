"""What a rerun does with its run folder, and checkpoint discovery for requeue -> ms-swift checkpoint resume.

With ``hydra.launcher.max_num_timeout > 0`` (submitit_slurm), submitit signals the job ``signal_delay_s`` before
its time limit and requeues the same point; the point's ``gkd-train`` job then runs again in the same run
folder. When the user asks for it, the rerun continues from the newest ms-swift checkpoint in that folder
instead of from step 0: :func:`resume_args` returns ``["--resume_from_checkpoint", <dir>]`` for an HF checkpoint
and ``["--mcore_model", <dir>, "--finetune", "false"]`` for a Megatron one (ms-swift's Megatron trainer then loads
the weights, optimizer, scheduler and iteration from it: ``swift/megatron/trainers/base.py: _load_checkpoint``).
Checkpoints need ``run.save_steps`` below the step count.

The resumed attempt continues the same wandb run **rewound to the checkpoint** (:func:`wandb_rewind_step`,
:func:`rewind_wandb_env`: ``WANDB_RESUME_FROM=<id>?_step=<n>``), so wandb's history holds the resumed values of the
steps after the checkpoint: with ``WANDB_RESUME=allow`` alone, Megatron's resumed values (logged with
``step=iteration``) were dropped by wandb's monotonic-step rule and the first attempt's stood, and HF's were
appended after them with repeated global steps. An offline run records the rewind in its ``.wandb`` file and
``wandb sync`` applies it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from gkd_harness.harness.contract import SWIFT_DIR, WANDB_STEP_FILE

_CKPT = re.compile(r"^checkpoint-(\d+)$")


#: What ms-swift writes last into a complete checkpoint: the HF trainer's state; Megatron's iteration tracker
#: (``megatron/utils/megatron_lm_utils.py``: written after the distributed checkpoint ``iter_<N:07d>/`` is saved)
HF_COMPLETE = "trainer_state.json"
MEGATRON_COMPLETE = "latest_checkpointed_iteration.txt"


def is_megatron_checkpoint(path: Path) -> bool:
    """A complete Megatron checkpoint: its tracker names an iteration whose ``iter_<N:07d>`` folder is there."""
    try:
        iteration = int((path / MEGATRON_COMPLETE).read_text().strip())
    except (OSError, ValueError):
        return False
    return (path / f"iter_{iteration:07d}").is_dir()


def _complete(path: Path) -> bool:
    return (path / HF_COMPLETE).is_file() or is_megatron_checkpoint(path)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Newest ``checkpoint-<step>`` folder under ``<run_dir>/swift`` (any version subfolder), or None.

    A checkpoint counts only when it is complete: ``trainer_state.json`` (written last by the HF trainer) or, on
    Megatron, ``latest_checkpointed_iteration.txt`` naming an ``iter_<N:07d>`` folder it holds (written after
    the distributed checkpoint); so a checkpoint cut short by the time limit is never resumed from. ms-swift's
    ``checkpoint-<N>-merged`` folders (LoRA merged for export) are not checkpoints to resume.
    """
    root = Path(run_dir) / SWIFT_DIR
    best: tuple[int, float, Path] | None = None
    if not root.is_dir():
        return None
    for path in root.rglob("checkpoint-*"):
        m = _CKPT.match(path.name)
        if not m or not path.is_dir() or not _complete(path):
            continue
        key = (int(m.group(1)), path.stat().st_mtime, path)
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else best[2]


def resume_args(resume: bool, run_dir: str | Path) -> list[str]:
    """ms-swift arguments that continue a requeued run, or ``[]`` (no resume asked, or nothing to resume)."""
    if not resume:
        return []
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return []
    if is_megatron_checkpoint(ckpt):  # weights, optimizer, scheduler and iteration (finetune false)
        return ["--mcore_model", str(ckpt), "--finetune", "false"]
    return ["--resume_from_checkpoint", str(ckpt)]


def wandb_rewind_step(checkpoint: Path) -> Optional[int]:
    """The wandb step a run resumed from ``checkpoint`` rewinds its wandb run to, or None when unknown.

    HF: the last committed step the rank recorded at save time (:data:`WANDB_STEP_FILE`; HF logs without an explicit
    step, so it is not the global step). Megatron: the checkpoint's iteration (ms-swift's Megatron wandb callback logs
    with ``step=iteration``).
    """
    try:
        return int(json.loads((Path(checkpoint) / WANDB_STEP_FILE).read_text())["wandb_step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if is_megatron_checkpoint(Path(checkpoint)):
        return int((Path(checkpoint) / MEGATRON_COMPLETE).read_text().strip())
    return None


def rewind_wandb_env(env: Dict[str, str], step: Optional[int]) -> Dict[str, str]:
    """``env`` (``WANDB_*`` of a launch plan) rewinding the run ``WANDB_RUN_ID`` to ``step``: ``WANDB_RESUME_FROM=
    <id>?_step=<step>`` in place of ``WANDB_RESUME`` (wandb refuses both); ``env`` unchanged when ``step`` is None or
    there is no run id."""
    out = dict(env)
    if step is None or step < 0 or not out.get("WANDB_RUN_ID"):
        return out
    out.pop("WANDB_RESUME", None)
    out["WANDB_RESUME_FROM"] = f"{out['WANDB_RUN_ID']}?_step={step}"
    return out


@dataclass(frozen=True)
class Attempt:
    """What ``gkd-train`` does with a run folder: the one place the resume decision is made.

    action: ``"skip"`` (completed with the same config: ``summary`` is returned), ``"new"`` (nothing there),
        ``"restart"`` (an earlier attempt is archived under ``previous_attempts/`` first) or ``"resume"``
        (continue from ``resume_args``' checkpoint, keeping the metrics up to ``checkpoint_step``).
    notes: one line each, for the log.
    """

    action: str
    summary: Optional[Dict[str, Any]] = None
    resume_args: List[str] = field(default_factory=list)
    checkpoint_step: Optional[int] = None
    notes: Tuple[str, ...] = ()
    #: the wandb step to rewind the run to on a resume (:func:`wandb_rewind_step`), None when unknown
    wandb_step: Optional[int] = None


def decide_attempt(folder, flat_config: Mapping[str, Any], *, overwrite: bool, resume: bool) -> Attempt:
    """What to do with an earlier attempt in ``folder`` (a :class:`gkd_harness.harness.store.run_folder.RunFolder`), given
    the new flat resolved config; archives it if needed and returns the :class:`Attempt`. Call it holding the
    folder's lock, so the answer cannot change before it is acted on.

    - nothing there -> ``new``; files of an attempt without summary.json -> ``restart``
    - completed: same fingerprint -> ``skip`` (``restart`` with ``overwrite``); different -> ``restart`` with
      ``overwrite``, else :class:`~gkd_harness.harness.store.fingerprint.ConfigMismatch` (one line: the keys that differ and
      how to proceed)
    - unfinished (failed, or running under a stale lock): same fingerprint -> ``resume`` if ``resume`` else
      ``restart``; different -> ``restart`` (it is archived, not lost), but a resume of a different config ->
      :class:`~gkd_harness.harness.store.fingerprint.ConfigMismatch` unless ``overwrite``

    ``run.resume=true`` continues only from a usable checkpoint. Without one the earlier attempt is archived and
    the run restarts from step 0 with a note, so ``metrics.jsonl`` never holds two copies of a step and the
    cumulative counters never restart inside one file.
    """
    from gkd_harness.harness.store.fingerprint import ConfigMismatch, mismatch_message, summary_diff

    summary = folder.read_summary()
    differing: Tuple[str, ...]
    if summary is None:
        if not folder.has_attempt():
            return Attempt("new")
        action, differing = "restart", ()
    else:
        differing = tuple(summary_diff(summary, flat_config))
        if summary.get("status") == "completed":
            if not differing and not overwrite:
                return Attempt("skip", summary, notes=("completed earlier with the same config, skipping",))
            if differing and not overwrite:
                raise ConfigMismatch(
                    mismatch_message(folder.path, summary, flat_config, list(differing)), folder.path, list(differing)
                )
            action = "restart"
        elif resume and not differing:
            action = "resume"
        elif resume and not overwrite:
            raise ConfigMismatch(
                mismatch_message(
                    folder.path, summary, flat_config, list(differing), "an unfinished run (run.resume=true)"
                ),
                folder.path,
                list(differing),
            )
        else:
            action = "restart"
    notes: List[str] = []
    if action == "resume":
        args = resume_args(True, folder.path)
        m = _CKPT.match(Path(args[1]).name) if args else None  # resume_args names a checkpoint-<step> folder
        if m is not None:
            return Attempt("resume", summary, args, int(m.group(1)), wandb_step=wandb_rewind_step(Path(args[1])))
        notes.append(
            f"run.resume=true but no usable checkpoint under {Path(folder.path) / SWIFT_DIR} "
            "(checkpoint-N with trainer_state.json, or Megatron's latest_checkpointed_iteration.txt): the "
            "earlier attempt is archived and the run restarts"
        )
        reason = "run.resume=true without a usable checkpoint"
    else:
        if differing:
            notes.append(f"the earlier attempt differs in {', '.join(differing)}")
        reason = "run.overwrite=true" if overwrite else "an unfinished attempt is restarted"
    previous = folder.archive_previous_attempt(reason=reason)
    if previous is not None:
        notes.append(f"the earlier attempt moved to {previous}")
    return Attempt("restart", summary, notes=tuple(notes))
