"""The evidence a sign-off judges: each loaded run's identity and completeness, and the variants they form.

One home for what a run *is*. :func:`annotate` adds these columns to ``sweep.runs``:

* identity: ``role`` (:func:`gkd_harness.harness.contract.role_of` of ``loss.precision``, the only definition of
  original / patched / reference), ``loss_sha256`` (the loss code the run used, summary.json provenance),
  ``candidate`` (``loss.name`` of a ``loss=candidate`` run, else None), ``rank_sha256`` (the rank-side code),
  ``ms_swift``, the training keys (data, optimiser, steps: :data:`gkd_harness.analysis.sweep.records.TRAINING_KEYS`)
  and, already in the table, ``loss.precision``, ``loss.beta_form``, ``gkd.*`` and the dtypes at
  the loss boundary (``dtype.student``, ``dtype.teacher``);
* ``variant_key``: the identity without the seed (:data:`VARIANT_KEYS`); runs sharing it are one variant;
* completeness: ``planned_steps`` (``run.max_steps``), ``train_steps`` (steps that logged ``train/loss``) and
  ``eval_records`` (held-out evaluation records, counted apart from the training steps).

:func:`mixed_evidence` says why runs do not belong in one comparison: two ms-swift versions, two rank-side
codes, runs without provenance, or one variant run from two loss sources (two ``loss_sha256``). The harness
commit is shown, not judged: a docs-only commit during a sweep does not split it.
``gkd-analyze`` refuses such a sweep (exit 2) unless ``--allow-mixed``.

:func:`judged_runs` picks the runs a sign-off judges: a sweep holding a candidate fix (``loss=candidate``)
judges the candidate against upstream alone; otherwise every patched and reference run against the originals.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import pandas as pd

from gkd_harness.analysis.sweep.records import TRAINING_KEYS, Sweep
from gkd_harness.harness.contract import (
    CANDIDATE,
    DATA_KEYS,
    EVAL_METRICS,
    ORIGINAL,
    PATCHED,
    REFERENCE,
    ROLE_BY_PRECISION,
    TRAIN_LOSS,
    role_of,
)

#: The identity columns of the data a run read: sha256 of each file of :data:`~gkd_harness.harness.contract.DATA_KEYS`.
DATA_SHA256_COLUMNS = tuple(f"sha256.{k}" for k in DATA_KEYS)

__all__ = [
    "DATA_SHA256_COLUMNS",
    "VARIANT_KEYS",
    "VERSION_KEYS",
    "annotate",
    "mixed_evidence",
    "judged_runs",
    "precisions_of",
    "variant_label",
    "low_precision_fix_claimed",
]

#: The identity of a variant: every key of a run's identity except the seed.
VARIANT_KEYS = tuple(
    dict.fromkeys(
        (
            "role",
            "loss.precision",
            "loss.beta_form",
            "candidate",
            "loss_sha256",
            "gkd.beta",
            "gkd.temperature",
            "gkd.topk",
            "gkd.sft_alpha",
            "gkd.lmbda",
            "gkd.seq_kd",
            "run.max_steps",
            "backend.name",
            "model.student",
            "model.teacher",
            "dtype.student",
            "dtype.teacher",
            "rank_sha256",
            "ms_swift",
            "torch",
            "transformers",
            *TRAINING_KEYS,
            *DATA_SHA256_COLUMNS,
        )
    )
)
#: The identity columns that come from the run's recorded versions (summary.json ``versions``/``provenance``).
VERSION_KEYS = {
    "loss_sha256": "version.loss_sha256",
    "rank_sha256": "version.rank_sha256",
    "harness_commit": "version.harness_commit",
    "harness_dirty": "version.harness_dirty",
    "ms_swift": "version.ms-swift",
    "torch": "version.torch",
    "transformers": "version.transformers",
}
#: The packages whose versions split a comparison (runs of one sweep must agree on each), by identity column.
_PACKAGES = {"ms_swift": "ms-swift", "torch": "torch", "transformers": "transformers"}
#: Keys whose values name the variant in tables and messages (the rest are usually equal across a sweep).
_LABEL_KEYS = (
    "loss.precision",
    "loss.beta_form",
    "candidate",
    "gkd.beta",
    "gkd.temperature",
    "gkd.topk",
    "dtype.student",
    "dtype.teacher",
)


def _text(v) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "null"
    return str(v)


def _column(runs: pd.DataFrame, col: str) -> pd.Series:
    return runs[col] if col in runs.columns else pd.Series([None] * len(runs), index=runs.index, dtype=object)


def _completeness(sweep: Sweep) -> pd.DataFrame:
    """Per run: ``train_steps`` (steps with ``train/loss``) and ``eval_records`` (steps with a held-out metric);
    a loader that keeps evaluation records in a table of their own (``sweep.evals``) is counted from there."""
    h = sweep.history
    train = h.loc[h[TRAIN_LOSS].notna(), "run"].value_counts() if TRAIN_LOSS in h.columns else pd.Series(dtype="int64")
    evals = getattr(sweep, "evals", None)
    if isinstance(evals, pd.DataFrame) and "run" in evals.columns:
        ev = evals["run"].value_counts()
    else:
        cols = [c for c in EVAL_METRICS if c in h.columns]
        ev = h.loc[h[cols].notna().any(axis=1), "run"].value_counts() if cols else pd.Series(dtype="int64")
    return pd.DataFrame({"train_steps": train, "eval_records": ev})


def annotate(sweep: Sweep) -> Sweep:
    """``sweep`` with the identity and completeness columns of the module docstring added to ``runs`` (a new
    :class:`Sweep`; the history tables are shared, not copied). Idempotent."""
    r = sweep.runs.copy()
    r["role"] = [role_of(p if isinstance(p, str) else None) for p in _column(r, "loss.precision")]
    for col, src in VERSION_KEYS.items():
        r[col] = _column(r, src).astype(object).where(_column(r, src).notna(), None)
    prec = _column(r, "loss.precision")
    r["candidate"] = [n if p == CANDIDATE else None for p, n in zip(prec, _column(r, "loss.name"))]
    r["planned_steps"] = pd.to_numeric(_column(r, "run.max_steps"), errors="coerce")
    done = _completeness(sweep)
    r["train_steps"] = r["run"].map(done["train_steps"]).fillna(0).astype("int64")
    r["eval_records"] = r["run"].map(done["eval_records"]).fillna(0).astype("int64")
    r["variant_key"] = [
        "|".join(f"{k}={_text(row[k])}" for k in VARIANT_KEYS)
        for _, row in r.reindex(columns=list(VARIANT_KEYS)).iterrows()
    ]
    r["variant_label"] = [variant_label(row) for _, row in r.iterrows()]
    r["variant"] = r["role"]  # the loaders' role column, from its one definition
    return dataclasses.replace(sweep, runs=r)  # every other table (history, nonfinite, evals) travels along


def variant_label(row) -> str:
    """A short name of a run's variant: ``fp32 paper β=0.5 T=0.9 topk=64 float32/bfloat16`` (a candidate:
    its name and the first 8 hex digits of its sha256)."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    prec = _text(get("loss.precision"))
    if prec == CANDIDATE:
        sha = get("loss_sha256")
        prec = f"candidate {_text(get('candidate'))}" + (f" (sha256 {str(sha)[:8]})" if isinstance(sha, str) else "")
    parts = [prec, _text(get("loss.beta_form"))]
    for key, short in (("gkd.beta", "β"), ("gkd.temperature", "T"), ("gkd.topk", "topk")):
        v = get(key)
        parts.append(f"{short}={_text(v) if not isinstance(v, float) or np.isnan(v) else f'{v:g}'}")
    parts.append(f"{_text(get('dtype.student'))}/{_text(get('dtype.teacher'))}")
    return " ".join(parts)


