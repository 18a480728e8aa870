"""The seed defect's inputs and the verdicts of the GPU proofs (``launch/gpu_bare.py``, ``launch/gpu_check.py``).

Everything is judged against :mod:`gkd_harness.harness.loss.reference` (FP64, written from the formulas), never against the
harness's own ``fp64`` variant, which shares its formula and gradient code with ``fp32``.

Two kinds of rows, each with stated criteria:

* a **defect** row is a *finding* about upstream's loss, made of two parts (:func:`defect_parts`):
  ``sign`` when upstream's loss is negative or non-finite where the exact loss is not (the seed report's
  negative JSD), ``gradient`` when upstream's gradient is off the reference by more than
  :data:`DEFECT_GRAD_REL_L2` relative L2 (the seed report's ~20% gradient error). The row is ``reproduced`` when
  either part is, ``not reproduced`` otherwise. A GPU on which neither shows is a finding the proof's exit status
  reports (``launch/gpu_bare.py``), never a pass;
* a **fix** row is a *check*: it fails when the loss is negative or non-finite, off the reference beyond
  :func:`gkd_harness.harness.loss.tolerances.loss_tol`, or its gradient beyond :func:`gkd_harness.harness.loss.tolerances.grad_tol`.

Inputs are made on the device they are used on (``torch.Generator(device=...)``), so a CUDA proof spends no host
time on the ~1e9 random samples of the seed shape.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import grad_tol, loss_tol

#: Qwen3.5's vocabulary (the seed report's model) and its top-k.
SEED_VOCAB = 248_320
SEED_TOPK = 64
#: The seed report's synthetic repro: 3 rows of 64, β = 0.5, T = 0.9.
REPORT_ROWS, REPORT_VOCAB, REPORT_BETA, REPORT_TEMPERATURE = 3, 64, 0.5, 0.9

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
#: A defect row's gradient part reproduces above this relative L2 error against the FP64 reference. The seed
#: report measured ~0.2; on the CPU rehearsal upstream is 0.32 (top-k) and 0.61 (full vocabulary) off at the seed
#: shape, while a loss that computes in FP32 after promoting the BF16 side is within 1e-4 (the fix rows' bound,
#: ``tolerances.GRAD_REL_L2_FP32_STUDENT``). 1e-2 sits 100x above the second and 20x below the first.
DEFECT_GRAD_REL_L2 = 1e-2


def seed_draw(
    rows: int, vocab: int, device: Any = "cpu", seed: int = 0, scale: float = 2.0, noise: float = 0.03
) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed report's random draw on ``device``, drawn there: student ``[rows, vocab]`` FP32 holding BF16-rounded
    ``randn·scale`` (a BF16 model's upcast output) and teacher ``[rows, vocab]`` FP32 = student + ``randn·noise``
    (not rounded yet). The one recipe :func:`seed_like_inputs` and ``gkd-replay synthetic`` both build on."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    student = (torch.randn(rows, vocab, generator=g, device=dev) * scale).bfloat16().float()
    return student, student + torch.randn(rows, vocab, generator=g, device=dev) * noise


def seed_like_inputs(
    rows: int,
    vocab: int,
    device,
    mode: str = "full",
    topk: int = SEED_TOPK,
    seed: int = 0,
    scale: float = 2.0,
    noise: float = 0.03,
):
    """The seed report's recipe on ``device``: student ``[1, rows, vocab]`` FP32 holding BF16-rounded
    ``randn·scale`` (a BF16 model's upcast output), teacher = student + ``randn·noise`` in BF16, as full logits
    ``[1, rows, vocab]`` (``mode="full"``) or top-``topk`` BF16 log-probs with ids ``[1, rows, topk]``
    (``mode="topk"``); labels ``[1, rows]`` all active.

    Returns ``(student, TeacherOutput, labels)``, every tensor on ``device``, drawn there.
    """
    dev = torch.device(device)
    student, teacher = seed_draw(rows, vocab, dev, seed, scale, noise)
    teacher = teacher.bfloat16()
    labels = torch.zeros(1, rows, dtype=torch.long, device=dev)
    if mode == "full":
        return student[None], TeacherOutput(full_logits=teacher[None], labels=labels), labels
    vals, ids = torch.topk(torch.log_softmax(teacher.float(), -1), topk, dim=-1)
    del teacher
    return (
        student[None],
        TeacherOutput(topk_logprobs=vals.bfloat16()[None], topk_indices=ids[None], labels=labels),
        labels,
    )


def loss_and_grad(fn: Callable, student, teacher_output, labels, beta: float, temperature: float):
    """A ``gkd_loss``-shaped ``fn`` on a fresh leaf of ``student``: ``(total, num_valid, loss = total / num_valid,
    d loss / d student in the student's dtype)``."""
    s = student.detach().clone().requires_grad_(True)
    total, nv = fn(s, teacher_output, labels, beta, temperature)
    n = int(nv)
    loss = total / max(n, 1)
    (grad,) = torch.autograd.grad(loss, s)
    return float(total.detach().double()), n, float(loss.detach().double()), grad.detach()


def reference(student, teacher_output, labels, beta: float, temperature: float) -> Dict[str, Any]:
    """:func:`gkd_harness.harness.loss.reference.reference_gkd` on the call's inputs: ``{"total", "num_valid", "loss",
    "grad" (d loss / d student, FP64)}``."""
    kw: Dict[str, Any] = {"teacher_labels": teacher_output.labels}
    if teacher_output.is_topk_mode:
        kw["teacher_topk"] = (teacher_output.topk_logprobs, teacher_output.topk_indices)
    else:
        kw["teacher_full"] = teacher_output.full_logits
    total, n, grad = reference_gkd(student, labels, beta, temperature, **kw)
    return {"total": total, "num_valid": n, "loss": total / n if n else 0.0, "grad": grad}


def grad_rel_l2(grad: torch.Tensor, ref_grad: torch.Tensor) -> float:
    """``‖g − g_ref‖ / ‖g_ref‖`` in FP64 (``‖g − g_ref‖`` when the reference is 0)."""
    diff = float(torch.linalg.vector_norm(grad.double() - ref_grad))
    norm = float(torch.linalg.vector_norm(ref_grad))
    return diff / norm if norm > 0 else diff


def fix_verdict(total: float, n: int, grad: torch.Tensor, ref: Dict[str, Any]) -> Dict[str, Any]:
    """A fix row's check of one variant against the reference: ``{"ok", "loss", "loss_abs_err", "loss_tol",
    "grad_rel_l2", "grad_tol", "why"}``; fails on a non-finite or negative loss, a loss off by more than
    :func:`loss_tol` (on the totals) or a gradient off by more than :func:`grad_tol` (student's dtype)."""
    loss = total / n if n else 0.0
    err, tol = abs(total - ref["total"]), loss_tol(ref["total"], n)
    g_err, g_tol = grad_rel_l2(grad, ref["grad"]), grad_tol(ref["grad"], grad.dtype)
    why = []
    if not (math.isfinite(total) and math.isfinite(g_err)):
        why.append("non-finite loss or gradient")
    else:
        if loss < 0:
            why.append(f"negative loss {loss:.3e}")
        if err > tol:
            why.append(f"loss total off the reference by {err:.2e} > {tol:.2e}")
        if g_err > g_tol:
            why.append(f"gradient rel L2 {g_err:.2e} > {g_tol:.2e}")
    return {
        "ok": not why,
        "loss": loss,
        "loss_abs_err": err,
        "loss_tol": tol,
        "grad_rel_l2": g_err,
        "grad_tol": g_tol,
        "why": "; ".join(why),
    }


def defect_parts(upstream_loss: float, ref_loss: float, grad_err: float) -> Dict[str, Any]:
    """A defect row's finding from upstream's loss, the exact loss and upstream's gradient error (relative L2
    against the reference): ``{"finding", "sign", "gradient", "criteria"}``.

    ``sign``: upstream's loss is negative or non-finite while the exact loss is not negative. ``gradient``: the
    error is above :data:`DEFECT_GRAD_REL_L2` (or not finite). ``finding`` is :data:`REPRODUCED` when either holds.
    """
    sign = (not math.isfinite(upstream_loss) or upstream_loss < 0) and ref_loss >= 0
    gradient = not grad_err <= DEFECT_GRAD_REL_L2
    return {
        "finding": REPRODUCED if sign or gradient else NOT_REPRODUCED,
        "sign": sign,
        "gradient": gradient,
        "criteria": f"sign: loss < 0 <= exact; gradient: rel L2 > {DEFECT_GRAD_REL_L2:.0e}",
    }


def defect_finding(upstream_loss: float, ref_loss: float, grad_err: float) -> str:
    """:data:`REPRODUCED` or :data:`NOT_REPRODUCED` (:func:`defect_parts`)."""
    return str(defect_parts(upstream_loss, ref_loss, grad_err)["finding"])


def report_repro(
    device, upstream_gkd: Optional[Callable] = None, fixed: Optional[Callable] = None, seed: int = 0
) -> Dict[str, Any]:
    """The seed report's synthetic repro (3×64, β = 0.5, T = 0.9) on ``device``: FP32 student, BF16 teacher.

    Both ``upstream_gkd`` (default: ms-swift's ``gkd_loss``) and ``fixed`` (a fix under test; default: the harness's
    ``fp32`` variant) get the raw mixed-dtype inputs, as the trainer hands them (no division by T or rounding done
    for them), and both are judged against the FP64 reference on those inputs: a fix made anywhere inside
    ``gkd_loss`` clears the defect row. Returns ``{"upstream": float, "upstream_grad_rel_l2", "reference",
    "finding", "sign", "gradient", "criteria", "fix": verdict, ...}``.
    """
    if upstream_gkd is None:
        from swift.rlhf_trainers import gkd_loss as upstream_module

        upstream_gkd = upstream_module.gkd_loss
    if fixed is None:
        from gkd_harness.harness.loss.variants import make_gkd_loss

        fixed = make_gkd_loss("fp32")
    student, to, labels = seed_like_inputs(REPORT_ROWS, REPORT_VOCAB, device, "full", seed=seed)
    temp, beta = REPORT_TEMPERATURE, REPORT_BETA
    ref = reference(student, to, labels, beta, temp)
    _, _, upstream, up_grad = loss_and_grad(upstream_gkd, student, to, labels, beta, temp)
    up_err = grad_rel_l2(up_grad, ref["grad"])
    total, n, _, grad = loss_and_grad(fixed, student, to, labels, beta, temp)
    return {
        "upstream": upstream,
        "upstream_grad_rel_l2": up_err,
        "reference": ref["loss"],
        **defect_parts(upstream, ref["loss"], up_err),
        "fix": fix_verdict(total, n, grad, ref),
        "device": str(student.device),
        "rows": REPORT_ROWS,
        "vocab": REPORT_VOCAB,
        "beta": beta,
        "temperature": temp,
    }
