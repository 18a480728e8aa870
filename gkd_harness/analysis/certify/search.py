"""A seeded random search over the space the fixed families sample on a grid (issue 37).

Each draw is a reference case built from ``(seed, index)`` alone (:func:`draw`): dtype pair, full vocabulary or
top-k (k from 1 to V), batch and sequence shape, vocabulary size (2 … 4,096; sometimes a teacher vocabulary a few
ids wider or narrower), β (an endpoint, a value exact in BF16, or uniform in [0.1, 0.9]: nearer an endpoint is the hard regime
"beta near an endpoint"), T (log-uniform in [0.5, 2]), noise
(near-identical or different distributions), a random label mask (sometimes every position), and per-row logit
offsets of ±300 in one draw out of four for FP32/FP64 students (at a BF16 logit of 300 the spacing is 2: student
and teacher rows collapse onto the same distribution, whose exact gradient 0 the reference only approximates; at T = 1, as the shifted-logits family: at T ≠ 1 FP32's ``s / T`` rounds
logits of 300 at ulp(300/T), which no FP32 fix can avoid). It is judged as any reference case (FP64 reference, the suite's
tolerances), so a failing draw is a failing case whose id reads as its one-line reproduction::

    gkd-certify CANDIDATE --family "random search" --search-seed 0 --search-draw 17

Why a seeded ``torch.Generator`` and not a property-based library (hypothesis): the certificate is a runtime
command whose result must be a function of (candidate, seed, number of draws) only, on any machine. Hypothesis
keeps an example database between runs, shrinks a failure by re-running the candidate many more times (each call
at these sizes costs milliseconds to a second: shrinking has no time bound the certificate could state), and it is
a test-only dependency of this project (the ``test`` extra), not a runtime one. A draw here is replayed from its
index alone, with no state outside the certificate.
"""

from __future__ import annotations

import math
from typing import List, Optional

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.analysis.certify.cases import Case, make, seed_of

PAIRS = [
    ("fp32", "bf16"),
    ("fp32", "bf16"),  # the defect's pair, drawn twice as often
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp32", "fp32"),
    ("fp64", "bf16"),
    ("bf16", "fp32"),
    ("fp32", "fp16"),
]
#: Default number of draws (``--quick``: half): every one runs, on every machine (by count, never by clock).
DRAWS = 48
FAMILY = "random search"


def _uniform(g: torch.Generator) -> float:
    return float(torch.rand((), generator=g, dtype=torch.float64))


def _int(g: torch.Generator, lo: int, hi: int) -> int:
    """Uniform in ``[lo, hi]``."""
    return int(torch.randint(lo, hi + 1, (), generator=g))


def draw(seed: int, index: int, form: str) -> Case:
    """Draw ``index`` of the search with ``seed``: a reference case whose id is its reproduction."""
    g = torch.Generator().manual_seed(seed_of("search", seed, index))
    a, b = PAIRS[_int(g, 0, len(PAIRS) - 1)]
    mode = "topk" if _uniform(g) < 0.4 else "full"
    vocab = max(2, int(round(math.exp(_uniform(g) * math.log(4096)))))
    teacher_vocab = vocab
    if mode == "full" and vocab > 16 and _uniform(g) < 0.2:
        teacher_vocab = vocab + _int(g, -8, 8)
    k = _int(g, 1, vocab)
    batch, seq = _int(g, 1, 3), _int(g, 1, 40)
    u = _uniform(g)
    # β near an endpoint (within 0.1) is a hard regime of its own (textbook FP32 cancels there): not drawn here
    beta = (
        (0.0 if u < 0.1 else 1.0) if u < 0.2 else (_int(g, 1, 7) / 8 if u < 0.4 else round(0.1 + 0.8 * _uniform(g), 6))
    )
    temperature = round(math.exp((2 * _uniform(g) - 1) * math.log(2)), 4)
    noise = 0.03 if _uniform(g) < 0.6 else 1.0
    masked = 1.0 if _uniform(g) < 0.05 else round(_uniform(g) * 0.6, 3)
    offset = 300.0 if _uniform(g) < 0.25 and a in ("fp32", "fp64") else 0.0  # a BF16/FP16 logit of 300: spacing 2
    if offset:  # at T != 1, FP32's s/T rounds logits of 300 at ulp(300/T): no FP32 fix meets the tolerance there
        temperature = 1.0
    mask_seed = _int(g, 0, 2**31 - 2)
    desc = (
        f"{a}/{b} {mode}{f' k={k}' if mode == 'topk' else ''} B={batch} S={seq} V={vocab}"
        f"{f' teacher V={teacher_vocab}' if teacher_vocab != vocab else ''} b={beta:g} T={temperature:g} "
        f"noise={noise:g} masked={masked:g}{f' offset=+-{offset:g}' if offset else ''}"
    )
    case = make(
        f"draw {index} (seed {seed}): {desc}",
        a,
        b,
        mode,
        noise,
        beta,
        temperature,
        form,
        batch=batch,
        seq=seq,
        vocab=vocab,
        teacher_vocab=teacher_vocab if teacher_vocab != vocab else None,
        topk=k,
        masked_prefix=0,
    )
    mg = torch.Generator().manual_seed(mask_seed)
    labels = case.labels.clone()
    labels[torch.rand(labels.shape, generator=mg) < masked] = -100
    if offset:
        _offset_rows(case, offset, mg)
    case.labels = labels
    case.teacher = TeacherOutput(
        full_logits=case.teacher.full_logits,
        topk_logprobs=case.teacher.topk_logprobs,
        topk_indices=case.teacher.topk_indices,
        labels=labels,
    )
    case.repro = f'--family "{FAMILY}" --search-seed {seed} --search-draw {index}  # {desc}'
    return case


def _offset_rows(case: Case, offset: float, g: torch.Generator) -> None:
    """Per-row offsets ``±offset`` on the student (and, opposite, on a full-vocabulary teacher), in place of the
    case's tensors (each re-rounded to its dtype; the reference reads the same tensors)."""
    signs = torch.where(torch.rand(case.student.shape[:-1] + (1,), generator=g) < 0.5, -1.0, 1.0)
    case.student = (case.student.double() + offset * signs).to(case.student.dtype)
    if case.teacher.full_logits is not None:
        t = case.teacher.full_logits
        t = (t.double() - offset * signs).to(t.dtype)
        case.teacher = TeacherOutput(full_logits=t, labels=case.labels)
        case.ref = dict(teacher_full=t)


def search_cases(seed: int = 0, draws: int = DRAWS, only: Optional[int] = None):
    """The family's build function: draws ``0 … draws−1`` (or draw ``only``)."""

    def build(form: str, quick: bool) -> List[Case]:
        return [draw(seed, i, form) for i in ([only] if only is not None else range(draws))]

    return build