def _listing(runs: pd.DataFrame, col: str, shown=lambda v: _text(v)) -> str:
    parts = []
    for _value, g in runs.groupby(runs[col].map(_text), sort=True):
        names = list(g["run"].astype(str))
        parts.append(
            f"{shown(g[col].iloc[0])} ({len(names)} runs: {', '.join(names[:3])}"
            + (", ..." if len(names) > 3 else "")
            + ")"
        )
    return "; ".join(parts)


def mixed_evidence(sweep: Sweep) -> list:
    """Why the runs of ``sweep`` (annotated or not) are not one comparison, one line each; empty when they are.

    A run's identity is what decides its result: the loss code (``loss_sha256``), the rank-side code
    (``rank_sha256``), the ms-swift version and the resolved config's training keys (:data:`VARIANT_KEYS`); not
    the harness tree's commit, which a docs-only commit during a sweep changes (shown in the report, not judged).

    * two ms-swift versions, or two rank-side codes;
    * one variant (:data:`VARIANT_KEYS` without ``loss_sha256``) run from two loss sources (two sha256): a
      candidate file edited between seeds, or a harness loss changed between runs;
    * runs that recorded no provenance (no ms-swift version or loss sha256 in summary.json): nothing says they
      ran the same code. A point that failed before it recorded a config, and a missing point, are not counted."""
    r = sweep.runs if "role" in sweep.runs.columns else annotate(sweep).runs
    out = []
    for col, package in _PACKAGES.items():
        known = r[r[col].notna()]
        if known[col].map(_text).nunique() > 1:
            out.append(f"runs of two {package} versions: " + _listing(known, col))
    for key, col in zip(DATA_KEYS, DATA_SHA256_COLUMNS):
        hashed = r[_column(r, col).notna()]
        for path, g in hashed.groupby(_column(hashed, key).map(_text), sort=True):
            if g[col].nunique() > 1:
                out.append(
                    f"{key}={path} has two contents (the file changed between runs): "
                    + _listing(g, col, lambda v: f"sha256 {str(v)[:8]}")
                )
    ranks = r[r["rank_sha256"].notna()]
    if ranks["rank_sha256"].map(_text).nunique() > 1:
        out.append(
            "runs of two rank-side codes (harness/rank): "
            + _listing(ranks, "rank_sha256", lambda v: f"sha256 {str(v)[:8]}")
        )
    ran = r[(r["outcome"] != "missing") & r["loss.precision"].notna()] if "outcome" in r.columns else r
    bare = ran[ran["ms_swift"].isna() | ran["loss_sha256"].isna()]
    if len(bare) and sweep.source.startswith("local:"):  # a run folder records its provenance when it starts
        names = list(bare["run"].astype(str))
        out.append(
            f"{len(names)} run(s) without provenance (no ms-swift version or loss sha256 in summary.json): "
            + ", ".join(names[:3])
            + (", ..." if len(names) > 3 else "")
        )
    keys = [k for k in VARIANT_KEYS if k not in ("loss_sha256",)]
    shas = r[r["loss_sha256"].notna()].copy()
    if len(shas):
        shas["_v"] = ["|".join(_text(row[k]) for k in keys) for _, row in shas.reindex(columns=keys).iterrows()]
        for _, g in shas.groupby("_v", sort=True):
            if g["loss_sha256"].nunique() > 1:
                out.append(
                    f"variant {g['variant_label'].iloc[0] if 'variant_label' in g else ''} has two loss "
                    "sources: " + _listing(g, "loss_sha256", lambda v: f"sha256 {str(v)[:8]}")
                )
    return out


