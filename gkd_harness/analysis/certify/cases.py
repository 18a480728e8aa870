"""Deterministic inputs of the certificate: GKD problems with their checks.

A :class:`Case` is one call of the candidate's ``gkd_loss`` (``student [B, S, V]``, a ``TeacherOutput``, labels
``[B, S]``, β, T and extra arguments) plus what it is judged against (``check``):

* ``reference``: the independent FP64 reference (``gkd_harness.harness.loss.reference.reference_gkd``) with the suite's
  tolerances (``gkd_harness.harness.loss.tolerances``): value ``1e-5·|ref| + 1e-6·N``, student-logit gradient relative L2
  ``grad_tol``;
* ``pinned``: a value fixed by a published example (TRL's tests, the β defect, docs/defects.md), within ``abs_tol``;
* ``differ`` / ``symmetric``: TRL's qualitative pins (two losses differ; β = 0.5 symmetric bit for bit);
* ``identity``: bit-identical value and gradient with the installed ms-swift ``gkd_loss``;
* ``memory``: tensors alive and RSS after ``calls`` repeated calls, against upstream's growth;
* ``sharded`` / ``contract``: the injected primitives on 2 vocabulary shards; the caller's contract.

Every input comes from :func:`problem`: student = BF16-rounded ``randn·2`` (a BF16 model's output), teacher =
student + noise (0.03: near-identical distributions, where upstream goes negative; 1.0: different ones). The loss
tests use the same generator (:func:`make_case`; tests/loss_cases.py re-exports this module, it defines nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from typing import Any, Dict, Optional

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.contract import BETA_FORMS

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


@dataclasses.dataclass
class Case:
    id: str
    student: torch.Tensor  # [B, S, V]
    teacher: TeacherOutput
    labels: torch.Tensor  # [B, S]
    beta: float
    temperature: float
    form: str = "paper"
    ref: Dict[str, Any] = dataclasses.field(default_factory=dict)  # teacher_full= / teacher_topk= for reference_gkd
    kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)  # extra gkd_loss arguments
    check: str = "reference"
    judge_grad: bool = True
    loss_scale: float = 1.0  # backward of loss * scale, gradient divided by it (FP16 under loss scaling)
    expected: Optional[float] = None  # check=pinned: expected total / divisor
    divisor: float = 1.0  # check=pinned: TRL's reduction (batchmean: B)
    abs_tol: float = 0.0
    other: Optional["Case"] = None  # check=differ / symmetric: the second call
    grad_factor: Optional[float] = None  # tolerances.grad_tol's low-precision factor (None: its default)
    relative: bool = False  # set by the evaluation: the bar is upstream's formula in FP32 (--strict)
    grad_mode: str = "grad"  # "grad", "no_grad" or "inference_mode": the call's autograd mode (value only unless grad)
    contract: str = ""  # check=contract: "call" (return, graph, repeat, modes), "mismatch", "raising <primitive>"
    repro: str = ""  # a one-line reproduction (the random search's draws)
    calls: int = 0  # check=memory: the number of repeated calls measured

    @property
    def mode(self) -> str:
        """``"top-k"`` or ``"full vocabulary"``: the teacher's form."""
        return "top-k" if self.teacher.topk_indices is not None else "full vocabulary"

    @property
    def pair(self) -> str:
        """``student/teacher`` dtypes, e.g. ``fp32/bf16``."""
        short = {v: k for k, v in DTYPES.items()}
        t = self.teacher.full_logits if self.teacher.full_logits is not None else self.teacher.topk_logprobs
        return f"{short.get(self.student.dtype, self.student.dtype)}/{short.get(t.dtype, t.dtype) if t is not None else '-'}"


def seed_of(*key) -> int:
    return zlib.crc32(repr(key).encode()) & 0x7FFFFFFF


def problem(
    student_dtype: str,
    teacher_dtype: str,
    mode: str,
    noise: float,
    seed: int,
    batch: int = 2,
    seq: int = 24,
    vocab: int = 96,
    teacher_vocab: Optional[int] = None,
    topk: int = 16,
    masked_prefix: int = 3,
    scale: float = 2.0,
):
    """``(student [B,S,V], TeacherOutput, labels [B,S], ref kwargs)``; the first ``masked_prefix`` positions of
    each row are masked (-100)."""
    g = torch.Generator().manual_seed(seed)
    tv = teacher_vocab or vocab
    base = (torch.randn(batch, seq, max(vocab, tv), generator=g) * scale).bfloat16().float()
    teacher = base + torch.randn(base.shape, generator=g) * noise
    s = base[..., :vocab].to(DTYPES[student_dtype])
    t = teacher[..., :tv].to(DTYPES[teacher_dtype])
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    labels[:, :masked_prefix] = -100
    if mode == "topk":
        lp, idx = torch.topk(torch.log_softmax(t.double(), -1).to(t.dtype), min(topk, tv), dim=-1)
        return s, TeacherOutput(topk_logprobs=lp, topk_indices=idx, labels=labels), labels, dict(teacher_topk=(lp, idx))
    return s, TeacherOutput(full_logits=t, labels=labels), labels, dict(teacher_full=t)


