"""Recognised causes of a failing family, one line each, from what the failing cases show.

Each hypothesis is a known way to get the loss wrong, tested on the family's failing cases: the candidate's value
is compared with the FP64 reference of the inputs *as that mistake would leave them* (β rounded to BF16, logits
divided by T in their own dtype, the BF16 teacher's pad columns holding the student's logits rounded to BF16, the
total divided by ``num_valid``). A hypothesis is named when it explains (within the value tolerance) at least half
of the failing cases whose value it changes and the candidate is farther from the true reference than from it.
The rest read the notes (an input written, a primitive never called, a wrong ``num_valid``) or the source (a
clamp).
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional, Tuple

import torch

from gkd_harness.analysis.certify.cases import Case
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import loss_tol

HINTS = {
    "input written": "writes into an input tensor ({}): the caller's tensor changes; compute on a copy",
    "primitive ignored": "{}: under Megatron TP > 1 each rank would normalise its own vocabulary shard; call the "
    "injected primitives",
    "num_valid": "a wrong num_valid ({}): it must count the active positions (labels != -100, uncovered top-k "
    "rows dropped)",
    "mean": "a mean instead of a sum: the total is divided by num_valid (the caller divides)",
    "beta bf16": "β rounded to BF16 (a low-precision β tensor): keep β a python float or FP32+",
    "temperature": "promotion after temperature: the logits are divided by T in BF16/FP16; promote both sides "
    "before `/ temperature`",
    "alignment": "promotion after alignment: the BF16 teacher's pad columns hold the student's logits rounded to "
    "BF16 by upstream's _align_vocab; promote both sides before _align_vocab",
    "clamp": "a clamp ({}): it hides negative losses and zeroes the gradient where it bites; fix the arithmetic",
}


def _alt(case: Case, **change) -> Optional[float]:
    """The FP64 reference total of ``case`` with the inputs a mistake leaves (``student``, ``ref``, ``beta``,
    ``temperature`` replaced)."""
    student = change.get("student", case.student)
    ref = change.get("ref", case.ref)
    return reference_gkd(
        student,
        case.labels,
        change.get("beta", case.beta),
        change.get("temperature", case.temperature),
        case.form,
        **ref,
    )[0]


def _after_temperature(case: Case) -> Optional[float]:
    if case.temperature == 1.0 or "teacher_full" not in case.ref and "teacher_topk" not in case.ref:
        return None
    low = (torch.bfloat16, torch.float16)
    s = case.student / case.temperature if case.student.dtype in low else case.student.double() / case.temperature
    if "teacher_full" in case.ref:
        t = case.ref["teacher_full"]
        t = t / case.temperature if t.dtype in low else t.double() / case.temperature
        ref = {"teacher_full": t}
    else:
        lp, idx = case.ref["teacher_topk"]
        ref = {"teacher_topk": (lp / case.temperature if lp.dtype in low else lp.double() / case.temperature, idx)}
    return _alt(case, student=s, ref=ref, temperature=1.0)


def _after_alignment(case: Case) -> Optional[float]:
    t = case.ref.get("teacher_full")
    if t is None or t.shape[-1] >= case.student.shape[-1] or t.dtype == case.student.dtype:
        return None
    pad = case.student[..., t.shape[-1] :].to(t.dtype)  # upstream's _align_vocab writes into the BF16 teacher
    return _alt(case, ref={"teacher_full": torch.cat([t, pad], -1)})


def _beta_bf16(case: Case) -> Optional[float]:
    b = float(torch.tensor(case.beta).bfloat16())
    return None if b == case.beta else _alt(case, beta=b)


def _mean(case: Case) -> Optional[float]:
    total, n, _ = reference_gkd(case.student, case.labels, case.beta, case.temperature, case.form, **case.ref)
    return total / n if n > 1 else None


HYPOTHESES: List[Tuple[str, Callable[[Case], Optional[float]]]] = [
    ("mean", _mean),
    ("beta bf16", _beta_bf16),
    ("temperature", _after_temperature),
    ("alignment", _after_alignment),
]


def _explains(alt: Callable, failing) -> bool:
    changed = explained = 0
    for case, res in failing:
        if res.value is None or case.check != "reference":
            continue
        try:
            a = alt(case)
        except Exception:  # noqa: BLE001 - a hypothesis that does not apply
            a = None
        if a is None:
            continue
        ref = reference_gkd(case.student, case.labels, case.beta, case.temperature, case.form, **case.ref)[0]
        tol = loss_tol(ref, res.n or 0) or 1e-12
        changed += 1
        if abs(res.value - a) <= tol and abs(res.value - a) < abs(res.value - ref):
            explained += 1
        elif abs(a - ref) > tol:  # the mistake shows in the value, and the candidate does not follow it
            pass
    return changed > 0 and 2 * explained >= changed


def _aligned_late(failing) -> bool:
    """Every failing case has a teacher vocabulary narrower than the student's and a teacher dtype narrower than
    the student's: the pad columns upstream's ``_align_vocab`` copies from the student into the teacher tensor are
    rounded to the teacher's dtype (a promotion after alignment; the rounding moves the gradient more than the
    value, so this is read from where the failures are rather than from a value)."""
    cases = [c for c, _ in failing]
    if not cases:
        return False
    for c in cases:
        t = c.ref.get("teacher_full")
        if c.check != "reference" or t is None or t.shape[-1] >= c.student.shape[-1]:
            return False
        if torch.finfo(t.dtype).bits >= torch.finfo(c.student.dtype).bits:
            return False
    return True


def _clamp_line(source: Optional[str]) -> Optional[str]:
    if not source:
        return None
    for n, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if re.search(r"\.clamp(_min)?\(|torch\.clamp\(|\.relu\(|torch\.relu\(|clamp\(min=", code):
            return f"line {n}: {code.strip()[:60]}"
    return None


def recognise(fn: Callable, failing: List[Tuple[Case, object]], source: Optional[str] = None) -> str:
    """One line naming the recognised cause of a family's failing cases, or ``""``."""
    for kind, prefix in (
        ("input written", "writes into its input "),
        ("primitive ignored", "ignores the injected "),
        ("num_valid", "num_valid "),
    ):
        hit = [r.note for _, r in failing if r.note.startswith(prefix)]
        if hit:
            what = hit[0][len(prefix) :].split(" (the caller")[0] if kind == "input written" else hit[0]
            return HINTS[kind].format(what)
    for kind, alt in HYPOTHESES:
        if _explains(alt, failing):
            return HINTS[kind]
    if _aligned_late(failing):
        return HINTS["alignment"]
    line = _clamp_line(source)
    if line and any(getattr(r, "value", None) is not None for _, r in failing):
        return HINTS["clamp"].format(line)
    return ""
