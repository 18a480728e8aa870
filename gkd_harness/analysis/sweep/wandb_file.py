"""The one reader of wandb's offline run files (``offline-run-*/run-*.wandb``); the tests use it too.

wandb >= 0.2x writes these files from its Go core and ships no Python reader; the framing is read by
:func:`gkd_harness.harness.store.wandb_file.payloads` (the launcher's resume reads the same files), strictly here:
a damaged file is unusable evidence. Each reassembled payload is one ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from gkd_harness.analysis.sweep.records import UnusableInput
from gkd_harness.harness.store.wandb_file import WandbFileError, payloads

__all__ = ["read_raw_records", "read_records"]


def read_raw_records(path: Path) -> Iterator[bytes]:
    """Yield the raw protobuf payloads of a ``.wandb`` file, in order (the framing:
    :func:`gkd_harness.harness.store.wandb_file.payloads`).

    A torn tail (what a killed process leaves) ends the iteration; a bad header, a checksum mismatch or an
    unknown chunk type raises :class:`UnusableInput` naming the file and byte offset."""
    path = Path(path)
    try:
        yield from payloads(path.read_bytes(), strict=True)
    except WandbFileError as e:
        raise UnusableInput(f"{path}: {e}") from None


def read_records(path: Path) -> Iterator:
    """Yield the decoded ``wandb_internal_pb2.Record`` s of a ``.wandb`` file (see :func:`read_raw_records`)."""
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in read_raw_records(path):
        rec = pb.Record()  # type: ignore[attr-defined]  # protobuf builds its classes at import; wandb ships no stub
        try:
            rec.ParseFromString(raw)
        except Exception as e:  # protobuf's DecodeError
            raise UnusableInput(f"{path}: undecodable record ({e})") from None
        yield rec
