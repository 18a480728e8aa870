"""Captures written off the training loop: one background thread per process writes queued captures in order.

:meth:`CaptureWriter.submit` takes host tensors (for a CUDA source, pinned buffers still being filled by
non-blocking copies, with the CUDA event that marks their end) and returns at once; the thread waits for the
event, serialises, writes a temporary file and renames it (``gkd_harness.harness.store.captures.write_capture``), so a reader
never sees a partial capture. At most ``max_pending`` captures wait: a further ``submit`` blocks until one is
written, which bounds the host memory held by captures.

:meth:`close` writes what is queued and joins the thread; the trainer callback calls it at train end, and it is
registered with ``atexit`` so a run that fails with an exception still writes the captures it queued. A failed
write (a full disk) is logged with the file's name and kept in :attr:`errors`; it never stops training.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from gkd_harness.harness.store.captures import write_capture

logger = logging.getLogger(__name__)
_STOP = object()


class CaptureWriter:
    """A daemon thread that writes ``(path, tensors, metadata, event)`` items in submission order.

    Args:
        max_pending: captures allowed to wait (host memory bound); ``submit`` blocks beyond it.
    """

    def __init__(self, max_pending: int = 2):
        self._queue: "queue.Queue" = queue.Queue(maxsize=max(1, int(max_pending)))
        self.written: List[Path] = []
        self.errors: List[str] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gkd-harness-capture-writer", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def submit(
        self, path: str | Path, tensors: Dict[str, torch.Tensor], metadata: Dict[str, Any], ready: Optional[Any] = None
    ) -> None:
        """Queue one capture. ``tensors`` are host tensors owned by the writer from now on; ``ready`` (a CUDA
        event, or None) is waited for on the writer thread before they are read."""
        if self._closed:
            raise RuntimeError("CaptureWriter is closed")
        self._queue.put((Path(path), tensors, metadata, ready))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                path, tensors, metadata, ready = item
                try:
                    if ready is not None:
                        ready.synchronize()
                    self.written.append(write_capture(path, tensors, metadata))
                except Exception as e:  # noqa: BLE001 - a capture never stops training
                    msg = f"capture {path} not written: {type(e).__name__}: {e}"
                    self.errors.append(msg)
                    logger.error(msg)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Return once every capture submitted so far is written (or has failed)."""
        self._queue.join()

    def close(self) -> List[str]:
        """Write what is queued, stop the thread (idempotent); returns the errors of failed writes."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
            atexit.unregister(self.close)
        return list(self.errors)
