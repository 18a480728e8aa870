"""One case through the candidate, judged against the FP64 reference (or its pin), and the families' rows.

Per case: the error ratio (worst of ``|Δvalue| / loss_tol`` and ``grad rel-L2 / grad_tol``; 0 or ∞ for the
bit-exact checks), whether it failed (ratio > 1, a non-finite result, a wrong ``num_valid``, an exception or a
malformed return), whether the candidate's total is negative, and whether anything came out NaN/Inf.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Dict, List, Optional

import torch

from analysis.certify.cases import Case
from analysis.certify.families import Family
from harness.loss.reference import reference_gkd
from harness.loss.tolerances import grad_tol, loss_tol


@dataclasses.dataclass
class CaseResult:
    id: str
    ratio: float
    failed: bool
    negative: bool = False
    nonfinite: bool = False
    note: str = ""


@dataclasses.dataclass
class FamilyResult:
    name: str
    required: bool
    description: str
    cases: int
    failures: int
    worst_ratio: float
    negatives: int
    nonfinite: int
    failing: List[Dict[str, object]]
    seconds: float

    @property
    def passed(self) -> bool:
        return self.failures == 0 and self.cases > 0


def _call(fn: Callable, case: Case, student: torch.Tensor, beta=None, temperature=None):
    out = fn(student, case.teacher, case.labels, case.beta if beta is None else beta,
             case.temperature if temperature is None else temperature, **case.kwargs)
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and torch.is_tensor(out[0])):
        raise TypeError(f"gkd_loss must return (total, num_valid), got {type(out).__name__}")
    return out[0], out[1]


def _loss_and_grad(fn: Callable, case: Case):
    s = case.student.detach().clone().requires_grad_(True)
    total, num_valid = _call(fn, case, s)
    n = int(num_valid)
    loss = total / n if n else total * 0
    if loss.requires_grad:
        (loss * case.loss_scale).backward()
    grad = s.grad if s.grad is not None else torch.zeros_like(s)
    return total.detach(), n, grad


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def _reference_check(fn: Callable, case: Case) -> CaseResult:
    total, n, grad = _loss_and_grad(fn, case)
    ref_total, ref_n, ref_grad = reference_gkd(case.student, case.labels, case.beta, case.temperature, case.form,
                                               **case.ref)
    value = float(total.double())
    nonfinite = not (math.isfinite(value) and _finite(grad))
    negative = value < 0
    if n != ref_n:
        return CaseResult(case.id, math.inf, True, negative, nonfinite, f"num_valid {n}, expected {ref_n}")
    if nonfinite:
        return CaseResult(case.id, math.inf, True, negative, True, f"non-finite total {value} or gradient")
    expected = ref_total
    v_ratio = abs(value - expected) / loss_tol(ref_total, ref_n) if loss_tol(ref_total, ref_n) > 0 else (
        0.0 if value == expected else math.inf)
    g_ratio, note = 0.0, ""
    if case.judge_grad:
        ref_g = ref_grad * case.loss_scale
        norm = float(ref_g.norm())
        if norm > 0:
            rel = float((grad.double() - ref_g).norm()) / norm
            g_ratio = rel / grad_tol(ref_g, case.student.dtype)
        else:
            g_ratio = 0.0 if float(grad.abs().max()) == 0 else math.inf
    ratio = max(v_ratio, g_ratio)
    if ratio > 1:
        note = (f"value {value:.6g} vs FP64 {expected:.6g} ({v_ratio:.3g}x tol)" if v_ratio >= g_ratio else
                f"gradient rel-L2 {g_ratio:.3g}x tol")
    return CaseResult(case.id, ratio, ratio > 1, negative, False, note)


def _value(fn: Callable, case: Case) -> torch.Tensor:
    with torch.no_grad():
        return _call(fn, case, case.student)[0]


def _pinned_check(fn: Callable, case: Case) -> CaseResult:
    v = float(_value(fn, case).double()) / case.divisor
    if not math.isfinite(v):
        return CaseResult(case.id, math.inf, True, False, True, f"non-finite {v}")
    ratio = abs(v - case.expected) / case.abs_tol
    note = f"{v:.6g}, pinned {case.expected:.6g} ± {case.abs_tol:g}" if ratio > 1 else ""
    return CaseResult(case.id, ratio, ratio > 1, v < 0, False, note)


def _pair_check(fn: Callable, case: Case) -> CaseResult:
    a, b = _value(fn, case), _value(fn, case.other)
    nonfinite = not (_finite(a) and _finite(b))
    if case.check == "differ":
        ok = not torch.equal(a, b)
        note = "" if ok else f"both {float(a):.6g}"
    else:
        ok = torch.equal(a, b)
        note = "" if ok else f"{float(a):.9g} vs swapped {float(b):.9g}"
    return CaseResult(case.id, 0.0 if ok else math.inf, not ok or nonfinite, float(a) < 0, nonfinite, note)


def _identity_check(fn: Callable, upstream: Callable, case: Case) -> CaseResult:
    t1, n1, g1 = _loss_and_grad(fn, case)
    t2, n2, g2 = _loss_and_grad(upstream, case)
    same = t1.dtype == t2.dtype and torch.equal(t1, t2) and n1 == n2 and torch.equal(g1, g2)
    note = "" if same else (f"total {float(t1):.9g} vs upstream {float(t2):.9g}" if not torch.equal(t1, t2) else
                            "gradient differs from upstream's")
    return CaseResult(case.id, 0.0 if same else math.inf, not same, float(t1) < 0, not _finite(t1), note)


def evaluate(fn: Callable, case: Case, upstream: Optional[Callable] = None) -> CaseResult:
    """Run ``case`` through ``fn`` (a ``gkd_loss`` drop-in); an exception is a failed case naming it."""
    try:
        if case.check == "reference":
            return _reference_check(fn, case)
        if case.check == "pinned":
            return _pinned_check(fn, case)
        if case.check in ("differ", "symmetric"):
            return _pair_check(fn, case)
        if case.check == "identity":
            return _identity_check(fn, upstream, case)
        raise ValueError(case.check)
    except Exception as e:  # noqa: BLE001 - a candidate that raises fails the case, naming the error
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return CaseResult(case.id, math.inf, True, False, False, f"raised {type(e).__name__}: {msg}"[:200])


def run_family(fn: Callable, family: Family, form: str, quick: bool, upstream: Optional[Callable] = None,
               max_failing: int = 5) -> FamilyResult:
    t0 = time.perf_counter()
    results = [evaluate(fn, c, upstream) for c in family.build(form, quick)]
    bad = [r for r in results if r.failed]
    bad.sort(key=lambda r: -r.ratio)
    return FamilyResult(
        name=family.name, required=family.required, description=family.description, cases=len(results),
        failures=len(bad), worst_ratio=max((r.ratio for r in results), default=0.0),
        negatives=sum(r.negative for r in results), nonfinite=sum(r.nonfinite for r in results),
        failing=[{"case": r.id, "ratio": r.ratio, "note": r.note} for r in bad[:max_failing]],
        seconds=time.perf_counter() - t0)
