"""The seed report's defect table, for every sign-off report: ``gkd-replay synthetic`` on its fixed input.

The input is the seed report's recipe as :func:`gkd_harness.analysis.replay.variants.synthetic_inputs` builds it (student = BF16-rounded
``randn(3, 64)·2``, teacher = student + ``randn·0.03``) with ``gkd-replay synthetic``'s own defaults for β and the
temperature, so each row equals what that command prints. The seed pair (FP32 student, BF16 teacher) is always
shown; each other (student, teacher) dtype pair that the sweep's runs saw at the loss gets its own rows
(``--student-dtype``/``--teacher-dtype``), so a BF16/BF16 sweep shows its own case too. No capture is needed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, List, Optional, Tuple

import pandas as pd

from gkd_harness.analysis.replay.seed_input import SEED_INPUT, SyntheticInput

__all__ = ["SEED_PAIR", "seed_defect_table", "sweep_dtype_pairs", "seed_input_description"]

#: (student dtype, teacher dtype) of the seed report's input: FP32 student, BF16 teacher.
SEED_PAIR = (SEED_INPUT.student_dtype, SEED_INPUT.teacher_dtype)
_COLUMNS = ["input", "student_dtype", "teacher_dtype", "variant", "loss", "negative", "grad_rel_l2", "command"]


def sweep_dtype_pairs(runs: pd.DataFrame) -> List[Tuple[str, str]]:
    """Distinct known (``dtype.student``, ``dtype.teacher``) pairs of the runs, sorted."""
    if runs is None or runs.empty or "dtype.student" not in runs or "dtype.teacher" not in runs:
        return []
    known = runs[runs["dtype.student"].notna() & runs["dtype.teacher"].notna()]
    return sorted({(str(s), str(t)) for s, t in zip(known["dtype.student"], known["dtype.teacher"])})


def _settings(student_dtype: str, teacher_dtype: str) -> SyntheticInput:
    """The seed's input (``gkd-replay synthetic``'s defaults) with the given dtypes."""
    return replace(SEED_INPUT, student_dtype=student_dtype, teacher_dtype=teacher_dtype)


def seed_input_description() -> str:
    """One line naming the fixed input's settings, read from ``gkd-replay synthetic``'s defaults."""
    a = SEED_INPUT
    return (
        f"seed {a.seed}, {a.rows} positions, vocabulary {a.vocab}, logit scale {a.scale:g}, teacher noise "
        f"{a.noise:g}, β {a.beta:g}, T {a.temperature:g}, {a.beta_form or 'paper'} form, "
        f"{'full vocabulary' if a.topk is None else f'top-{a.topk}'}; student {a.student_dtype}, "
        f"teacher {a.teacher_dtype}"
    )


def seed_defect_table(pairs: Optional[Iterable[Tuple[str, str]]] = None) -> pd.DataFrame:
    """native / fp32 / fp64 loss and gradient error on the seed's synthetic input, per dtype pair.

    Args:
        pairs: extra (student dtype, teacher dtype) pairs (names as in ``gkd_harness.harness.losses.DTYPES_BY_NAME``); the
            seed pair comes first whatever is given; unknown names are skipped.
    Returns:
        one row per (pair, variant): ``loss`` (per position, the variant's own arithmetic on ``[1, 3, 64]``
        logits), ``negative`` (loss < 0), ``grad_rel_l2`` (relative L2 of d loss / d student logits against FP64)
        and the ``gkd-replay`` command printing the same numbers.
    """
    from gkd_harness.analysis.replay.variants import evaluate_variants, synthetic_inputs
    from gkd_harness.harness.losses import DTYPES_BY_NAME

    ordered = [SEED_PAIR] + [
        p for p in dict.fromkeys(pairs or ()) if p != SEED_PAIR and p[0] in DTYPES_BY_NAME and p[1] in DTYPES_BY_NAME
    ]
    rows = []
    for student_dtype, teacher_dtype in ordered:
        argv = ["synthetic"] + (
            []
            if (student_dtype, teacher_dtype) == SEED_PAIR
            else ["--student-dtype", student_dtype, "--teacher-dtype", teacher_dtype]
        )
        a = _settings(student_dtype, teacher_dtype)
        s, t, labels = synthetic_inputs(
            a.seed, a.rows, a.vocab, a.scale, a.noise, a.student_dtype, a.teacher_dtype, a.topk
        )
        res = evaluate_variants(s, t, labels, a.beta, a.temperature, a.beta_form or "paper")
        label = "seed report" if (student_dtype, teacher_dtype) == SEED_PAIR else "this sweep's dtypes"
        for variant, r in res.items():
            rows.append(
                {
                    "input": label,
                    "student_dtype": student_dtype,
                    "teacher_dtype": teacher_dtype,
                    "variant": variant,
                    "loss": r["loss"],
                    "negative": r["loss"] < 0,
                    "grad_rel_l2": r["grad_rel_l2"],
                    "command": "gkd-replay " + " ".join(argv),
                }
            )
    return pd.DataFrame(rows, columns=_COLUMNS)
