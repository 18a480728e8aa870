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
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from gkd_harness.harness.contract import (
    CUMULATIVE_METRICS,
    SWIFT_DIR,
    WANDB_DIR,
    WANDB_STEP_FILE,
)
from gkd_harness.harness.store.metrics_io import record_step
from gkd_harness.harness.store.records import metrics_path

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


def _safetensors_damage(path: Path) -> Optional[str]:
    """Why the safetensors file ``path`` cannot be loaded whole, or None: its header (8-byte length, then JSON
    naming each tensor's ``data_offsets``) must parse and the file must be exactly header + data long (what
    ``safetensors`` checks before it reads a tensor; a copy or a save cut short fails it)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"truncated ({size} bytes, no header)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"truncated ({size} bytes, the header alone says {n + 8})"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"unreadable header ({type(e).__name__})"
    if not isinstance(header, dict):
        return "unreadable header"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return f"{'truncated' if size < expected else 'longer than its header says'} ({size} of {expected} bytes)"
    return None


def _zip_damage(path: Path) -> Optional[str]:
    """Why the torch archive ``path`` (``torch.save``'s zip format: optimizer.pt, rng_state.pth, ...) cannot be
    opened, or None (a legacy pickle file is not checked)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return None
        with zipfile.ZipFile(path) as z:
            size = path.stat().st_size
            if any(i.header_offset + i.compress_size > size for i in z.infolist()):
                return "truncated"
    except (OSError, zipfile.BadZipFile) as e:
        return f"truncated or corrupt ({type(e).__name__}: {e})"
    return None


#: files a resume loads, by suffix, and the check each must pass (:func:`checkpoint_damage`)
_CHECKS = {".safetensors": _safetensors_damage, ".pt": _zip_damage, ".pth": _zip_damage, ".bin": _zip_damage}


def checkpoint_damage(path: Path) -> Optional[str]:
    """``"<file>: <why>"`` for the first file of the checkpoint ``path`` that ms-swift could not load (a
    truncated ``model.safetensors``, a cut ``optimizer.pt``: :data:`_CHECKS`), None when every file passes. Reads
    headers and zip directories only, never the tensors."""
    for file in sorted(p for p in path.rglob("*") if p.suffix in _CHECKS and p.is_file()):
        why = _CHECKS[file.suffix](file)
        if why is not None:
            return f"{file.relative_to(path)}: {why}"
    return None


def find_checkpoint(run_dir: str | Path) -> Tuple[Optional[Path], List[str]]:
    """Newest usable ``checkpoint-<step>`` folder under ``<run_dir>/swift`` (any version subfolder), or None, and
    one line for each newer checkpoint skipped because a file of it is damaged (:func:`checkpoint_damage`).

    A checkpoint counts only when it is complete: ``trainer_state.json`` (written last by the HF trainer) or, on
    Megatron, ``latest_checkpointed_iteration.txt`` naming an ``iter_<N:07d>`` folder it holds (written after
    the distributed checkpoint); so a checkpoint cut short by the time limit is never resumed from. ms-swift's
    ``checkpoint-<N>-merged`` folders (LoRA merged for export) are not checkpoints to resume. A complete one whose
    weights or optimizer state are damaged (a truncated ``model.safetensors``: before, the resume failed on it
    with a ``SafetensorError`` and so did every requeue) is skipped for the previous one.
    """
    root = Path(run_dir) / SWIFT_DIR
    if not root.is_dir():
        return None, []
    found = []
    for path in root.rglob("checkpoint-*"):
        m = _CKPT.match(path.name)
        if m and path.is_dir() and _complete(path):
            found.append((int(m.group(1)), path.stat().st_mtime, path))
    skipped: List[str] = []
    for _, _, path in sorted(found, key=lambda k: k[:2], reverse=True):
        why = checkpoint_damage(path)
        if why is None:
            return path, skipped
        skipped.append(f"checkpoint {path} is damaged ({why}): not resumed from")
    return None, skipped


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Newest usable checkpoint of ``run_dir`` (:func:`find_checkpoint`), or None."""
    return find_checkpoint(run_dir)[0]


def checkpoint_args(ckpt: Path) -> list[str]:
    """ms-swift arguments that continue from the checkpoint ``ckpt``."""
    if is_megatron_checkpoint(ckpt):  # weights, optimizer, scheduler and iteration (finetune false)
        return ["--mcore_model", str(ckpt), "--finetune", "false"]
    return ["--resume_from_checkpoint", str(ckpt)]


def resume_args(resume: bool, run_dir: str | Path) -> list[str]:
    """ms-swift arguments that continue a requeued run, or ``[]`` (no resume asked, or nothing to resume)."""
    ckpt = latest_checkpoint(run_dir) if resume else None
    return [] if ckpt is None else checkpoint_args(ckpt)


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


def resume_totals(rows: Sequence[Mapping[str, Any]], checkpoint_step: int) -> Dict[str, float]:
    """The cumulative counters (:data:`~gkd_harness.harness.contract.CUMULATIVE_METRICS`) at ``checkpoint_step``:
    each one's value in the last ``metrics.jsonl`` row at or before that step that holds it. Rows after the
    checkpoint are ignored, so every node reads the same totals whether or not node 0 has cut the file yet."""
    totals: Dict[str, float] = {}
    for row in rows:
        step = record_step(row)
        if step is None or step > checkpoint_step:
            continue
        totals.update({k: row[k] for k in CUMULATIVE_METRICS if k in row})
    return totals


def wandb_resume(
    wandb_dir: Path, checkpoint_step: int, checkpoint_wandb_step: Optional[int], rows: Sequence[Mapping[str, Any]]
) -> Tuple[Optional[int], List[Dict[str, Any]], List[str]]:
    """``(rewind step, rows to replay, notes)``: how the resumed attempt's wandb run lines up with ``metrics.jsonl``.

    The checkpoint says where wandb should be (``checkpoint_wandb_step``: :func:`wandb_rewind_step`), the wandb
    files say what it holds (:func:`gkd_harness.harness.store.wandb_file.held_history`). A killed rank's file can
    end before the checkpoint (issue 48: checkpoint-15, the file's last row step 13): rewinding to the checkpoint
    then left steps 14-15 out of wandb for good. So when wandb holds less, the run is rewound to its last held row
    and ``metrics.jsonl``'s rows after that row's step, up to the checkpoint, are replayed into it by the writer
    rank before training continues (:func:`gkd_harness.harness.rank.wandb_run.replay_rows`). Without any wandb
    file (wandb disabled, or a run that never logged), or without a recorded checkpoint step: the checkpoint's.
    """
    from gkd_harness.harness.store.wandb_file import held_history, wandb_files

    held = held_history(wandb_files(wandb_dir))
    if held is None or checkpoint_wandb_step is None:
        return checkpoint_wandb_step, [], []
    last = held[-1] if held else None
    if last is not None and last.wandb_step >= checkpoint_wandb_step:
        return checkpoint_wandb_step, [], []
    after = last.step if last is not None else 0
    replay = [dict(r) for r in rows if (step := record_step(r)) is not None and after < step <= checkpoint_step]
    held_at = f"step {last.step} (wandb step {last.wandb_step})" if last is not None else "no step"
    note = (
        f"the wandb run holds {held_at}, short of the checkpoint's step {checkpoint_step}: rewound there, "
        f"{len(replay)} metrics.jsonl row{'s' if len(replay) != 1 else ''} replayed into it"
    )
    return (last.wandb_step if last is not None else None), replay, [note]


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed attempt continues, the same on every node (:func:`resume_point`).

    checkpoint: the checkpoint folder (None: nothing to resume from; ``args`` is then empty).
    args: the ms-swift arguments that load it (:func:`checkpoint_args`).
    checkpoint_step: its step.
    wandb_step: the step the wandb run is rewound to (:func:`wandb_resume`), None when unknown.
    totals: the cumulative counters at the checkpoint (:func:`resume_totals`), for the writer rank.
    wandb_replay: ``metrics.jsonl`` rows the writer rank logs to wandb before training continues.
    notes: one line each (a damaged checkpoint skipped, a replay).
    """

    checkpoint: Optional[Path] = None
    args: List[str] = field(default_factory=list)
    checkpoint_step: Optional[int] = None
    wandb_step: Optional[int] = None
    totals: Dict[str, float] = field(default_factory=dict)
    wandb_replay: List[Dict[str, Any]] = field(default_factory=list)
    notes: Tuple[str, ...] = ()


def resume_point(run_dir: str | Path) -> ResumePoint:
    """The :class:`ResumePoint` of ``run_dir``: its newest usable checkpoint (:func:`find_checkpoint`), the
    counters and the wandb rewind at it. Reads the folder, changes nothing: node 0 and every other node call it
    (``gkd_harness.harness.launcher.run``), so the rank that owns the wandb run and writes the metrics (the last
    rank on Megatron, on the last node) continues from the same totals and wandb step as node 0 would."""
    from gkd_harness.harness.store.metrics_io import read_metrics

    run_dir = Path(run_dir)
    ckpt, skipped = find_checkpoint(run_dir)
    m = _CKPT.match(ckpt.name) if ckpt is not None else None
    if ckpt is None or m is None:
        return ResumePoint(notes=tuple(skipped))
    step = int(m.group(1))
    rows = read_metrics(metrics_path(run_dir))
    wandb_step, replay, notes = wandb_resume(run_dir / WANDB_DIR, step, wandb_rewind_step(ckpt), rows)
    return ResumePoint(
        ckpt, checkpoint_args(ckpt), step, wandb_step, resume_totals(rows, step), replay, (*skipped, *notes)
    )


@dataclass(frozen=True)
class Attempt:
    """What ``gkd-train`` does with a run folder: the one place the resume decision is made.

    action: ``"skip"`` (completed with the same config: ``summary`` is returned), ``"new"`` (nothing there),
        ``"restart"`` (an earlier attempt is archived under ``previous_attempts/`` first) or ``"resume"``
        (continue from ``point``, keeping the metrics up to its checkpoint's step).
    notes: one line each, for the log.
    """

    action: str
    summary: Optional[Dict[str, Any]] = None
    point: ResumePoint = field(default_factory=ResumePoint)
    notes: Tuple[str, ...] = ()

    @property
    def resume_args(self) -> List[str]:
        return self.point.args

    @property
    def checkpoint_step(self) -> Optional[int]:
        return self.point.checkpoint_step

    @property
    def wandb_step(self) -> Optional[int]:
        """The wandb step to rewind the run to on a resume (:func:`wandb_resume`), None when unknown."""
        return self.point.wandb_step


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
        point = resume_point(folder.path)
        notes.extend(point.notes)
        if point.checkpoint is not None:
            return Attempt("resume", summary, point, notes=tuple(notes))
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
