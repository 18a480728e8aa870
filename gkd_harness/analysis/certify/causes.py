"""Recognised causes of a failing family, one line each, only from evidence the failing cases show.

Each hypothesis is a known way to get the loss wrong, tested on the family's failing cases: the candidate's value
is compared with the FP64 reference of the inputs *as that mistake would leave them* (β rounded to BF16, logits
divided by T in their own dtype, the BF16 teacher's pad columns holding the student's logits rounded to BF16, the
total divided by ``num_valid``). A hypothesis is named when (1) no failing case's value is off while the mistake
would leave that case's value unchanged (a failure at β = 0.5 is not "β rounded to BF16", one at T = 1 is not
"promotion after temperature"), and (2) it explains, within the value tolerance, at least half of the failing
cases whose value it visibly changes (by more than a tenth of the tolerance), each within the tolerance of the
mistake's value and five times closer to it than the mistake is to the reference. The rest read the notes (an input
written, even one restored afterwards; global state changed; a contract clause; a primitive never called; a wrong
``num_valid``) or need the source *and* behaviour (a clamp: a clamp of a loss quantity in the source, not of a
count, and a failing case whose total is ≥ 0 where upstream's own arithmetic is negative). Otherwise the family's
line says "no recognised cause".

Across families, :func:`failure_pattern` says when every failure falls in one mode (full vocabulary or top-k) or
one dtype pair while the others pass.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from gkd_harness.analysis.certify.cases import Case
from gkd_harness.harness.contract import CONTINUOUS, PAPER
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import loss_tol

HINTS = {
    "input written": "writes into an input tensor ({}): the caller's tensor changes; compute on a copy",
    "primitive ignored": "{}: under Megatron TP > 1 each rank would normalise its own vocabulary shard; call the "
    "injected primitives",
    "num_valid": "a wrong num_valid ({}): it must count the active positions (labels != -100, uncovered top-k "
    "rows dropped)",
    "mean": "a mean instead of a sum: the total is divided by num_valid (the caller divides)",
    "other form": "the other β form: the values follow the other weighting of KL(T‖M) and KL(S‖M) (paper: β·KL(T‖M) "
    "+ (1−β)·KL(S‖M); continuous: the weights swapped); certify with the --beta-form it computes, or fix the weights",
    "beta bf16": "β rounded to BF16 (a low-precision β tensor): keep β a python float or FP32+",
    "temperature": "promotion after temperature: the logits are divided by T in BF16/FP16; promote both sides "
    "before `/ temperature`",
    "alignment": "promotion after alignment: the BF16 teacher's pad columns hold the student's logits rounded to "
    "BF16 by upstream's _align_vocab; promote both sides before _align_vocab",
    "clamp": "a clamp ({}): it hides negative losses and zeroes the gradient where it bites; fix the arithmetic",
    "global state": "changes global torch state ({}): the caller's threads, flush-denormal, default dtype, RNG, grad "
    "mode, matmul precision or deterministic flags; leave them as found",
    "swallowed": "swallows exceptions ({}): a caller's error (a label mismatch, a failing collective) must reach "
    "the caller, not turn into a loss",
    "disconnected": "an empty partition (or a path) returns a total outside the student's graph: backward() raises "
    "on that rank; return a zero built from the student logits (e.g. s_logits.sum() * 0)",
    "num_valid type": "num_valid is not a tensor: Megatron's trainer calls .detach() on it",
    "dtype": "the total is narrower than the student's dtype ({}): keep it in the compute dtype",
    "grad mode": "the value depends on the autograd mode ({}): e.g. a promotion only when grad is enabled",
    "repeat": "two calls on the same inputs differ ({}): the loss is not deterministic",
    "memory": "keeps memory across calls ({}): a module-level list or cache of what it returns grows with every "
    "training step; keep nothing between calls",
    "student dtype": "the arithmetic stays in a BF16/FP16 student's dtype (the values follow upstream's with the "
    "teacher cast to the student's dtype): promote both sides to FP32 (FP64 kept), never cast the teacher down",
    "detached": "the teacher detached after _align_vocab: its missing vocabulary columns hold the student's logits, "
    "and their gradient is lost (the value is right, the gradient is the FP64 one with those columns constant); "
    "keep the graph",
    "student labels": "the teacher's rows selected with the student's labels: in self-distillation "
    "teacher_output.labels mark other positions (the same count); select the teacher's rows with its own labels",
}

#: (note substring, hint key) for the contract family's notes (evaluate._contract_problems).
CONTRACT_NOTES = [
    ("swallows an exception", "swallowed"),
    ("not connected to the student's graph", "disconnected"),
    ("does not depend on student_logits", "disconnected"),
    ("num_valid is a", "num_valid type"),
    ("narrower or not floating", "dtype"),
    ("under no_grad", "grad mode"),
    ("under inference_mode", "grad mode"),
    ("two calls on the same inputs", "repeat"),
]


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


def _other_form(case: Case) -> Optional[float]:
    other = CONTINUOUS if case.form == PAPER else PAPER
    if case.beta in (0.0, 0.5, 1.0):  # the forms agree there
        return None
    return reference_gkd(case.student, case.labels, case.beta, case.temperature, other, **case.ref)[0]


def _student_labels(case: Case) -> Optional[float]:
    t_labels = case.ref.get("teacher_labels")
    if t_labels is None or torch.equal(t_labels, case.labels):
        return None
    return _alt(case, ref={k: v for k, v in case.ref.items() if k != "teacher_labels"})


HYPOTHESES: List[Tuple[str, Callable[[Case], Optional[float]]]] = [
    ("student labels", _student_labels),
    ("other form", _other_form),
    ("mean", _mean),
    ("beta bf16", _beta_bf16),
    ("temperature", _after_temperature),
    ("alignment", _after_alignment),
]


def _explains(alt: Callable, failing) -> bool:
    """See the module docstring: no contradicting failure, and at least half of the visibly changed cases followed."""
    changed = explained = 0
    for case, res in failing:
        if res.value is None or case.check not in ("reference", "sharded"):
            continue
        ref = res.ref_value
        if ref is None:
            ref = reference_gkd(case.student, case.labels, case.beta, case.temperature, case.form, **case.ref)[0]
        tol = loss_tol(ref, res.n or 0) or 1e-12
        try:
            a = alt(case)
        except Exception:  # noqa: BLE001 - a hypothesis that does not apply
            a = None
        if a is None or abs(a - ref) <= 0.1 * tol:  # the mistake would not show in this case's value
            if abs(res.value - ref) > tol:  # ... but the value is off: something else is wrong
                return False
            continue
        changed += 1
        if abs(res.value - a) <= min(tol, 0.2 * abs(a - ref)):  # much closer to the mistake than to the reference
            if abs(a) <= tol:  # the mistake's value is about 0: any loss that comes out near 0 matches it
                changed -= 1
            else:
                explained += 1
    return changed > 0 and 2 * explained >= changed


def _in_student_dtype(case: Case, upstream_total: Optional[Callable[[Case], float]]) -> Optional[float]:
    """Upstream's arithmetic with the teacher cast to the student's dtype (a "fix" that casts instead of
    promoting): for a BF16/FP16 student everything stays in its dtype; a wider student's value is right."""
    if upstream_total is None or case.student.dtype not in (torch.bfloat16, torch.float16):
        return None
    cast = {
        f: (x.to(case.student.dtype) if torch.is_tensor(x) and x.is_floating_point() else x)
        for f, x in vars(case.teacher).items()
    }
    return upstream_total(dataclasses.replace(case, teacher=type(case.teacher)(**cast)))


