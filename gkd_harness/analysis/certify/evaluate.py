"""One case through the candidate, judged against the FP64 reference (or its pin), and the families' rows.

Per case: the error ratio (worst of ``|Δvalue| / loss_tol`` and ``grad rel-L2 / grad_tol``; 0 or ∞ for the
bit-exact checks), whether it failed (ratio above its bar, a non-finite result, a wrong ``num_valid``, an
exception, a malformed return, an input the candidate wrote into, or an injected primitive it never called),
whether the candidate's total is negative, and whether anything came out NaN/Inf.

The inputs are the caller's: every call of the candidate gets its own copies (taken before the call), the
reference reads the untouched originals, and a copy that differs afterwards fails the case naming the input.

The bar of a case is 1 (its tolerance), except under ``--strict`` with ``bar="upstream"`` in the hard regimes:
there a case fails only where the candidate is worse than upstream's own formula computed in FP32 on the same
inputs (:func:`_textbook_fp32`); a non-finite upstream result is reported, not held against the candidate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.analysis.certify.cases import Case
from gkd_harness.analysis.certify.families import Family
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import grad_tol, loss_tol

TEACHER_FIELDS = ("full_logits", "topk_logprobs", "topk_indices", "labels")
#: A failing family whose every failing case is finite, non-negative and within this many tolerances is "near"
#: (a nearly-right fix); beyond it, negative or NaN: "defect".
NEAR_FACTOR = 10.0


@dataclasses.dataclass
class CaseResult:
    id: str
    ratio: float
    failed: bool
    negative: bool = False
    nonfinite: bool = False
    note: str = ""
    value: Optional[float] = None  # the candidate's total (reference checks)
    n: Optional[int] = None  # its num_valid
    ref_value: Optional[float] = None  # the FP64 reference's total (reference checks)
    cause: str = ""  # a recognised cause (see gkd_harness.analysis.certify.causes), set for failing cases
    mode: str = ""  # the case's teacher form ("full vocabulary" / "top-k") and dtype pair, for the failure pattern
    pair: str = ""
    repro: str = ""  # the case's one-line reproduction, where it has one (the random search)


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
    severity: str = ""  # failing families: "near" (within NEAR_FACTOR x tolerance) or "defect"
    cause: str = ""  # one line where the cause is recognised
    bar: str = "tolerance"  # "tolerance" or "upstream" (no worse than upstream's formula in FP32)
    modes: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # mode -> [cases, failures]
    pairs: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # dtype pair -> [cases, failures]

    @property
    def passed(self) -> bool:
        return self.failures == 0 and self.cases > 0


# ------------------------------------------------------------------------------------------------ the inputs
def _copy_teacher(t: TeacherOutput) -> TeacherOutput:
    return TeacherOutput(
        **{f: (getattr(t, f).clone() if torch.is_tensor(getattr(t, f)) else getattr(t, f)) for f in TEACHER_FIELDS}
    )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _written(case: Case, student: torch.Tensor, teacher: TeacherOutput, labels: torch.Tensor) -> List[str]:
    """The inputs whose copy the candidate changed: ``student_logits``, ``teacher_output.<field>``, ``labels``."""
    out = [] if _same(student.detach(), case.student) else ["student_logits"]
    out += [
        f"teacher_output.{f}"
        for f in TEACHER_FIELDS
        if torch.is_tensor(getattr(case.teacher, f)) and not _same(getattr(teacher, f), getattr(case.teacher, f))
    ]
    return out + ([] if _same(labels, case.labels) else ["labels"])


class InputWritten(Exception):
    """The candidate wrote into an input tensor (named in the message)."""


class StateChanged(Exception):
    """The candidate left global torch state changed (named in the message); the state was restored."""


_set_num_threads = torch.set_num_threads


def watch_threads() -> None:
    """Make ``torch.set_num_threads`` record the values it is called with (its attribute ``calls``): a candidate
    that sets the count the judge already runs with (1 on a CI runner) changes nothing visible, yet a trainer's."""
    calls: List[int] = []

    def set_num_threads(nthreads: int) -> None:
        calls.append(int(nthreads))
        _set_num_threads(nthreads)

    set_num_threads.calls = calls  # type: ignore[attr-defined]
    torch.set_num_threads = set_num_threads


