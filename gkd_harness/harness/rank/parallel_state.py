"""Megatron's model-parallel state as the rank-side code needs it, in one place.

The instrument (counts over TP × CP replicas, CP reductions), the captures (whole vocabulary under TP) and the
held-out evaluation (vocab-parallel reductions) all ask the same questions of ``megatron.core.parallel_state``.
It is read only when Megatron is already imported and initialised in this process (the HF backend never imports
it), so every function answers "no model parallelism" there.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Tuple


def megatron_state() -> Optional[Any]:
    """``megatron.core.parallel_state`` when Megatron's model parallelism is initialised in this process, else None."""
    mpu = sys.modules.get("megatron.core.parallel_state")
    try:
        if mpu is not None and mpu.model_parallel_is_initialized():
            return mpu
    except Exception:  # noqa: BLE001 - no Megatron state
        pass
    return None


def tensor_parallel_group() -> Tuple[Any, int, int]:
    """``(TP group, TP rank, TP size)`` under Megatron with TP > 1, else ``(None, 0, 1)``."""
    mpu = megatron_state()
    if mpu is None or int(mpu.get_tensor_model_parallel_world_size()) == 1:
        return None, 0, 1
    return (
        mpu.get_tensor_model_parallel_group(),
        int(mpu.get_tensor_model_parallel_rank()),
        int(mpu.get_tensor_model_parallel_world_size()),
    )


def context_parallel_group() -> Tuple[Any, int]:
    """``(context-parallel group, its size)`` under Megatron with CP > 1, else ``(None, 1)``."""
    mpu = megatron_state()
    if mpu is None:
        return None, 1
    size = int(mpu.get_context_parallel_world_size())
    return (mpu.get_context_parallel_group(), size) if size > 1 else (None, 1)


def loss_replicas() -> int:
    """How many ranks record the *same* loss call: TP size × CP size under Megatron, else 1.

    Under Megatron every TP rank of the last pipeline stage runs the loss on the same positions (the
    vocab-parallel primitives reduce over TP), the CP ranks of a group record the CP-reduced statistics of one
    call (``LossInstrument._record``), and other stages run none, so a world-wide SUM counts each call TP × CP
    times. Dividing by it keeps the world-wide collective (every rank takes part, whatever its stage).
    """
    mpu = megatron_state()
    if mpu is None:
        return 1
    return int(mpu.get_tensor_model_parallel_world_size()) * int(mpu.get_context_parallel_world_size())