def judged_runs(runs: pd.DataFrame) -> tuple:
    """``(judged, originals, why)``: the runs whose loss the sign-off judges, the original (upstream) runs they
    are judged against, and one sentence saying which.

    A sweep holding a candidate fix judges the candidate alone against upstream: the harness's own patched and
    reference runs in the same folder are listed but never pooled with the candidate's evidence."""
    role = runs["role"] if "role" in runs.columns else runs["loss.precision"].map(role_of)
    originals = runs[role == ORIGINAL]
    cand = runs[runs["loss.precision"] == CANDIDATE]
    if len(cand):
        others = runs[role.isin([PATCHED, REFERENCE]) & (runs["loss.precision"] != CANDIDATE)]
        why = f"a candidate sweep: the {len(cand)} candidate runs are judged against upstream alone" + (
            f"; {len(others)} other patched/reference runs are not judged" if len(others) else ""
        )
        return cand, originals, why
    judged = runs[role.isin([PATCHED, REFERENCE])]
    parts = []
    for r, noun in ((PATCHED, "patched"), (REFERENCE, "reference")):
        sel = judged[role[judged.index] == r]
        if len(sel):
            precs = ", ".join(sorted(set(sel["loss.precision"].dropna().astype(str))))
            parts.append(f"{len(sel)} {noun} run{'s' if len(sel) > 1 else ''} ({precs})")
    return judged, originals, " and ".join(parts) or "no patched or reference run"


def precisions_of(role: str) -> tuple:
    """The ``loss.precision`` values whose role is ``role`` (:data:`gkd_harness.harness.contract.ROLE_BY_PRECISION`)."""
    return tuple(p for p, r in ROLE_BY_PRECISION.items() if r == role)


def low_precision_fix_claimed(runs: pd.DataFrame) -> Optional[pd.DataFrame]:
    """The patched runs with a BF16/FP16 side at the loss: the runs that claim the precision fix (None when
    there are none)."""
    role = runs["role"] if "role" in runs.columns else runs["loss.precision"].map(role_of)
    claim = runs[(role == PATCHED) & runs["low_precision"].fillna(False).astype(bool)]
    return claim if len(claim) else None
