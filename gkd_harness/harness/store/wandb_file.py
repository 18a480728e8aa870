"""What a run folder's wandb files hold, for the launcher's resume: the history steps of each ``run-<id>.wandb``
file and the rewind (branch point) it starts with, and the history wandb keeps once every attempt's file is
applied in order (:func:`held_history`).

A killed rank's file can stop short of what ``metrics.jsonl`` holds (wandb's core writes the file on its own
clock and dies with the rank), so a resume must know where the file really ends. The format (wandb's offline run
file, LevelDB log framing around ``wandb_internal_pb2.Record`` payloads): a 7-byte header (``:W&B``, 2-byte magic,
1-byte version), 32 KiB blocks of chunks ``crc32(4, LE) length(2, LE) type(1) payload``, type 1 full, 2 first,
3 middle, 4 last. A torn tail, a checksum mismatch or an undecodable record ends what the file is taken to hold
(nothing after it can be synced). Torch-free; imports wandb's protobuf classes only when a file is read.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from gkd_harness.harness.contract import TRAIN_GLOBAL_STEP

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
#: wandb's link to the newest run folder (a second path to one file)
_LATEST_RUN = "latest-run"
#: the history key that carries the training step: HF's ``train/global_step`` (HF logs without an explicit step,
#: so wandb's ``_step`` is a log counter), else wandb's ``_step`` (Megatron logs ``step=iteration``)
GLOBAL_STEP_KEY = TRAIN_GLOBAL_STEP


class WandbFileError(ValueError):
    """A ``.wandb`` file that is not one, or a corrupt chunk (``strict`` reads only); the message names the byte
    offset."""


def payloads(data: bytes, strict: bool = False) -> Iterator[bytes]:
    """The whole record payloads of a ``.wandb`` file's bytes, in order. A torn tail (what a killed process leaves)
    ends them; so do a bad header, a checksum mismatch or an unknown chunk type, which with ``strict`` raise
    :class:`WandbFileError` instead (the analysis reader: a damaged file is unusable evidence, not a short one)."""

    def bad(why: str) -> None:
        if strict:
            raise WandbFileError(why)

    if len(data) < _HEADER or data[:4] != b":W&B":
        return bad("not a wandb run file (bad header)")
    pos, pending = _HEADER, b""
    while pos < len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        if pos + _HEADER > len(data):
            return
        crc, length, rtype = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if crc == 0 and length == 0 and rtype == 0:  # zero padding at the end of a block
            pos += left
            continue
        end = pos + _HEADER + length
        if end > len(data):
            return  # torn write at the end
        payload = data[pos + _HEADER : end]
        if zlib.crc32(bytes([rtype]) + payload) & 0xFFFFFFFF != crc:
            return bad(f"checksum mismatch at byte {pos}")
        pos = end
        if rtype == _FULL:
            yield payload
        elif rtype == _FIRST:
            pending = payload
        elif rtype == _MIDDLE:
            pending += payload
        elif rtype == _LAST:
            yield pending + payload
            pending = b""
        else:
            return bad(f"unknown record type {rtype} at byte {pos}")


@dataclass(frozen=True)
class HistoryRow:
    """One history row of a wandb file: wandb's ``_step`` and the training step it logged (``train/global_step``,
    else ``_step``)."""

    wandb_step: int
    step: int


@dataclass(frozen=True)
class WandbFile:
    """One ``run-<id>.wandb`` file: the run id, the step it rewinds the run to first (``WANDB_RESUME_FROM``'s
    branch point; None without one) and its history rows in order."""

    path: Path
    run_id: Optional[str]
    rewind_to: Optional[int]
    rows: Tuple[HistoryRow, ...]


def _number(value_json: str) -> Optional[int]:
    try:
        value = json.loads(value_json)
    except ValueError:
        return None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def read_wandb_file(path: os.PathLike) -> WandbFile:
    """The run id, rewind and history rows of one ``.wandb`` file (what is readable of it; an unreadable file
    holds nothing)."""
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    run_id, rewind_to, rows = None, None, []
    for raw in payloads(data):
        rec = pb.Record()  # type: ignore[attr-defined]  # protobuf builds its classes at import; wandb ships no stub
        try:
            rec.ParseFromString(raw)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError: nothing after it is held
            break
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run_id = rec.run.run_id or run_id
            bp = rec.run.branch_point
            if bp.run and bp.metric == "_step":
                rewind_to = int(bp.value)
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: i.value_json for i in rec.history.item}
            wandb_step = _number(items["_step"]) if "_step" in items else None
            if wandb_step is None and rec.history.HasField("step"):
                wandb_step = int(rec.history.step.num)
            if wandb_step is None:
                continue
            step = _number(items[GLOBAL_STEP_KEY]) if GLOBAL_STEP_KEY in items else None
            rows.append(HistoryRow(wandb_step, wandb_step if step is None else step))
    return WandbFile(path, run_id, rewind_to, tuple(rows))


def wandb_files(wandb_dir: os.PathLike, run_id: Optional[str] = None) -> List[Path]:
    """The ``run-<id>.wandb`` files under ``wandb_dir`` (a run folder's ``wandb/``), oldest attempt first (wandb
    names each attempt's folder ``offline-run-<YYYYmmdd_HHMMSS>-<id>`` / ``run-...``), wandb's ``latest-run``
    link left out; only ``run_id``'s when given."""
    root = Path(wandb_dir)
    if not root.is_dir():
        return []
    name = f"run-{run_id}.wandb" if run_id else "run-*.wandb"
    found = [p for p in root.rglob(name) if _LATEST_RUN not in p.relative_to(root).parts and p.is_file()]
    return sorted(found, key=_attempt_order)


def _attempt_order(path: Path) -> Tuple[str, float, str]:
    stamp = re.search(r"\d{8}_\d{6}", path.parent.name)
    return (stamp.group(0) if stamp else "", path.stat().st_mtime, str(path))


def held_history(files: List[Path]) -> Optional[List[HistoryRow]]:
    """The history wandb holds once ``files`` (one run's attempts, oldest first) are applied in order: each
    file's rewind drops the rows after its branch point, then its own rows follow. None without any file."""
    if not files:
        return None
    held: List[HistoryRow] = []
    for path in files:
        f = read_wandb_file(path)
        if f.rewind_to is not None:
            held = [r for r in held if r.wandb_step <= f.rewind_to]
        held.extend(f.rows)
    return held