def torch_state() -> Dict[str, Any]:
    """The global torch state a loss must leave as it found it: intra-op threads, flush-denormal, default dtype,
    grad mode, deterministic flags, anomaly mode, matmul precision and the RNG states (CPU; CUDA where
    initialised)."""
    st: Dict[str, Any] = {
        # the calls torch.set_num_threads recorded (evaluate.watch_threads, in the candidate's child process)
        "threads": (torch.get_num_threads(), len(getattr(torch.set_num_threads, "calls", ()))),
        # torch has no getter for flush-denormal: a denormal FP32 product comes out 0 when it is on
        "flush denormal": bool((torch.tensor(1e-39, dtype=torch.float32) * 1.0).item() == 0.0),
        "default dtype": torch.get_default_dtype(),
        "grad mode": torch.is_grad_enabled(),
        "deterministic algorithms": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "anomaly mode": torch.is_anomaly_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "RNG state": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["CUDA RNG state"] = torch.cuda.get_rng_state_all()
    return st


def _equal_state(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal_state(x, y) for x, y in zip(a, b))
    return a == b


def restore_state(st: Dict[str, Any]) -> None:
    _set_num_threads(st["threads"][0])
    torch.set_flush_denormal(st["flush denormal"])
    torch.set_default_dtype(st["default dtype"])
    torch.set_grad_enabled(st["grad mode"])
    torch.use_deterministic_algorithms(st["deterministic algorithms"][0], warn_only=st["deterministic algorithms"][1])
    torch.backends.cudnn.deterministic = st["cudnn.deterministic"]
    torch.backends.cudnn.benchmark = st["cudnn.benchmark"]
    torch.set_anomaly_enabled(st["anomaly mode"])
    torch.set_float32_matmul_precision(st["float32 matmul precision"])
    torch.set_rng_state(st["RNG state"])
    if "CUDA RNG state" in st:
        torch.cuda.set_rng_state_all(st["CUDA RNG state"])


def changed_state(before: Dict[str, Any]) -> List[str]:
    """The entries of :func:`torch_state` that differ from ``before`` (and restores them)."""
    after = torch_state()
    changed = [k for k in before if not _equal_state(before[k], after.get(k))]
    if changed:
        restore_state(before)
    return [_change(k, before[k], after[k]) for k in changed]


def _change(key: str, before: Any, after: Any) -> str:
    if key == "threads":
        calls = getattr(torch.set_num_threads, "calls", ())
        called = f" (torch.set_num_threads({calls[-1]}) called)" if calls else ""
        return f"threads {before[0]} -> {after[0]}{called}"
    return f"{key} {before} -> {after}" if not torch.is_tensor(before) and key != "CUDA RNG state" else key


def _versions(student: torch.Tensor, teacher: TeacherOutput, labels: torch.Tensor) -> Dict[str, int]:
    out = {"student_logits": student._version, "labels": labels._version}
    out.update(
        {
            f"teacher_output.{f}": getattr(teacher, f)._version
            for f in TEACHER_FIELDS
            if torch.is_tensor(getattr(teacher, f))
        }
    )
    return out


def _call(fn: Callable, case: Case, student: torch.Tensor, beta=None, temperature=None, teacher=None, labels=None):
    """``(total, num_valid)`` of one call; raises :class:`StateChanged` when the call left global torch state
    changed, :class:`InputWritten` when it wrote into an input (even one it restored: the tensor's version moved)."""
    teacher = case.teacher if teacher is None else teacher
    labels = case.labels if labels is None else labels
    torch.rand(())  # the RNG moves on between calls, so a candidate that reseeds it (to any seed) changes it
    state, versions = torch_state(), _versions(student, teacher, labels)
    try:
        out = fn(
            student,
            teacher,
            labels,
            case.beta if beta is None else beta,
            case.temperature if temperature is None else temperature,
            **case.kwargs,
        )
    finally:
        changed = changed_state(state)
    if changed:
        raise StateChanged(", ".join(changed))
    moved = [k for k, v in _versions(student, teacher, labels).items() if v != versions[k]]
    if moved:
        raise InputWritten(f"{', '.join(moved)} (in place, even if restored afterwards)")
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and torch.is_tensor(out[0])):
        raise TypeError(f"gkd_loss must return (total, num_valid), got {type(out).__name__}")
    return out[0], out[1]