def make(
    id: str,
    student_dtype: str,
    teacher_dtype: str,
    mode: str,
    noise: float,
    beta: float,
    temperature: float,
    form: str,
    **kw,
) -> Case:
    """A ``reference`` case on :func:`problem` inputs (``kw``: problem sizes, then Case fields)."""
    pkeys = {"batch", "seq", "vocab", "teacher_vocab", "topk", "masked_prefix", "scale"}
    pk = {k: kw.pop(k) for k in list(kw) if k in pkeys}
    s, t, lab, ref = problem(
        student_dtype,
        teacher_dtype,
        mode,
        noise,
        seed_of(id, student_dtype, teacher_dtype, mode, noise, beta, temperature),
        **pk,
    )
    return Case(id, s, t, lab, beta, temperature, form, ref, **kw)


def rows_case(id: str, s: torch.Tensor, t: torch.Tensor, beta: float, temperature: float, form: str, **kw) -> Case:
    """A case on explicit rows ``s [N, V]``, ``t [N, V]`` (full vocabulary, every position active)."""
    labels = torch.zeros((1, s.shape[0]), dtype=torch.long)
    teacher = TeacherOutput(full_logits=t[None], labels=labels)
    return Case(id, s[None], teacher, labels, beta, temperature, form, dict(teacher_full=t[None]), **kw)


# ------------------------------------------------------------------------------------------ injected primitives
def sharded_primitives(shards: int = 2):
    """``(log_softmax_fn, kl_div_fn)`` computed shard by shard over the vocabulary and combined as a
    vocab-parallel implementation does (max and sum reduced across shards), in one process."""

    def log_softmax_fn(x):
        parts = x.chunk(shards, dim=-1)
        m = torch.stack([p.max(-1).values for p in parts]).max(0).values.detach()
        sumexp = sum((p - m[..., None]).exp().sum(-1) for p in parts)
        lse = m + sumexp.log()
        return torch.cat([p - lse[..., None] for p in parts], -1)

    def kl_div_fn(input_log, target_log):
        ip, tp = input_log.chunk(shards, -1), target_log.chunk(shards, -1)
        return sum((t.exp() * (t - i)).sum(-1) for i, t in zip(ip, tp))

    return log_softmax_fn, kl_div_fn


# ------------------------------------------------------------------------------------------ the loss suite's grid
#: The loss unit tests' inputs (tests/loss_cases.py re-exports these: one generator for the tests and the certificate).
DTYPE_PAIRS = [
    ("fp32", "bf16"),
    ("fp32", "fp32"),
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp64", "fp64"),
    ("fp64", "bf16"),
]
BETAS = [0.0, 1e-3, 0.1, 0.5, 0.9, 0.999, 1.0]
TEMPERATURES = [0.5, 0.9, 1.0, 2.0]
FORMS = list(BETA_FORMS)
MODES = ["full", "topk"]


@dataclasses.dataclass
class Problem:
    """One set of inputs: ``student [B, S, V]``, a ``TeacherOutput``, ``labels [B, S]`` and the reference's
    teacher keyword (``teacher_full=`` or ``teacher_topk=``)."""

    student: torch.Tensor
    teacher: TeacherOutput
    labels: torch.Tensor
    ref_kwargs: dict


def make_case(
    student_dtype: str,
    teacher_dtype: str,
    mode: str,
    near: bool,
    seed: int,
    batch: int = 2,
    seq: int = 24,
    vocab: int = 96,
    teacher_vocab: Optional[int] = None,
    topk: int = 16,
    masked_prefix: int = 3,
    noise_far: float = 1.0,
    noise_near: float = 0.03,
) -> Problem:
    """:func:`problem`'s inputs as a :class:`Problem` (``near``: noise 0.03, the seed report's near-identical
    distributions where upstream goes negative; else ``noise_far``)."""
    s, t, lab, ref = problem(
        student_dtype,
        teacher_dtype,
        mode,
        noise_near if near else noise_far,
        seed,
        batch,
        seq,
        vocab,
        teacher_vocab,
        topk,
        masked_prefix,
    )
    return Problem(s, t, lab, ref)


def grid():
    """(student_dtype, teacher_dtype), beta, T, form, mode, near: every T for the mixed FP32/BF16 pair (the
    defect's setting), T ∈ {0.5, 2} for the other dtype pairs."""
    for pair in DTYPE_PAIRS:
        temps = TEMPERATURES if pair == ("fp32", "bf16") else [0.5, 2.0]
        yield from itertools.product([pair], BETAS, temps, FORMS, MODES, [True, False])
