"""The seed report's synthetic input, as settings (torch-free, so ``gkd-replay --help`` shows them at once)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["SyntheticInput", "SEED_INPUT"]


@dataclass(frozen=True)
class SyntheticInput:
    """The settings of one synthetic input (the seed report's recipe); the defaults are the seed's own input, and
    ``gkd-replay synthetic``'s flags default to them."""

    seed: int = 0
    rows: int = 3
    vocab: int = 64
    scale: float = 2.0
    noise: float = 0.03
    student_dtype: str = "float32"
    teacher_dtype: str = "bfloat16"
    beta: float = 0.5
    temperature: float = 0.9
    topk: Optional[int] = None
    beta_form: str = "paper"


#: The seed report's input.
SEED_INPUT = SyntheticInput()