GRAD_MODES = {"grad": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def _total_under(upstream: Optional[Callable]) -> Optional[Callable[[Case], float]]:
    """A case's total under ``upstream`` (FP64 number), for the recognised causes; None without upstream."""
    if upstream is None:
        return None
    return lambda case: float(_loss_and_grad(upstream, case)[0].double())


def _loss_and_grad(fn: Callable, case: Case, cast: Optional[torch.dtype] = None):
    """``(total, num_valid, grad of total/num_valid · loss_scale)`` of ``fn`` on copies of the case's inputs.

    ``cast``: run on inputs promoted to this dtype (the textbook FP32 comparison); the gradient is then rounded
    once to the student's dtype. Raises :class:`InputWritten` when a copy changed."""
    student = case.student.detach().clone()
    teacher, labels = _copy_teacher(case.teacher), case.labels.clone()
    if cast is not None:
        student = student.to(cast)
        teacher = TeacherOutput(
            **{
                f: (
                    getattr(teacher, f).to(cast)
                    if torch.is_tensor(getattr(teacher, f)) and getattr(teacher, f).is_floating_point()
                    else getattr(teacher, f)
                )
                for f in TEACHER_FIELDS
            }
        )
    s = student.requires_grad_(True)
    with GRAD_MODES[case.grad_mode]():
        total, num_valid = _call(fn, case, s, teacher=teacher, labels=labels)
    n = int(num_valid)
    loss = total / n if n else total * 0
    if case.grad_mode == "grad" and loss.requires_grad:
        (loss * case.loss_scale).backward()
    if cast is None:
        written = _written(case, s, teacher, labels)
        if written:
            raise InputWritten(", ".join(written))
    grad = s.grad if s.grad is not None else torch.zeros_like(s)
    return total.detach(), n, grad.to(case.student.dtype)


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


# ------------------------------------------------------------------------------------------------ judging
def _ratios(value: float, grad: torch.Tensor, case: Case, ref) -> Tuple[float, float]:
    """``(value ratio, gradient ratio)`` against ``ref = (total, n, grad)`` with the case's tolerances."""
    ref_total, ref_n, ref_grad = ref
    tol = loss_tol(ref_total, ref_n)
    v_ratio = abs(value - ref_total) / tol if tol > 0 else (0.0 if value == ref_total else math.inf)
    g_ratio = 0.0
    if case.judge_grad:
        ref_g = ref_grad * case.loss_scale
        norm = float(ref_g.norm())
        if norm > 0:
            rel = float((grad.double() - ref_g).norm()) / norm
            g_ratio = rel / grad_tol(ref_g, case.student.dtype, case.grad_factor)
        else:
            g_ratio = 0.0 if float(grad.abs().max()) == 0 else math.inf
    return v_ratio, g_ratio


def zeroed(grad: torch.Tensor, case: Case, ref) -> Tuple[int, int]:
    """``(zeroed, representable)`` for an FP16/BF16 student: entries whose (loss-scaled) FP64 gradient is at least
    the dtype's smallest subnormal in magnitude, and those of them the candidate returned as exactly 0. A relative
    L2 does not see them when a few large entries dominate the norm (FP16, V = 32,768: a loss that stores ∂JSD/∂z
    unscaled in FP16 returned 63 % of them as 0 within the L2 tolerance). ``(0, 0)`` for wider students."""
    if not case.judge_grad or case.student.dtype not in (torch.float16, torch.bfloat16):
        return 0, 0
    tiny = torch.finfo(case.student.dtype).smallest_normal * torch.finfo(case.student.dtype).eps
    representable = (ref[2] * case.loss_scale).abs() >= tiny
    t_full = case.ref.get("teacher_full")
    if t_full is not None and t_full.shape == case.student.shape:
        # a row whose teacher logits are the student's plus a constant (a BF16 teacher = student + noise can round
        # back to that) holds the same distribution: its gradient is exactly 0, and the FP64 reference's entries
        # there are its own rounding, not representable gradient (the difference is exact in FP64)
        diff = case.student.double() - t_full.double()
        representable &= ~(diff.amax(-1, keepdim=True) == diff.amin(-1, keepdim=True))
    return int(((grad == 0) & representable).sum()), int(representable.sum())


def reference_of(case: Case):
    """The FP64 reference ``(total, n, grad)`` of a case, on its original inputs."""
    return reference_gkd(case.student, case.labels, case.beta, case.temperature, case.form, **case.ref)


def _textbook_fp32(upstream: Callable, case: Case, ref) -> Tuple[float, str]:
    """Upstream's own formula computed in FP32 on the same inputs: ``(ratio, note)`` (``inf`` if non-finite)."""
    try:
        total, n, grad = _loss_and_grad(upstream, case, cast=torch.float32)
    except Exception as e:  # noqa: BLE001
        return math.inf, f"upstream in FP32 raised {type(e).__name__}"
    value = float(total.double())
    if not (math.isfinite(value) and _finite(grad)):
        return math.inf, f"upstream in FP32 gives {value:.3g} (non-finite)"
    if n != ref[1]:
        return math.inf, f"upstream in FP32 num_valid {n}"
    r = max(_ratios(value, grad, case, ref))
    z, rep = zeroed(grad, case, ref)
    if z:
        return math.inf, f"upstream in FP32 zeroes {z} of {rep} representable gradient entries"
    return r, f"upstream in FP32 {r:.3g}x tol"


def _reference_check(fn: Callable, case: Case, upstream: Optional[Callable] = None) -> CaseResult:
    ref = reference_of(case)

    def out(*args, **kwargs) -> CaseResult:
        return dataclasses.replace(CaseResult(*args, **kwargs), ref_value=float(ref[0]))

    total, n, grad = _loss_and_grad(fn, case)
    value = float(total.double())
    nonfinite = not (math.isfinite(value) and _finite(grad))
    negative = value < 0
    bar, up_note = 1.0, ""
    if case.relative and upstream is not None:
        up, up_note = _textbook_fp32(upstream, case, ref)
        bar = max(1.0, up)
    if n != ref[1]:
        return out(case.id, math.inf, True, negative, nonfinite, f"num_valid {n}, expected {ref[1]}", value, n)
    if nonfinite:
        if math.isinf(bar):
            return out(case.id, math.inf, False, negative, True, f"non-finite, as {up_note}", value, n)
        return out(case.id, math.inf, True, negative, True, f"non-finite total {value} or gradient", value, n)
    v_ratio, g_ratio = _ratios(value, grad, case, ref)
    z, rep = zeroed(grad, case, ref)
    ratio = math.inf if z else max(v_ratio, g_ratio)
    note = ""
    if ratio > bar:
        note = (
            f"{z} of {rep} representable gradient entries zeroed ({100 * z / rep:.3g} %; gradient rel-L2 "
            f"{g_ratio:.3g}x tol)"
            if z
            else f"value {value:.6g} vs FP64 {ref[0]:.6g} ({v_ratio:.3g}x tol)"
            if v_ratio >= g_ratio
            else f"gradient rel-L2 {g_ratio:.3g}x tol"
        )
        if up_note:
            note += f"; {up_note}"
    return out(case.id, ratio, ratio > bar, negative, False, note, value, n)


def _value(fn: Callable, case: Case) -> torch.Tensor:
    teacher, labels, student = _copy_teacher(case.teacher), case.labels.clone(), case.student.clone()
    with torch.no_grad():
        out = _call(fn, case, student, teacher=teacher, labels=labels)[0]
    written = _written(case, student, teacher, labels)
    if written:
        raise InputWritten(", ".join(written))
    return out


def _pinned_check(fn: Callable, case: Case) -> CaseResult:
    if case.expected is None:
        raise ValueError(f"{case.id}: a pinned case has no expected value")
    v = float(_value(fn, case).double()) / case.divisor
    if not math.isfinite(v):
        return CaseResult(case.id, math.inf, True, False, True, f"non-finite {v}")
    ratio = abs(v - case.expected) / case.abs_tol
    note = f"{v:.6g}, pinned {case.expected:.6g} ± {case.abs_tol:g}" if ratio > 1 else ""
    return CaseResult(case.id, ratio, ratio > 1, v < 0, False, note)


def _pair_check(fn: Callable, case: Case) -> CaseResult:
    if case.other is None:
        raise ValueError(f"{case.id}: a {case.check} case has no second call")
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
    note = (
        ""
        if same
        else (
            f"total {float(t1):.9g} vs upstream {float(t2):.9g}"
            if not torch.equal(t1, t2)
            else "gradient differs from upstream's"
        )
    )
    return CaseResult(case.id, 0.0 if same else math.inf, not same, float(t1) < 0, not _finite(t1), note)


# ------------------------------------------------------------------------------------------------ memory
def _alive() -> Tuple[int, Optional[int]]:
    """``(tensors alive, RSS in bytes or None where /proc is not there)`` after a garbage collection."""
    gc.collect()
    tensors = sum(1 for o in gc.get_objects() if torch.is_tensor(o))
    try:
        with open("/proc/self/statm") as f:
            return tensors, int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return tensors, None


def _growth(fn: Callable, case: Case) -> Tuple[int, Optional[int]]:
    """What ``case.calls`` calls of ``fn`` (value and backward, results dropped), in two halves after 2 warm-up
    calls, leave behind: ``(more tensors alive, the smaller of the two halves' RSS growth in bytes)``. A leak grows
    in both halves; the allocator's one-time growth does not."""
    for _ in range(2):
        _loss_and_grad(fn, case)
    seen = [_alive()]
    for _ in range(2):
        for _ in range(case.calls // 2):
            _loss_and_grad(fn, case)
        seen.append(_alive())
    rss = [r for _, r in seen]
    grew = None if None in rss else min(rss[1] - rss[0], rss[2] - rss[1])  # type: ignore[operator]
    return seen[2][0] - seen[0][0], grew


def _memory_check(fn: Callable, case: Case, upstream: Optional[Callable]) -> CaseResult:
    """Repeated calls leave no more behind than upstream's do: fewer than ``calls / 2`` more tensors alive, and an
    RSS that does not keep growing by more than one student-sized FP32 tensor per call beyond upstream's growth (a
    loss that keeps each call's total keeps its graph: several such tensors per call)."""
    grown, rss = _growth(fn, case)
    up_grown, up_rss = _growth(upstream, case) if upstream is not None else (0, 0)
    per_half = case.calls // 2 * case.student.numel() * 4
    problems = []
    if grown - up_grown >= max(1, case.calls // 2):
        problems.append(f"keeps {grown} more tensors alive after {case.calls} calls (upstream: {up_grown})")
    if rss is not None and up_rss is not None and rss - max(up_rss, 0) > per_half:
        problems.append(
            f"RSS grew by {rss / 2**20:.0f} MiB in each half of {case.calls} calls (upstream: "
            f"{max(up_rss, 0) / 2**20:.0f} MiB)"
        )
    return CaseResult(case.id, math.inf if problems else 0.0, bool(problems), note="; ".join(problems))


# ------------------------------------------------------------------------------------------------ the contract
class _Sentinel(Exception):
    """Raised by an injected primitive: the candidate must let it through."""


def _raising(name: str):
    def fn(*args, **kwargs):
        raise _Sentinel(f"raised by the injected {name}")

    return fn


def _caused_by_sentinel(e: BaseException) -> bool:
    seen = 0
    cur: Optional[BaseException] = e
    while cur is not None and seen < 10:
        if isinstance(cur, _Sentinel):
            return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


def _contract_call(fn: Callable, case: Case, grad_mode: str = "grad"):
    """``(total, num_valid, student copy)`` of one call on copies of the inputs in ``grad_mode``."""
    s = case.student.detach().clone().requires_grad_(True)
    teacher, labels = _copy_teacher(case.teacher), case.labels.clone()  # outside inference_mode: normal tensors
    with GRAD_MODES[grad_mode]():
        total, n = _call(fn, case, s, teacher=teacher, labels=labels)
    return total, n, s


def _contract_problems(fn: Callable, case: Case) -> List[str]:
    """What ms-swift's callers rely on, for one call of ``case`` (``check="contract"``, ``contract="call"``):
    ``total`` a 0-dim floating tensor at least as wide as the student's dtype, on its device, connected to the
    student's graph (empty partitions included: backward() runs on every rank); ``num_valid`` a tensor (Megatron
    calls ``.detach()`` on it); the same inputs twice bit-identical (value and gradient); the value under
    ``no_grad`` and ``inference_mode`` within the value tolerance of the value with grad."""
    out: List[str] = []
    total, n, s = _contract_call(fn, case)
    if total.dim() != 0:
        out.append(f"total has shape {tuple(total.shape)}, not 0-dim")
    if not total.is_floating_point() or torch.promote_types(total.dtype, s.dtype) != total.dtype:
        out.append(f"total is {total.dtype} for a {s.dtype} student (narrower or not floating)")
    if total.device != s.device:
        out.append(f"total on {total.device}, student on {s.device}")
    if not torch.is_tensor(n):
        out.append(f"num_valid is a {type(n).__name__}, not a tensor")
    grad = None
    if not total.requires_grad:
        out.append("total is not connected to the student's graph (backward() raises on this rank)")
    else:
        (grad,) = torch.autograd.grad(total, s, allow_unused=True)
        if grad is None:
            out.append("total does not depend on student_logits in the graph")
    total2, n2, s2 = _contract_call(fn, case)
    grad2 = torch.autograd.grad(total2, s2, allow_unused=True)[0] if total2.requires_grad else None
    if not (torch.equal(total.detach(), total2.detach()) and int(n) == int(n2)):
        out.append(f"two calls on the same inputs differ: {float(total):.9g} then {float(total2):.9g}")
    elif grad is not None and (grad2 is None or not torch.equal(grad, grad2)):
        out.append("two calls on the same inputs give different gradients")
    v = float(total.detach().double())
    tol = loss_tol(v, int(n)) if math.isfinite(v) else 0.0
    for mode in ("no_grad", "inference_mode"):
        t_m = float(_contract_call(fn, case, mode)[0].double())
        if not (abs(t_m - v) <= tol or (math.isnan(t_m) and math.isnan(v))):
            out.append(f"under {mode} the total is {t_m:.6g}, with grad {v:.6g}")
    return out


def _contract_check(fn: Callable, case: Case) -> CaseResult:
    if case.contract == "call":
        problems = _contract_problems(fn, case)
    else:  # an exception must reach the caller: a label-count mismatch, or one raised by an injected primitive
        raising = case.contract.startswith("raising ")
        kwargs = {case.contract.split(" ", 1)[1]: _raising(case.contract.split(" ", 1)[1])} if raising else {}
        calls = [0]
        if raising:
            name = case.contract.split(" ", 1)[1]
            raiser = _raising(name)

            def counted(*args, **kw):
                calls[0] += 1
                return raiser(*args, **kw)

            kwargs = {name: counted}
        probe = dataclasses.replace(case, kwargs={**case.kwargs, **kwargs})
        try:
            _contract_call(fn, probe)
            # a primitive never called raised nothing to propagate (the injected-primitives family judges that)
            problems = (
                []
                if raising and not calls[0]
                else [f"returned normally: {'the injected primitive raised' if raising else 'labels disagree'}"]
            )
        except (StateChanged, InputWritten):
            raise
        except Exception as e:  # noqa: BLE001 - what we want
            problems = [] if not raising or _caused_by_sentinel(e) else [f"raised {type(e).__name__}, not the error"]
        if problems:
            problems = [f"swallows an exception ({problems[0]})"]
    return CaseResult(case.id, math.inf if problems else 0.0, bool(problems), note="; ".join(problems))


# ------------------------------------------------------------------------------------ injected primitives, 2 ranks
class _Group:
    """Two ranks as threads of this process: an all-reduce (sum or max over ``[C]`` row quantities) that waits for
    both, as a vocab-parallel group does. A candidate that calls it a different number of times on each rank, or
    raises on one, breaks the barrier (``timeout`` seconds) instead of hanging."""

    def __init__(self, ranks: int = 2, timeout: float = 60.0):
        self.barrier = threading.Barrier(ranks, timeout=timeout)
        self.slots: List[Optional[torch.Tensor]] = [None] * ranks

    def all_reduce(self, rank: int, x: torch.Tensor, op: str) -> torch.Tensor:
        self.slots[rank] = x.detach()
        self.barrier.wait()
        try:
            parts = torch.stack([s.to(x.dtype) for s in self.slots if s is not None])  # all set past the barrier
        except RuntimeError as e:  # shapes differ between the ranks
            self.barrier.abort()
            shapes = [tuple(s.shape) for s in self.slots if s is not None]
            raise RuntimeError(f"ranks reduce different shapes: {shapes}") from e
        out = parts.sum(0) if op == "sum" else parts.amax(0)
        self.barrier.wait()
        return out


class _ReduceSum(torch.autograd.Function):
    """Sum over the ranks; backward identity (the consumer is replicated on every rank, as Megatron's
    reduce-from-model-parallel region)."""

    @staticmethod
    def forward(ctx, x, group, rank):
        return group.all_reduce(rank, x, "sum")

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class _ShardLogSoftmax(torch.autograd.Function):
    """Log-softmax of a vocabulary shard normalised over the whole vocabulary (max and Σ exp reduced over ranks);
    backward reduces ``Σ g`` over the ranks (the normaliser depends on every shard)."""

    @staticmethod
    def forward(ctx, x, group, rank):
        m = group.all_reduce(rank, x.amax(-1), "max")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        sumexp = group.all_reduce(rank, (x - m[..., None]).exp().sum(-1), "sum")
        out = x - m[..., None] - sumexp.log()[..., None]
        ctx.save_for_backward(out)
        ctx.group, ctx.rank = group, rank
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        total = ctx.group.all_reduce(ctx.rank, g.sum(-1), "sum")
        return g - out.exp() * total[..., None], None, None


def shard_primitives(group: _Group, rank: int, offset: int, width: int, calls: Dict[str, int]):
    """``gather_fn`` / ``log_softmax_fn`` / ``kl_div_fn`` of rank ``rank`` holding vocabulary ids
    ``[offset, offset + width)``: each one's result is wrong unless it is called (the other shard is held by the
    other rank). ``calls`` counts the calls by name."""

    def log_softmax_fn(x):
        calls["log_softmax_fn"] += 1
        return _ShardLogSoftmax.apply(x, group, rank)

    def kl_div_fn(input_log, target_log):
        calls["kl_div_fn"] += 1
        p = target_log.exp()
        local = torch.where(p > 0, p * (target_log - input_log), torch.zeros_like(p)).sum(-1)
        return _ReduceSum.apply(local, group, rank)

    def gather_fn(logits, indices):
        calls["gather_fn"] += 1
        mine = (indices >= offset) & (indices < offset + width)
        local = torch.gather(logits, -1, torch.where(mine, indices - offset, 0))
        return _ReduceSum.apply(torch.where(mine, local, torch.zeros_like(local)), group, rank)

    return {"gather_fn": gather_fn, "log_softmax_fn": log_softmax_fn, "kl_div_fn": kl_div_fn}


def _sharded_check(fn: Callable, case: Case, ranks: int = 2) -> CaseResult:
    """The case on ``ranks`` vocabulary shards (threads with a shared all-reduce), through the candidate's
    ``gkd_loss`` with the shard primitives by keyword. Value: rank 0's total; gradient: the ranks' student
    gradients side by side; both against the full-vocabulary FP64 reference."""
    ref = reference_of(case)
    v = case.student.shape[-1]
    width = v // ranks
    group = _Group(ranks)
    calls = [{"gather_fn": 0, "log_softmax_fn": 0, "kl_div_fn": 0} for _ in range(ranks)]
    results: List[Optional[tuple]] = [None] * ranks
    errors: List[Optional[BaseException]] = [None] * ranks
    topk = case.teacher.topk_indices is not None

    def body(r: int):
        try:
            sl = slice(r * width, (r + 1) * width)
            s = case.student[..., sl].detach().clone().requires_grad_(True)
            teacher = _copy_teacher(case.teacher)
            if not topk:
                teacher.full_logits = teacher.full_logits[..., sl].clone()
            prims = shard_primitives(group, r, r * width, width, calls[r])
            labels = case.labels.clone()
            total, num_valid = fn(s, teacher, labels, case.beta, case.temperature, **prims)
            original = dataclasses.replace(case, student=case.student[..., sl], teacher=_copy_teacher(case.teacher))
            if not topk:
                original.teacher.full_logits = case.teacher.full_logits[..., sl]
            written = _written(original, s, teacher, labels)
            if written:
                raise InputWritten(", ".join(written))
            n = int(num_valid)
            loss = total / n if n else total * 0
            if loss.requires_grad:
                loss.backward()
            results[r] = (total.detach(), n, s.grad if s.grad is not None else torch.zeros_like(s))
        except BaseException as e:  # noqa: BLE001 - reported as the case's failure
            errors[r] = e
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    needed = ("gather_fn",) if topk else ("log_softmax_fn", "kl_div_fn")
    unused = [p for p in needed if any(c[p] == 0 for c in calls)]
    unused_note = (
        f"ignores the injected {', '.join(unused)} (0 calls: each vocabulary shard is normalised on its own)"
        if unused
        else ""
    )
    first = next(
        (e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
        next((e for e in errors if e is not None), None),
    )
    if isinstance(first, InputWritten):
        raise first
    if first is not None:
        msg = str(first).strip().splitlines()[0] if str(first).strip() else ""
        note = unused_note or f"raised {type(first).__name__}: {msg}"[:200]
        return CaseResult(case.id, math.inf, True, False, False, note)
    done = [r for r in results if r is not None]  # every rank's, when none raised
    if len(done) != ranks:
        return CaseResult(
            case.id, math.inf, True, False, False, f"{ranks - len(done)} of {ranks} ranks returned nothing"
        )
    total, n, _ = done[0]
    grad = torch.cat([r[2] for r in done], -1)
    value = float(total.double())
    nonfinite = not (math.isfinite(value) and _finite(grad))
    if unused:
        return CaseResult(case.id, math.inf, True, value < 0, nonfinite, unused_note, value, n)
    if n != ref[1]:
        return CaseResult(case.id, math.inf, True, value < 0, nonfinite, f"num_valid {n}, expected {ref[1]}", value, n)
    if nonfinite:
        return CaseResult(case.id, math.inf, True, value < 0, True, f"non-finite total {value} or gradient", value, n)
    others = [float(r[0].double()) for r in done[1:]]
    if any(abs(o - value) > loss_tol(ref[0], ref[1]) for o in others):
        return CaseResult(
            case.id, math.inf, True, value < 0, False, f"ranks disagree: totals {[value] + others}", value, n
        )
    v_ratio, g_ratio = _ratios(value, grad, case, ref)
    ratio = max(v_ratio, g_ratio)
    note = (
        ""
        if ratio <= 1
        else (
            f"value {value:.6g} vs FP64 {ref[0]:.6g} ({v_ratio:.3g}x tol)"
            if v_ratio >= g_ratio
            else f"gradient rel-L2 {g_ratio:.3g}x tol"
        )
    )
    return CaseResult(case.id, ratio, ratio > 1, value < 0, False, note, value, n)


# ------------------------------------------------------------------------------------------------ one case, a family
def evaluate(fn: Callable, case: Case, upstream: Optional[Callable] = None) -> CaseResult:
    """Run ``case`` through ``fn`` (a ``gkd_loss`` drop-in); an exception is a failed case naming it."""
    res = _evaluate(fn, case, upstream)
    res.mode, res.pair, res.repro = case.mode, case.pair, case.repro
    return res


def _evaluate(fn: Callable, case: Case, upstream: Optional[Callable] = None) -> CaseResult:
    try:
        if case.check == "reference":
            return _reference_check(fn, case, upstream)
        if case.check == "sharded":
            return _sharded_check(fn, case)
        if case.check == "pinned":
            return _pinned_check(fn, case)
        if case.check in ("differ", "symmetric"):
            return _pair_check(fn, case)
        if case.check == "identity":
            if upstream is None:
                raise ValueError(f"{case.id}: an identity case needs upstream's function")
            return _identity_check(fn, upstream, case)
        if case.check == "contract":
            return _contract_check(fn, case)
        if case.check == "memory":
            return _memory_check(fn, case, upstream)
        raise ValueError(case.check)
    except InputWritten as e:
        return CaseResult(
            case.id,
            math.inf,
            True,
            False,
            False,
            f"writes into its input {e} (the caller's tensor)",
            cause="input written",
        )
    except StateChanged as e:
        return CaseResult(
            case.id, math.inf, True, False, False, f"changes global torch state: {e}", cause="global state"
        )
    except Exception as e:  # noqa: BLE001 - a candidate that raises fails the case, naming the error
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return CaseResult(case.id, math.inf, True, False, False, f"raised {type(e).__name__}: {msg}"[:200])


def severity(failing: List[CaseResult]) -> str:
    """``near``: every failing case finite, non-negative and within ``NEAR_FACTOR`` x its tolerance; else
    ``defect``."""
    if not failing:
        return ""
    near = all(
        math.isfinite(r.ratio) and r.ratio <= NEAR_FACTOR and not r.negative and not r.nonfinite for r in failing
    )
    return "near" if near else "defect"


def run_family(
    fn: Callable,
    family: Family,
    form: str,
    quick: bool,
    upstream: Optional[Callable] = None,
    max_failing: int = 5,
    relative: bool = False,
    source: Optional[str] = None,
    explain: bool = True,
    on_case: Optional[Callable[[str], None]] = None,
) -> FamilyResult:
    """Every case of ``family`` through ``fn``, each one (by count, never by clock). ``relative``: the bar is
    upstream's formula in FP32 (hard regimes under ``--strict``). ``source``: the candidate's source text, for the
    recognised causes; ``explain``: look for one (a family that does not gate is reported without a cause: the
    search costs reference evaluations). ``on_case``: called with each case's id before it runs (the child process
    tells its parent where it is)."""
    from gkd_harness.analysis.certify.causes import recognise

    t0 = time.perf_counter()
    cases = family.build(form, quick)
    for c in cases:
        c.relative = relative and c.check == "reference"
    results: List[CaseResult] = []
    for c in cases:
        if on_case is not None:
            on_case(c.id)
        results.append(evaluate(fn, c, upstream))
    bad = [r for r in results if r.failed]
    # paired by position: ids may repeat within a family (e.g. two noise levels under one name)
    cause = (
        recognise(
            fn,
            [(c, r) for c, r in zip(cases, results) if r.failed],
            source,
            _total_under(upstream),
            run=lambda case: _loss_and_grad(fn, case),
        )
        if bad and explain
        else ""
    )
    bad.sort(key=lambda r: -r.ratio)
    modes: Dict[str, List[int]] = {}
    pairs: Dict[str, List[int]] = {}
    for r in results:
        for table, key in ((modes, r.mode), (pairs, r.pair)):
            table.setdefault(key, [0, 0])[0] += 1
            table[key][1] += int(r.failed)
    shown = bad[:max_failing] + [r for r in bad[max_failing:] if r.repro]  # every failing draw keeps its repro
    return FamilyResult(
        name=family.name,
        required=family.required,
        description=family.description,
        cases=len(results),
        failures=len(bad),
        worst_ratio=max((r.ratio for r in results), default=0.0),
        negatives=sum(r.negative for r in results),
        nonfinite=sum(r.nonfinite for r in results),
        failing=[{"case": r.id, "ratio": r.ratio, "note": r.note, "cause": r.cause, "repro": r.repro} for r in shown],
        seconds=time.perf_counter() - t0,
        severity=severity(bad),
        cause=cause,
        bar="upstream" if relative else "tolerance",
        modes=modes,
        pairs=pairs,
    )
