"""The one reader of wandb's offline run files (``offline-run-*/run-*.wandb``); the tests use it too.

wandb >= 0.2x writes these files from its Go core and ships no Python reader. Format: a 7-byte header
(``:W&B``, 2-byte magic, 1-byte version), then LevelDB log framing: 32 KiB blocks of chunks
``crc32(4, LE) length(2, LE) type(1) payload``, type 1 full, 2 first, 3 middle, 4 last; a block tail shorter
than a chunk header is zero padding. Each reassembled payload is one ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Iterator

from gkd_harness.analysis.sweep.records import UnusableInput

__all__ = ["read_raw_records", "read_records"]

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_raw_records(path: Path) -> Iterator[bytes]:
    """Yield the raw protobuf payloads of a ``.wandb`` file, in order.

    A torn tail (what a killed process leaves) ends the iteration; a bad header, a checksum mismatch or an
    unknown chunk type raises :class:`UnusableInput` naming the file and byte offset."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < _HEADER or data[:4] != b":W&B":
        raise UnusableInput(f"{path}: not a wandb run file (bad header)")
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
        start, end = pos + _HEADER, pos + _HEADER + length
        if end > len(data):
            return  # torn write at the end
        payload = data[start:end]
        if zlib.crc32(bytes([rtype]) + payload) & 0xFFFFFFFF != crc:
            raise UnusableInput(f"{path}: checksum mismatch at byte {pos}")
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
            raise UnusableInput(f"{path}: unknown record type {rtype} at byte {pos}")


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