def _teacher_detached(run: Callable, failing) -> bool:
    """Every failing case has a full-vocabulary teacher narrower than the student (upstream's ``_align_vocab``
    fills its missing columns with the student's logits, graph kept), and the candidate's gradient is the FP64
    reference's with those columns detached (within the gradient tolerance, five times closer to it than to the
    reference's)."""
    from gkd_harness.harness.loss.tolerances import grad_tol

    if not failing:
        return False
    for case, _ in failing:
        t = case.ref.get("teacher_full")
        if case.check != "reference" or t is None or t.shape[-1] >= case.student.shape[-1]:
            return False
        try:
            grad = run(case)[2].double() / case.loss_scale
        except Exception:  # noqa: BLE001 - no evidence
            return False
        pad = case.student[..., t.shape[-1] :].double()  # a constant: no graph back to the student
        rest = {k: v for k, v in case.ref.items() if k != "teacher_full"}
        detached = reference_gkd(
            case.student,
            case.labels,
            case.beta,
            case.temperature,
            case.form,
            teacher_full=torch.cat([t.double(), pad], -1),
            **rest,
        )[2]
        right = reference_gkd(case.student, case.labels, case.beta, case.temperature, case.form, **case.ref)[2]
        off, miss = float((grad - detached).norm()), float((detached - right).norm())
        if not (off <= grad_tol(detached, case.student.dtype) * float(detached.norm()) and off <= 0.2 * miss):
            return False
    return True


def _grad_mode_shows(run: Callable, failing) -> bool:
    """Every failing case runs under ``no_grad`` / ``inference_mode``, and the same inputs with grad give the
    FP64 value: the mode is what changes the value (a stale cache keyed by shape fails with grad too)."""
    if not failing or any(c.grad_mode == "grad" or r.ref_value is None for c, r in failing):
        return False
    for case, res in failing:
        try:
            value = float(run(dataclasses.replace(case, grad_mode="grad"))[0].double())
        except Exception:  # noqa: BLE001
            return False
        if not abs(value - res.ref_value) <= loss_tol(res.ref_value, res.n or 0):
            return False
    return True


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


