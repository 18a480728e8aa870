"""The native (upstream), fp32 and fp64 loss variants on one set of inputs, for ``gkd-replay`` and the sign-off.

Inputs come from the seed report's recipe (:func:`synthetic_inputs`, its settings in :data:`SEED_INPUT`) or from
captures (:func:`replay_table`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Union

import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.analysis.replay.seed_input import SEED_INPUT
from gkd_harness.harness.contract import BUILTIN_PRECISIONS, CAPTURES_DIR, FP64, PAPER
from gkd_harness.harness.loss.proof import seed_draw
from gkd_harness.harness.losses import BETA_FORMS, make_gkd_loss_terms
from gkd_harness.harness.losses import DTYPES_BY_NAME as DTYPES
from gkd_harness.harness.store.captures import CaptureError, load_capture

VARIANTS = BUILTIN_PRECISIONS


def evaluate_variants(
    student_logits: torch.Tensor,
    teacher_output: TeacherOutput,
    labels: torch.Tensor,
    beta: float,
    temperature: float,
    beta_form: str = PAPER,
) -> Dict[str, dict]:
    """Loss and student-logit gradient of each precision variant on the same inputs.

    Args:
        student_logits: ``[B, S, V]``; teacher_output: full or top-k ``TeacherOutput``; labels: ``[B, S]``.
    Returns:
        ``{variant: {"loss": float (total / num_valid), "grad_rel_l2": float vs fp64, "num_valid": int}}``.

    Computed as the FP64 spot check computes them (``gkd_harness.harness.rank.instrument.spot_check``): the gradient of the
    variant's total on a leaf in the student's dtype (the relative error does not depend on the 1 / num_valid
    scale), the total divided by num_valid in FP64; so a capture replays to its spot check's values.
    """
    grads: Dict[str, torch.Tensor] = {}
    out: Dict[str, dict] = {}
    for precision in VARIANTS:
        # the FP64 variant on an FP64 leaf: its exact gradient, rounded once to the student's dtype below (the
        # spot check's g64); every other variant on a leaf in the student's dtype
        s = (
            student_logits.detach().to(torch.float64) if precision == FP64 else student_logits.detach().clone()
        ).requires_grad_(True)
        terms = make_gkd_loss_terms(precision, beta_form)(s, teacher_output, labels, beta, temperature)
        n = int(terms.num_valid)
        (grad,) = torch.autograd.grad(terms.total, s, allow_unused=True)
        grads[precision] = (
            torch.zeros_like(s, dtype=torch.float64) if grad is None else grad.to(student_logits.dtype).double()
        )
        total = float(terms.total.detach().double())
        out[precision] = {"loss": total / n if n else 0.0 * total, "num_valid": n}
    ref = grads[FP64]
    ref_norm = float(ref.norm())
    for precision in VARIANTS:
        err = float((grads[precision] - ref).norm())
        out[precision]["grad_rel_l2"] = err / ref_norm if ref_norm > 0 else err
    return out


def synthetic_inputs(
    seed: int = SEED_INPUT.seed,
    rows: int = SEED_INPUT.rows,
    vocab: int = SEED_INPUT.vocab,
    scale: float = SEED_INPUT.scale,
    noise: float = SEED_INPUT.noise,
    student_dtype: str = SEED_INPUT.student_dtype,
    teacher_dtype: str = SEED_INPUT.teacher_dtype,
    topk: Optional[int] = SEED_INPUT.topk,
):
    """The seed report's synthetic tensors, as ``(student_logits [1, rows, vocab], TeacherOutput, labels [1, rows])``."""
    student, teacher = seed_draw(rows, vocab, "cpu", seed, scale, noise)
    student = student.to(DTYPES[student_dtype])[None]
    teacher = teacher.to(DTYPES[teacher_dtype])[None]
    labels = torch.zeros(1, rows, dtype=torch.long)
    if topk is None:
        return student, TeacherOutput(full_logits=teacher, labels=labels), labels
    vals, ids = torch.topk(torch.log_softmax(teacher.float(), -1).to(teacher.dtype), topk, dim=-1)
    return student, TeacherOutput(topk_logprobs=vals, topk_indices=ids, labels=labels), labels


def find_captures(paths: Iterable[Union[str, os.PathLike]]) -> List[Path]:
    """Capture files named directly, or found under folders (``**/captures/*.safetensors``, or the files of a
    ``captures/`` folder named directly), sorted; other safetensors files (model checkpoints) are not captures."""
    found: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            hits = sorted(
                p.glob("*.safetensors") if p.name == CAPTURES_DIR else p.rglob(f"{CAPTURES_DIR}/*.safetensors")
            )
            if not hits:
                raise CaptureError(
                    f"{p}: no *.safetensors capture under this folder (runs write captures "
                    "only when trained with monitor.capture=true)"
                )
            found.extend(hits)
        elif p.exists():
            found.append(p)
        else:
            raise CaptureError(f"{p}: no such file or folder")
    return found


def replay_rows(captures: List[Path], beta_form: Optional[str] = None) -> List[dict]:
    """One row per (capture, variant) with run, step, rank, dtypes, loss and gradient error."""
    rows = []
    for path in captures:
        cap = load_capture(path)
        meta = cap["meta"]
        form = beta_form or meta.get("beta_form", PAPER)
        if form not in BETA_FORMS:
            raise CaptureError(f"{path}: metadata beta_form={form!r} not one of {BETA_FORMS}")
        teacher = cap["teacher_output"]
        t_dtype = (teacher.full_logits if teacher.full_logits is not None else teacher.topk_logprobs).dtype
        res = evaluate_variants(cap["student_logits"], teacher, cap["labels"], cap["beta"], cap["temperature"], form)
        run = path.parent.parent.name if path.parent.name == "captures" else path.parent.name
        for variant, r in res.items():
            rows.append(
                dict(
                    run=run,
                    step=meta.get("step", ""),
                    rank=meta.get("rank", ""),
                    capture=path.name,
                    beta=cap["beta"],
                    temperature=cap["temperature"],
                    beta_form=form,
                    student_dtype=str(cap["student_logits"].dtype).replace("torch.", ""),
                    teacher_dtype=str(t_dtype).replace("torch.", ""),
                    variant=variant,
                    **r,
                )
            )
    return rows


def replay_table(paths: Iterable[str], beta_form: Optional[str] = None):
    """(per-capture DataFrame, rank-averaged DataFrame) for captures under ``paths``; pandas is imported lazily."""
    import pandas as pd

    per_capture = pd.DataFrame(replay_rows(find_captures(paths), beta_form))
    averaged = (
        per_capture.groupby(["run", "step", "variant"], sort=False)
        .agg(loss=("loss", "mean"), grad_rel_l2=("grad_rel_l2", "mean"), ranks=("rank", "nunique"))
        .reset_index()
    )
    return per_capture, averaged


def format_variant_table(results: Dict[str, dict]) -> str:
    lines = [f"{'variant':<8} {'loss (per position)':>22} {'grad rel L2 vs fp64':>20}"]
    for variant in VARIANTS:
        r = results[variant]
        lines.append(f"{variant:<8} {r['loss']:>22.14e} {r['grad_rel_l2']:>20.3e}")
    return "\n".join(lines)
