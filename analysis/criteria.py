"""Sign-off criteria: load them (file with defaults), evaluate them on a sweep.

Each criterion gives a :class:`Result` with its threshold and its measured value in words, a status
(``pass`` | ``fail`` | ``not_measured`` | ``skipped`` | ``disabled``) and evidence rows. A required criterion
with nothing to measure fails (``not_measured``): a sign-off cannot rest on missing evidence.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd
import yaml

from analysis.compare import negatives_table, spot_table, step_agreement
from analysis.load import Sweep, UnusableInput

__all__ = ["DEFAULT_CRITERIA_FILE", "Result", "load_criteria", "evaluate", "CRITERIA"]

DEFAULT_CRITERIA_FILE = Path(__file__).resolve().parents[1] / "configs" / "signoff" / "default.yaml"
FAILING = ("fail", "not_measured")


@dataclass
class Result:
    name: str
    title: str
    status: str
    threshold: str
    measured: str
    details: list = field(default_factory=list)  # short strings: offending runs, evidence

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------
# criteria file
# ---------------------------------------------------------------------------


def _merge(base: dict, override: dict, path: str, src: str) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        key = f"{path}{k}"
        if k not in base:
            raise UnusableInput(f"{src}: unknown criteria key {key!r} (known: {', '.join(sorted(base))})")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise UnusableInput(f"{src}: criteria key {key!r} must be a mapping")
            out[k] = _merge(base[k], v, key + ".", src)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise UnusableInput(f"criteria file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise UnusableInput(f"criteria file {path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise UnusableInput(f"criteria file {path}: expected a mapping")
    return data


def _check_number(cfg: dict, key: str, src: str, allow_none: bool = False) -> None:
    section, name = key.split(".")
    v = cfg[section][name]
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise UnusableInput(f"{src}: criteria key {key!r} must be a non-negative number, got {v!r}")


def load_criteria(path: Optional[Path] = None) -> dict:
    """The default criteria (``configs/signoff/default.yaml``) with ``path`` merged over them, validated."""
    cfg = _read_yaml(DEFAULT_CRITERIA_FILE)
    src = str(DEFAULT_CRITERIA_FILE)
    if path is not None:
        src = str(path)
        cfg = _merge(cfg, _read_yaml(Path(path)), "", src)
    for key in ("no_negative_patched.max_negative_calls", "spot_tolerance.loss_rtol", "spot_tolerance.loss_atol",
                "spot_tolerance.grad_rel_l2_max", "spot_tolerance.max_sign_mismatches",
                "spot_tolerance.min_checks_per_run", "beta_forms_unchanged.rtol", "beta_forms_unchanged.atol",
                "precisions_unchanged_in_fp32.rtol", "precisions_unchanged_in_fp32.atol"):
        _check_number(cfg, key, src)
    _check_number(cfg, "spot_tolerance.param_grad_rel_l2_max", src, allow_none=True)
    if cfg["original_shows_defect"]["require"] not in ("all", "any"):
        raise UnusableInput(f"{src}: criteria key 'original_shows_defect.require' must be all|any, "
                            f"got {cfg['original_shows_defect']['require']!r}")
    if not isinstance(cfg["patched_precisions"], list) or not cfg["patched_precisions"]:
        raise UnusableInput(f"{src}: criteria key 'patched_precisions' must be a non-empty list")
    for name in CRITERIA:
        for flag in ("enabled", "required"):
            if not isinstance(cfg[name][flag], bool):
                raise UnusableInput(f"{src}: criteria key '{name}.{flag}' must be true or false")
    return cfg


# ---------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------


def _fmt(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.3g}"


def _not_measured(name, title, threshold, why, required) -> Result:
    return Result(name, title, "not_measured" if required else "skipped", threshold, why)


def _patched(sweep: Sweep, cfg: dict) -> pd.DataFrame:
    return sweep.runs[sweep.runs["loss.precision"].isin(cfg["patched_precisions"])]


def no_negative_patched(sweep: Sweep, cfg: dict, c: dict) -> Result:
    title = "Patched loss has no negative loss calls"
    thr = f"negative calls <= {c['max_negative_calls']} (all patched runs, all ranks)"
    runs = _patched(sweep, cfg)
    if runs.empty:
        return _not_measured("no_negative_patched", title, thr, "no patched runs in the sweep", c["required"])
    neg = negatives_table(sweep)
    neg = neg[neg["run"].isin(runs["run"])]
    unknown = neg[neg["neg_loss_calls"].isna()]
    total = int(neg["neg_loss_calls"].fillna(0).sum())
    calls = int(neg["loss_calls"].fillna(0).sum())
    details = [f"{r.run}: {int(r.neg_loss_calls)} negative of {_fmt(r.loss_calls)} calls (min token JSD "
               f"{_fmt(r.min_token_jsd)})" for r in neg.itertuples() if (r.neg_loss_calls or 0) > 0]
    details += [f"{r}: no negative-call counts logged" for r in unknown["run"]]
    ok = total <= c["max_negative_calls"] and unknown.empty
    measured = f"{total} negative of {calls} loss calls in {len(neg)} patched runs"
    if not unknown.empty:
        measured += f"; {len(unknown)} runs without counts"
    return Result("no_negative_patched", title, "pass" if ok else "fail", thr, measured, details)


def spot_tolerance(sweep: Sweep, cfg: dict, c: dict) -> Result:
    title = "Patched loss and gradients match FP64 spot checks"
    pg = c["param_grad_rel_l2_max"]
    thr = (f"|loss - FP64| <= {c['loss_rtol']:g}*|FP64| + {c['loss_atol']:g}; logit-grad rel L2 <= "
           f"{c['grad_rel_l2_max']:g}" + (f"; param-grad rel L2 <= {pg:g}" if pg is not None else "")
           + f"; sign mismatches <= {c['max_sign_mismatches']}; >= {c['min_checks_per_run']} checks per run")
    runs = _patched(sweep, cfg)
    if runs.empty:
        return _not_measured("spot_tolerance", title, thr, "no patched runs in the sweep", c["required"])
    spots = spot_table(sweep, c["loss_rtol"], c["loss_atol"])
    spots = spots[spots["run"].isin(runs["run"])]
    details = []
    counts = spots.groupby("run").size().reindex(runs["run"], fill_value=0)
    few = counts[counts < c["min_checks_per_run"]]
    details += [f"{r}: {n} spot checks (< {c['min_checks_per_run']})" for r, n in few.items()]
    if spots.empty:
        return Result("spot_tolerance", title, "not_measured" if c["required"] else "skipped", thr,
                      "no spot checks logged by patched runs", details)
    bad_loss = spots[~spots["within_tol"]]
    details += [f"{r.run} step {r.step}: |loss-FP64|={r.abs_err:.3g} > tol {r.tol:.3g} (loss {r.loss:.6g}, "
                f"FP64 {r.loss_fp64:.6g})" for r in bad_loss.head(20).itertuples()]
    bad_grad = spots[spots["grad_rel_l2"] > c["grad_rel_l2_max"]]
    details += [f"{r.run} step {r.step}: logit-grad rel L2 {r.grad_rel_l2:.3g}" for r in bad_grad.head(20).itertuples()]
    no_grad = spots["grad_rel_l2"].isna().sum()
    if no_grad:
        details.append(f"{no_grad} spot checks without a logit-gradient error")
    bad_pg = spots[spots["param_grad_rel_l2"] > pg] if pg is not None else spots.iloc[0:0]
    details += [f"{r.run} step {r.step}: param-grad rel L2 {r.param_grad_rel_l2:.3g}"
                for r in bad_pg.head(20).itertuples()]
    signs = int(spots["sign_mismatch"].fillna(0).sum())
    if signs > c["max_sign_mismatches"]:
        details.append(f"{signs} sign mismatches between loss and FP64")
    ok = (bad_loss.empty and bad_grad.empty and bad_pg.empty and few.empty and no_grad == 0
          and signs <= c["max_sign_mismatches"])
    ratio = (spots["abs_err"] / spots["tol"]).max()
    measured = (f"{len(spots)} checks in {spots['run'].nunique()} runs: worst |loss-FP64|/tol {_fmt(ratio)} "
                f"(max rel err {_fmt(spots['rel_err'].max())}), max logit-grad rel L2 "
                f"{_fmt(spots['grad_rel_l2'].max())}, max param-grad rel L2 {_fmt(spots['param_grad_rel_l2'].max())}"
                f", sign mismatches {signs}; {len(bad_loss)} loss and {len(bad_grad) + len(bad_pg)} gradient checks "
                "beyond tolerance")
    return Result("spot_tolerance", title, "pass" if ok else "fail", thr, measured, details)


def original_shows_defect(sweep: Sweep, cfg: dict, c: dict) -> Result:
    title = "Original loss shows the precision defect where expected"
    thr = (f"{c['require']} original ({cfg['original_precision']}) runs with a BF16/FP16 side at the loss boundary "
           "show a negative loss call, a spot sign mismatch, or a spot error beyond the patched tolerance")
    r = sweep.runs
    expected = r[(r["loss.precision"] == cfg["original_precision"]) & r["mixed_dtypes"]]
    if expected.empty:
        return _not_measured("original_shows_defect", title, thr,
                             "no original runs with mixed dtypes at the loss boundary: the sweep cannot show that "
                             "the harness sees the defect", c["required"])
    st = cfg["spot_tolerance"]
    neg = negatives_table(sweep).set_index("run")
    spots = spot_table(sweep, st["loss_rtol"], st["loss_atol"])
    spots = spots[spots["run"].isin(expected["run"])]
    seen, details = [], []
    for run in expected["run"]:
        s = spots[spots["run"] == run]
        n_neg = neg.loc[run, "neg_loss_calls"] if run in neg.index else np.nan
        ev = {
            "negative calls": int(n_neg) if pd.notna(n_neg) else 0,
            "sign mismatches": int(s["sign_mismatch"].fillna(0).sum()),
            "spot loss beyond tol": int((~s["within_tol"]).sum()),
            "logit-grad rel L2 max": s["grad_rel_l2"].max() if len(s) else np.nan,
        }
        hit = (ev["negative calls"] > 0 or ev["sign mismatches"] > 0 or ev["spot loss beyond tol"] > 0
               or (pd.notna(ev["logit-grad rel L2 max"]) and ev["logit-grad rel L2 max"] > st["grad_rel_l2_max"]))
        seen.append(hit)
        details.append(f"{run}: {'defect seen' if hit else 'NOT seen'} (" +
                       ", ".join(f"{k} {_fmt(v)}" for k, v in ev.items()) + ")")
    n_seen = int(sum(seen))
    ok = all(seen) if c["require"] == "all" else any(seen)
    return Result("original_shows_defect", title, "pass" if ok else "fail", thr,
                  f"defect seen in {n_seen} of {len(seen)} expected original runs", details)


def _agreement_result(name, title, agreement: pd.DataFrame, c: dict, no_pairs: str) -> Result:
    thr = (f"|a - b| <= {c['rtol']:g}*max(|a|,|b|) + {c['atol']:g} at every common step of "
           + ", ".join(c["metrics"]))
    if agreement.empty or "max_abs_diff" not in agreement:
        return _not_measured(name, title, thr, no_pairs, c["required"])
    a = agreement[agreement["metric"].isin(c["metrics"])].copy()
    details = []
    no_common = a[a["common_steps"] == 0]
    details += [f"{r.run_a} vs {r.run_b}: no common steps for {r.metric}" for r in no_common.itertuples()]
    a = a[a["common_steps"] > 0]
    if a.empty:
        return _not_measured(name, title, thr, "paired runs share no logged steps", c["required"])
    ok_rows = a["violations"] == 0
    bad = a[~ok_rows]
    details += [f"{r.run_a} vs {r.run_b}: {r.metric} beyond tolerance at {r.violations} of {r.common_steps} steps, "
                f"largest {r.max_abs_diff:.3g} (rel {r.max_rel_diff:.3g}) at step {r.at_step}" for r in bad.itertuples()]
    worst = a.loc[a["max_rel_diff"].idxmax()]
    pairs = a[["run_a", "run_b"]].drop_duplicates()
    measured = (f"{len(pairs)} pairs; largest divergence {worst['max_rel_diff']:.3g} relative "
                f"({worst['max_abs_diff']:.3g} absolute) in {worst['metric']} at step {int(worst['at_step'])} "
                f"({worst['run_a']} vs {worst['run_b']})")
    if "gkd.beta" in a:
        measured += "; β compared: " + ", ".join(f"{b:g}" for b in sorted(a["gkd.beta"].dropna().unique()))
    status = "pass" if bad.empty and no_common.empty else "fail"
    return Result(name, title, status, thr, measured, details)


def beta_forms_unchanged(sweep: Sweep, cfg: dict, c: dict) -> Result:
    from analysis.betacurve import fp64_beta_curve, report001_inputs

    title = "β ∈ {" + ", ".join(f"{b:g}" for b in c["betas"]) + "} unchanged between paper and continuous forms"
    runs = sweep.runs[sweep.runs["gkd.beta"].isin(c["betas"])]
    agreement = step_agreement(sweep, "loss.beta_form", "paper", "continuous", runs=runs, metrics=c["metrics"],
                               rtol=c["rtol"], atol=c["atol"])
    res = _agreement_result("beta_forms_unchanged", title, agreement, c,
                            "no paired paper/continuous runs at these β")
    # The formula itself, in FP64 on report 001's inputs: the forms must coincide exactly at these β.
    s, t = report001_inputs()
    curve = fp64_beta_curve(s, t, c["betas"]).pivot(index="beta", columns="form", values="D")
    diff = float((curve["paper"] - curve["continuous"]).abs().max())
    res.details.append(f"FP64 formula check (report 001 inputs): max |D_paper - D_continuous| over these β = {diff:.3g}")
    if diff > c["atol"]:
        res.status = "fail"
    return res


def precisions_unchanged_in_fp32(sweep: Sweep, cfg: dict, c: dict) -> Result:
    title = "Native and fp32 precision agree where both sides are FP32"
    r = sweep.runs
    both = r[(r["dtype.student"] == "float32") & (r["dtype.teacher"] == "float32")]
    agreement = step_agreement(sweep, "loss.precision", cfg["original_precision"], "fp32", runs=both,
                               metrics=c["metrics"], rtol=c["rtol"], atol=c["atol"])
    return _agreement_result("precisions_unchanged_in_fp32", title, agreement, c,
                             "no paired native/fp32 runs with FP32 on both sides")


def no_failed_runs(sweep: Sweep, cfg: dict, c: dict) -> Result:
    title = "No failed runs"
    allowed = {"completed", "incomplete"} if c["allow_incomplete"] else {"completed"}
    thr = "every run completed" + ("" if c["allow_incomplete"] else " all run.max_steps steps")
    r = sweep.runs
    bad = r[~r["outcome"].isin(allowed)]
    counts = r["outcome"].value_counts().to_dict()
    details = [f"{x.run}: {x.outcome}" + (f" — {x.error}" if x.error else "") + (f" ({x.problems})" if x.problems
                                                                                 else "") for x in bad.itertuples()]
    measured = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f" of {len(r)} runs"
    return Result("no_failed_runs", title, "pass" if bad.empty else "fail", thr, measured, details)


CRITERIA = {
    "no_negative_patched": no_negative_patched,
    "spot_tolerance": spot_tolerance,
    "original_shows_defect": original_shows_defect,
    "beta_forms_unchanged": beta_forms_unchanged,
    "precisions_unchanged_in_fp32": precisions_unchanged_in_fp32,
    "no_failed_runs": no_failed_runs,
}


def evaluate(sweep: Sweep, cfg: dict) -> tuple:
    """Evaluate every criterion -> (verdict "pass"|"fail", [Result])."""
    results = []
    for name, fn in CRITERIA.items():
        c = cfg[name]
        if not c["enabled"]:
            results.append(Result(name, name, "disabled", "", "disabled in the criteria file"))
            continue
        results.append(fn(sweep, cfg, c))
    verdict = "fail" if any(r.status in FAILING for r in results) else "pass"
    return verdict, results
