"""Counting the device-to-host synchronisations of a call, with torch's dispatch and function modes.

A synchronisation is an operation after which the host holds a value computed on the device: it has to wait for
the device's queue to drain. :class:`HostSyncCounter` (a ``TorchDispatchMode``) sees them as aten operations:
``_local_scalar_dense`` (``.item()``, ``float()``, ``int()``, ``bool()``), ``is_nonzero``, ``item``, ``equal``,
operations whose output shape depends on the data (``nonzero``, ``masked_select``, ``unique*``,
``repeat_interleave``, a boolean-mask ``index`` / ``index_put_``) and copies to the CPU. The Python-level reads
``Tensor.tolist`` / ``.numpy`` / ``.cpu`` reach no aten operation when the tensor already is on the CPU (the
case on a CPU-only machine), so :class:`HostReadCounter` (a ``TorchFunctionMode``) counts them; on a CPU-only
machine every tensor is "the device", so each counted operation is what would synchronise on a GPU.
"""

from __future__ import annotations

from typing import Callable, List

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter", "HostReadCounter", "count_host_syncs"]


class HostSyncCounter(TorchDispatchMode):
    """Records the name of every synchronising aten operation (see the module docstring) in ``ops``."""

    SYNC_OPS = {
        "_local_scalar_dense",
        "is_nonzero",
        "item",
        "equal",
        "nonzero",
        "masked_select",
        "unique_dim",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "repeat_interleave",
    }

    def __init__(self):
        super().__init__()
        self.ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if name in self.SYNC_OPS:
            self.ops.append(name)
        elif name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())
        ):
            self.ops.append(f"{name}[bool mask]")
        elif name in ("_to_copy", "copy_"):
            src = args[1] if name == "copy_" else args[0]
            dst = args[0].device if name == "copy_" else kwargs.get("device")
            if dst is not None and torch.device(dst).type == "cpu" and src.device.type != "cpu":
                self.ops.append(f"{name}[to cpu]")
        return func(*args, **kwargs)


class HostReadCounter(TorchFunctionMode):
    """Records the Python-level reads of tensor data by the host (``tolist``, ``numpy``, ``cpu``) in ``ops``."""

    READS = {"tolist", "numpy", "cpu", "__array__"}

    def __init__(self):
        super().__init__()
        self.ops: List[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def count_host_syncs(fn: Callable, *args, **kwargs) -> List[str]:
    """The synchronising operations of one call ``fn(*args, **kwargs)``: host reads first, then aten operations."""
    reads, syncs = HostReadCounter(), HostSyncCounter()
    with reads, syncs:
        fn(*args, **kwargs)
    return reads.ops + syncs.ops
