"""Synthetic sweeps: run folders that follow the run folder contract (docs/architecture.md), without training.

For the report's timing script (200 runs x 2,000 steps) and for loader/report tests that need shapes a tiny
real sweep cannot produce cheaply. The numbers are shaped like real runs, not produced by one:

* loss level per run = FP64 D(β) of the chosen form on the β defect's inputs (:mod:`gkd_harness.analysis.signoff.betacurve`), scaled
  down and decaying with the step, so the β-curve of a synthetic sweep shows the paper form's endpoint jump;
* runs that differ only in the β form at β ∈ {0, 0.5, 1} get identical streams (same random state), as the math
  says they should;
* ``native`` runs with a BF16 teacher carry the precision defect (negative loss calls, ~20% logit-gradient
  error in spot checks, sign mismatches); ``fp32``/``fp64`` runs match FP64 to ~1e-7.

Real sweeps come from ``gkd-train``; nothing here is used by a sign-off of real runs.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from gkd_harness.analysis.signoff.betacurve import beta_defect_inputs, fp64_beta_curve
from gkd_harness.harness.contract import (
    BETA_FORMS,
    FP32,
    FP64,
    JSD_LOSS,
    LOSS_CALLS_TOTAL,
    MIN_TOKEN_JSD,
    NATIVE,
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    NEG_TOKEN_FRAC,
    NONFINITE_CALLS_TOTAL,
    SFT_LOSS,
    SPOT_GRAD_REL_L2,
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    SPOT_PARAM_GRAD_REL_L2,
    SPOT_SIGN_MISMATCH,
    TRAIN_GRAD_NORM,
    TRAIN_LEARNING_RATE,
    TRAIN_LOSS,
)
from gkd_harness.harness.store.records import Manifest, write_config, write_manifest, write_metrics_rows, write_summary

__all__ = ["write_run", "write_sweep", "main"]

_PRECISION_TO_LOSS_CFG = {NATIVE: "original", FP32: "fp32", FP64: "fp64"}  # precision -> configs/loss preset


def _seed_for(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def _d_of_beta(forms=BETA_FORMS, betas: Iterable[float] = ()) -> dict:
    s, t = beta_defect_inputs()
    curve = fp64_beta_curve(s, t, sorted(set(betas) | {0.0, 0.5, 1.0}), forms=forms)
    return {(r.form, r.beta): r.D for r in curve.itertuples()}


def write_run(
    folder: Path,
    *,
    beta: float,
    beta_form: str,
    precision: str,
    seed: int,
    temperature: float = 0.9,
    steps: int = 20,
    spot_every: int = 5,
    teacher_dtype: str = "bfloat16",
    student_dtype: str = "float32",
    level: Optional[float] = None,
    status: str = "completed",
    group: str = "synthetic",
    topk: Optional[int] = 64,
) -> Path:
    """Write one synthetic run folder (``config.yaml``, ``metrics.jsonl``, ``summary.json``).

    Args:
        level: loss level at step 1 (default: FP64 D(β) of the form on the β defect's inputs / 100).
        status: completed | failed | running; failed/running runs stop at ``steps // 2``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if level is None:
        level = _d_of_beta(betas=[beta])[(beta_form, beta)] / 100.0
    # Same stream for both forms where the forms coincide (β ∈ {0, 0.5, 1}).
    form_key = "any" if beta in (0.0, 0.5, 1.0) else beta_form
    rng = np.random.default_rng(_seed_for(beta, form_key, precision, seed, temperature, steps))
    mixed = precision == NATIVE and teacher_dtype in ("bfloat16", "float16") and student_dtype != teacher_dtype
    config = {
        "loss.precision": precision,
        "loss.beta_form": beta_form,
        "gkd.beta": beta,
        "gkd.temperature": temperature,
        "gkd.topk": topk,
        "gkd.sft_alpha": 0.0,
        "gkd.lmbda": 0.0,
        "gkd.seq_kd": False,
        "run.seed": seed,
        "run.max_steps": steps,
        "backend.name": "hf",
        "model.student": "tiny-student",
        "model.teacher": "tiny-teacher",
        "model.student_dtype": student_dtype,
        "model.teacher_dtype": teacher_dtype,
    }
    nested: dict = {}
    for k, v in config.items():
        a, b = k.split(".", 1)
        nested.setdefault(a, {})[b] = v
    import yaml

    write_config(folder, yaml.safe_dump(nested, sort_keys=False))
    last = steps if status == "completed" else max(1, steps // 2)
    neg_total = calls_total = nonfinite = 0
    lines = []
    for step in range(1, last + 1):
        decay = max(0.985**step, 1e-30)  # no underflow to 0 in long runs (10⁶ steps); unchanged up to step 4,500
        jsd = level * decay * (1.0 + 0.02 * rng.standard_normal())
        grad = 2.0 * math.sqrt(max(level, 1e-12)) * decay * (1.0 + 0.05 * rng.standard_normal())
        calls = 4
        neg = int(rng.binomial(calls, 0.3)) if mixed else 0
        neg_total += neg
        calls_total += calls
        row = {
            "step": step,
            TRAIN_LOSS: jsd,
            TRAIN_GRAD_NORM: grad,
            TRAIN_LEARNING_RATE: 1e-5,
            JSD_LOSS: jsd,
            SFT_LOSS: 0.0,
            NEG_LOSS_CALLS: neg,
            NEG_LOSS_CALLS_TOTAL: neg_total,
            LOSS_CALLS_TOTAL: calls_total,
            NEG_TOKEN_FRAC: float(rng.uniform(0.2, 0.5)) if mixed else float(rng.uniform(0.0, 0.01)),
            MIN_TOKEN_JSD: float(-abs(rng.normal(1e-3, 3e-4))) if mixed else float(abs(rng.normal(1e-6, 1e-7))),
            NONFINITE_CALLS_TOTAL: nonfinite,
        }
        if spot_every and step % spot_every == 0:
            fp64 = jsd
            if mixed:
                loss = fp64 - abs(rng.normal(2.0, 0.5)) * fp64
                grad_err = float(rng.uniform(0.15, 0.25))
            else:
                loss = fp64 * (1.0 + rng.normal(0.0, 1e-7))
                grad_err = float(abs(rng.normal(1e-6, 3e-7)))
            row.update(
                {
                    SPOT_LOSS: loss,
                    SPOT_LOSS_FP64: fp64,
                    SPOT_LOSS_ABS_ERR: abs(loss - fp64),
                    SPOT_LOSS_REL_ERR: abs(loss - fp64) / abs(fp64),
                    SPOT_GRAD_REL_L2: grad_err,
                    SPOT_SIGN_MISMATCH: int((loss < 0) != (fp64 < 0)),
                    SPOT_PARAM_GRAD_REL_L2: grad_err * float(rng.uniform(0.5, 1.0)),
                }
            )
        lines.append(row)
    write_metrics_rows(folder, lines)
    summary = {
        "status": status,
        "error": None if status != "failed" else "RuntimeError: synthetic failure",
        "run_name": folder.name,
        "group": group,
        "config": config,
        "dtypes_seen": {"student": student_dtype, "teacher": teacher_dtype},
        "versions": {"ms-swift": "4.6.0", "torch": "2.13.0", "transformers": "5.19"},
        "provenance": {  # as gkd_harness.harness.store.provenance records it (fixed stand-ins for the hashes)
            "harness_commit": "0" * 40,
            "harness_dirty": False,
            "loss_sha256": ("a" if precision == NATIVE else "b") * 64,
            "rank_sha256": "c" * 64,
        },
        "last_step": last,
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": None if status == "running" else "2026-01-01T00:10:00Z",
        "wall_s": 600.0,
    }
    write_summary(folder, summary)
    return folder


def write_sweep(
    root: Path,
    *,
    betas: Sequence[float] = (0.0, 0.5, 0.9, 0.99, 1.0),
    forms: Sequence[str] = BETA_FORMS,
    precisions: Sequence[str] = (NATIVE, FP32),
    temperatures: Sequence[float] = (0.9, 1.0),
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    steps: int = 2000,
    spot_every: int = 50,
    group: str = "synthetic",
    plan: bool = False,
) -> list:
    """Write the cross product of the axes as run folders under ``root``, and (``plan``) the sweep's plan,
    ``sweep_manifest.json``, naming them; returns the folders.

    The default is 5 β x 2 forms x 2 precisions x 2 temperatures x 5 seeds = 200 runs.
    """
    root = Path(root)
    levels = _d_of_beta(forms, betas)
    out = []
    declared: dict = {}
    for beta, form, precision, temp, seed in itertools.product(betas, forms, precisions, temperatures, seeds):
        name = f"b{beta}_{form}_{_PRECISION_TO_LOSS_CFG[precision]}_T{temp}_s{seed}"
        overrides = [f"gkd.beta={beta}", f"loss.beta_form={form}", f"loss={_PRECISION_TO_LOSS_CFG[precision]}"]
        overrides += [f"gkd.temperature={temp}", f"run.seed={seed}"]
        declared[name] = {"run.seed": seed, "run.max_steps": steps, "overrides": overrides}
        out.append(
            write_run(
                root / name,
                beta=beta,
                beta_form=form,
                precision=precision,
                seed=seed,
                temperature=temp,
                steps=steps,
                spot_every=spot_every,
                level=levels[(form, beta)] / 100.0,
                group=group,
            )
        )
    if plan:  # the plan, as gkd_harness.launch.sweep.write_manifest writes it at launch
        write_manifest(root, Manifest(tuple(declared), declared, ({"id": 1, "points": list(declared)},), {}, group))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Write a synthetic sweep of run folders (the run-folder contract of docs/architecture.md)."
    )
    p.add_argument("root")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--spot-every", type=int, default=50)
    p.add_argument("--seeds", type=int, default=5)
    a = p.parse_args(argv)
    runs = write_sweep(Path(a.root), steps=a.steps, spot_every=a.spot_every, seeds=range(a.seeds))
    print(f"wrote {len(runs)} runs under {a.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
