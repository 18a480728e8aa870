"""The β-curve: how the generalized JSD depends on β in the paper and the endpoint-continuous form.

Two sources:

* :func:`fp64_beta_curve` computes D(β) in FP64 on fixed inputs (synthetic, or the loss inputs of a capture),
  so the curve shows the formula and not training noise. It runs the harness's own fp64 loss
  (``gkd_harness.harness.losses``, the reference variant of the loss under test; the tests check it against an
  independent reference):

  ``M = (1-β)·S + β·T``; paper ``D = β·KL(T‖M) + (1-β)·KL(S‖M)``; continuous ``D = (1-β)·KL(T‖M) + β·KL(S‖M)``;
  both forms: ``D(0) = KL(T‖S)`` (forward KL), ``D(1) = KL(S‖T)`` (reverse KL).

* :func:`training_beta_curve` reads the first logged steps of a sweep's runs (loss and grad_norm against β).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from gkd_harness.harness.contract import BETA_FORMS, JSD_LOSS, PAPER, TRAIN_GRAD_NORM, TRAIN_LOSS

__all__ = [
    "DEFAULT_BETAS",
    "FORMS",
    "generalized_jsd_fp64",
    "fp64_beta_curve",
    "endpoint_jumps",
    "beta_defect_inputs",
    "capture_inputs",
    "training_beta_curve",
]

FORMS = BETA_FORMS
DEFAULT_BETAS = (0.0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)


def _fp64_tensor(x):
    """torch tensor or array-like -> float64 torch tensor (exact upcast, detached, on the CPU)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


def generalized_jsd_fp64(s_logits, t_logits, beta: float, form: str = PAPER, temperature: float = 1.0) -> np.ndarray:
    """Per-position generalized JSD in FP64: the harness's own fp64 loss (``gkd_harness.harness.losses``, precision
    ``fp64``), on the inputs cast to FP64 first.

    Args:
        s_logits: ``[N, V]`` student logits; t_logits: ``[N, V]`` teacher logits (or log-probs); torch tensors
            or arrays of any float dtype (cast exactly to FP64).
        beta: in [0, 1]. form: "paper" | "continuous". temperature: divides both sides (after the FP64 cast).
    Returns:
        ``[N]`` float64 per-position divergence.
    """
    import torch

    from gkd_harness.harness.losses import jsd_per_position

    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    with torch.no_grad():
        per_position, _ = jsd_per_position(
            _fp64_tensor(s_logits),
            _fp64_tensor(t_logits),
            float(beta),
            precision="fp64",
            beta_form=form,
            temperature=float(temperature),
        )
    return per_position.numpy()


def fp64_beta_curve(
    s_logits,
    t_logits,
    betas: Iterable[float] = DEFAULT_BETAS,
    temperature: float = 1.0,
    forms: Sequence[str] = FORMS,
    source: str = "synthetic",
) -> pd.DataFrame:
    """D(β) averaged over positions, in FP64, for each form.

    Args:
        s_logits, t_logits: ``[N, V]`` active-position logits (top-k: the student gathered at the teacher's ids).
    Returns:
        DataFrame with columns ``beta, form, D, kl_forward, kl_reverse, D_over_endpoint, source``, where
        ``D_over_endpoint`` is D(β) divided by the nearer endpoint value (KL(T‖S) for β<0.5, KL(S‖T) for β≥0.5).
    """
    kl_f = float(generalized_jsd_fp64(s_logits, t_logits, 0.0, temperature=temperature).mean())
    kl_r = float(generalized_jsd_fp64(s_logits, t_logits, 1.0, temperature=temperature).mean())
    rows = []
    for form in forms:
        for b in betas:
            d = float(generalized_jsd_fp64(s_logits, t_logits, float(b), form, temperature).mean())
            end = kl_f if b < 0.5 else kl_r
            rows.append(
                {
                    "beta": float(b),
                    "form": form,
                    "D": d,
                    "kl_forward": kl_f,
                    "kl_reverse": kl_r,
                    "D_over_endpoint": d / end if end else float("nan"),
                    "source": source,
                }
            )
    return pd.DataFrame(rows)