#: A clamp of a count (``num_valid.clamp(min=1)``, ``max(n, 1)``) is no clamp of the loss.
_COUNT = re.compile(r"num_valid|n_valid|count|numel|clamp\(min=1\)|clamp_min\(1\)|\.clamp\(1\)")


def _clamp_line(source: Optional[str]) -> Optional[str]:
    if not source:
        return None
    for n, line in enumerate(source.splitlines(), 1):
        code = line.split("#", 1)[0]
        if re.search(r"\.clamp(_min)?\(|torch\.clamp\(|\.relu\(|torch\.relu\(|clamp\(min=", code) and not _COUNT.search(
            code
        ):
            return f"line {n}: {code.strip()[:60]}"
    return None


def _clamp_shows(failing, upstream_total: Optional[Callable[[Case], float]]) -> bool:
    """A failing case whose total is ≥ 0 where upstream's own arithmetic (the installed gkd_loss, through
    ``upstream_total``: the case's total under upstream) is negative on the same inputs: the clamp hid a negative
    loss."""
    if upstream_total is None:
        return False
    for case, res in failing[:6]:
        if res.value is None or res.value < 0 or case.check != "reference":
            continue
        try:
            total = upstream_total(case)
        except Exception:  # noqa: BLE001 - no evidence from this case
            continue
        if total < 0:
            return True
    return False


def recognise(
    fn: Callable,
    failing: List[Tuple[Case, Any]],
    source: Optional[str] = None,
    upstream_total: Optional[Callable[[Case], float]] = None,
    run: Optional[Callable[[Case], Tuple[Any, int, torch.Tensor]]] = None,
) -> str:
    """One line naming the recognised cause of a family's failing cases, or ``""``. ``run``: the candidate on a
    case, ``(total, num_valid, gradient)`` (the evaluation's call: this module only reasons over what it returns).
    ``upstream_total``: a case's
    total under upstream's installed loss (the caller evaluates it; this module only reasons over the results)."""
    for sub, kind in CONTRACT_NOTES:
        hit = [r.note for _, r in failing if sub in r.note]
        if hit:
            part = next(x for x in hit[0].split("; ") if sub in x)
            if part.startswith("swallows an exception ("):
                part = part[len("swallows an exception (") : -1]
            return HINTS[kind].format(part)
    for kind, prefix in (
        ("input written", "writes into its input "),
        ("global state", "changes global torch state: "),
        ("primitive ignored", "ignores the injected "),
        ("num_valid", "num_valid "),
        ("memory", "keeps "),
        ("memory", "RSS grew by "),
    ):
        hit = [r.note for _, r in failing if r.note.startswith(prefix)]
        if hit:
            what = hit[0][len(prefix) :].split(" (the caller")[0] if kind == "input written" else hit[0]
            if kind == "global state":
                what = hit[0][len(prefix) :]
            return HINTS[kind].format(what)
    if run is not None and _grad_mode_shows(run, failing):
        modes = sorted({c.grad_mode for c, _ in failing})
        return HINTS["grad mode"].format(f"only the cases under {' and '.join(modes)} fail; with grad they pass")
    hypotheses = HYPOTHESES + [("student dtype", lambda case: _in_student_dtype(case, upstream_total))]
    for kind, alt in hypotheses:
        if _explains(alt, failing):
            return HINTS[kind]
    if run is not None and _teacher_detached(run, failing):
        return HINTS["detached"]
    if _aligned_late(failing):
        return HINTS["alignment"]
    line = _clamp_line(source)
    if line and _clamp_shows(failing, upstream_total):
        return HINTS["clamp"].format(line)
    return ""


def failure_pattern(families: List[Dict[str, Any]]) -> str:
    """One line when every failure of the (gating) families falls in one mode (full vocabulary or top-k) or one
    dtype pair while the other modes / pairs have cases that pass, else ``""``. ``families``: the certificate's
    family dicts (``modes`` / ``pairs``: key -> [cases, failures])."""
    lines = []
    for field in ("modes", "pairs"):
        table: Dict[str, List[int]] = {}
        for f in families:
            for key, (n, bad) in (f.get(field) or {}).items():
                row = table.setdefault(key, [0, 0])
                row[0] += n
                row[1] += bad
        failing = {k: v for k, v in table.items() if v[1]}
        total = sum(v[1] for v in failing.values())
        passing = {k: v for k, v in table.items() if not v[1] and v[0]}
        if len(failing) == 1 and passing:
            ((key, (n, bad)),) = failing.items()
            if field == "modes":
                other = ", ".join(f"{k} passes ({v[0]} cases)" for k, v in passing.items())
                lines.append(f"all {total} failures in {key} mode; {other}")
            else:
                lines.append(
                    f"all {total} failures on the {key} pair (student/teacher); the other {len(passing)} "
                    f"dtype pairs pass ({sum(v[0] for v in passing.values())} cases)"
                )
    return "; ".join(lines)
