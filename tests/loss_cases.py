"""Deterministic loss-suite inputs shared by the tests and tests/measure_tolerances.py."""
import itertools
import zlib
from dataclasses import dataclass
from typing import Optional

import torch

from swift.rlhf_trainers.gkd_loss import TeacherOutput

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
DTYPE_PAIRS = [("fp32", "bf16"), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"), ("fp64", "fp64"),
               ("fp64", "bf16")]
BETAS = [0.0, 1e-3, 0.1, 0.5, 0.9, 0.999, 1.0]
TEMPERATURES = [0.5, 0.9, 1.0, 2.0]
FORMS = ["paper", "continuous"]
MODES = ["full", "topk"]


@dataclass
class Case:
    student: torch.Tensor  # [B, S, V]
    teacher: TeacherOutput
    labels: torch.Tensor  # [B, S]
    ref_kwargs: dict  # for harness.loss.reference.reference_gkd


def seed_of(*key) -> int:
    return zlib.crc32(repr(key).encode()) & 0x7FFFFFFF


def make_case(student_dtype: str, teacher_dtype: str, mode: str, near: bool, seed: int, batch: int = 2,
              seq: int = 24, vocab: int = 96, teacher_vocab: Optional[int] = None, topk: int = 16,
              masked_prefix: int = 3, noise_far: float = 1.0, noise_near: float = 0.03) -> Case:
    """Student = BF16-rounded ``randn·2`` (a BF16 model's output, upcast); teacher = student + noise.

    ``near`` uses the seed report's noise 0.03 (near-identical distributions, where native goes negative).
    The first ``masked_prefix`` positions of each row are masked (-100).
    """
    g = torch.Generator().manual_seed(seed)
    tv = teacher_vocab or vocab
    base = (torch.randn(batch, seq, max(vocab, tv), generator=g) * 2).bfloat16().float()
    teacher = base + torch.randn(base.shape, generator=g) * (noise_near if near else noise_far)
    s = base[..., :vocab].to(DTYPES[student_dtype])
    t = teacher[..., :tv].to(DTYPES[teacher_dtype])
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    labels[:, :masked_prefix] = -100
    if mode == "topk":
        lp, idx = torch.topk(torch.log_softmax(t.double(), -1).to(t.dtype), topk, dim=-1)
        return Case(s, TeacherOutput(topk_logprobs=lp, topk_indices=idx, labels=labels), labels,
                    dict(teacher_topk=(lp, idx)))
    return Case(s, TeacherOutput(full_logits=t, labels=labels), labels, dict(teacher_full=t))


def grid():
    """(student_dtype, teacher_dtype), beta, T, form, mode, near: every T for the mixed FP32/BF16 pair (the
    defect's setting), T ∈ {0.5, 2} for the other dtype pairs."""
    for pair in DTYPE_PAIRS:
        temps = TEMPERATURES if pair == ("fp32", "bf16") else [0.5, 2.0]
        yield from itertools.product([pair], BETAS, temps, FORMS, MODES, [True, False])