def endpoint_jumps(curve: pd.DataFrame) -> pd.DataFrame:
    """Per form: D at the interior β nearest each endpoint, divided by the endpoint value.

    1 means continuous; the paper form gives ≈ min(β, 1-β) (e.g. D(0.999)/D(1) ≈ 0.001).
    """
    rows = []
    for form, g in curve.groupby("form", sort=False):
        g = g.set_index("beta")["D"]
        inner = [b for b in g.index if 0.0 < b < 1.0]
        if not inner or 0.0 not in g.index or 1.0 not in g.index:
            continue
        lo, hi = min(inner), max(inner)
        rows.append(
            {
                "form": form,
                "beta_low": lo,
                "D(low)/D(0)": g[lo] / g[0.0] if g[0.0] else float("nan"),
                "beta_high": hi,
                "D(high)/D(1)": g[hi] / g[1.0] if g[1.0] else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def beta_defect_inputs() -> tuple:
    """The β-curve's fixed synthetic inputs (seed 7, vocabulary 300) as ``[1, 300]`` float64 arrays.

    On these, paper D(0.001)=0.0019, D(0.999)=0.0020; continuous D(0.001)=1.9069, D(0.999)=2.0119;
    KL(T‖S)=1.9262, KL(S‖T)=2.0450 (the table in docs/beta.md; tests/analysis/test_betacurve.py checks it).
    """
    rng = np.random.default_rng(7)
    z = rng.normal(0, 1.5, 300)
    w = rng.normal(0, 1.5, 300) + 0.3
    w[:3] += 2.0
    return z[None], w[None]


def capture_inputs(capture: dict) -> tuple:
    """Active-position loss inputs of a capture (the dict of ``gkd_harness.harness.store.captures.load_capture``).

    Returns ``(s [N, K|V], t [N, K|V], temperature, beta)``: full vocabulary -> the masked logits (vocabularies
    cut to the common size); top-k -> the student gathered at the teacher's ids and the teacher's top-k
    log-probs, rows whose log-probs are all ``-inf`` dropped (upstream's masking). Temperature is not applied.
    """
    teacher = capture["teacher_output"]
    labels = capture["labels"]
    s_mask = labels != -100
    t_mask = (teacher.labels != -100) if teacher.labels is not None else s_mask
    s = capture["student_logits"][s_mask]
    if teacher.topk_logprobs is not None:
        t = teacher.topk_logprobs[t_mask]
        idx = teacher.topk_indices[t_mask]
        import torch

        keep = ~torch.isinf(t).all(dim=-1)
        s = torch.gather(s[keep], -1, idx[keep].long())
        t = t[keep]
    else:
        t = teacher.full_logits[t_mask]
        v = min(t.shape[-1], s.shape[-1])
        s, t = s[..., :v], t[..., :v]
    return s, t, float(capture["temperature"]), float(capture["beta"])


def training_beta_curve(
    sweep, first_steps: int = 3, metrics: Sequence[str] = (TRAIN_LOSS, JSD_LOSS, TRAIN_GRAD_NORM)
) -> pd.DataFrame:
    """Mean of each metric over the first ``first_steps`` logged steps of every run, against β.

    Returns one row per (loss.beta_form, loss.precision, gkd.beta) with the mean over runs (seeds) and the
    number of runs ``n_runs``. Failed runs contribute what they logged.
    """
    h = sweep.history
    if h.empty:
        return pd.DataFrame()
    h = h.sort_values(["run", "step"])
    first = h.groupby("run", sort=False, observed=True).head(first_steps)
    cols = [m for m in metrics if m in first.columns]
    if not cols:
        return pd.DataFrame()
    per_run = first.groupby("run", observed=True)[cols].mean()
    keys = ["loss.beta_form", "loss.precision", "gkd.beta"]
    meta = sweep.runs.set_index("run")[keys]
    per_run = per_run.join(meta, how="inner")
    out = per_run.groupby(keys, dropna=False)[cols].mean()
    out["n_runs"] = per_run.groupby(keys, dropna=False).size()
    return out.reset_index().sort_values(keys).reset_index(drop=True)
