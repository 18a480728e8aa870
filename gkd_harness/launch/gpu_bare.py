"""The GPU proof for a bare, offline CUDA node (``bash launch/gpu_check.sh --bare``, or
``PYTHONPATH=. python -m gkd_harness.launch.gpu_bare --out DIR``): loss-level checks only, from a plain checkout.

What the node needs: Python, torch (CUDA), transformers, and ONE carried wheel, ms-swift's (fetched elsewhere with
``pip download ms-swift==4.6.0 --no-deps -d wheels/``, installed on the node with ``pip install --no-index
--no-deps wheels/ms_swift-*.whl``). The project is not installed: it runs from the checkout with ``PYTHONPATH=.``.
ms-swift's package ``__init__`` needs trl, peft, modelscope and more, so only its loss file
(``swift/rlhf_trainers/gkd_loss.py``: torch only) is loaded, by path, under its own module name
(:func:`load_upstream_loss`); the harness's loss and spot check (``gkd_harness.harness.rank.spot_check``) need nothing else.
``GKD_UPSTREAM_LOSS=PATH/gkd_loss.py`` (or ``--upstream-file``) carries another copy of that file in its place
(an upstream fix to try): the ``env`` row records the file and its sha256. ``GKD_FIX_LOSS=PATH.py`` (or
``--fix-file``) is the fix under test (a candidate with that interface; default: the harness's fp32 variant).

Every row is judged against ``harness/loss/reference.py`` (FP64, from the formulas; ``gkd_harness.harness.loss.proof``), never
against the harness's own ``fp64`` variant. Row groups, in order (``--only PREFIX...`` keeps the groups whose
name starts so: ``env``, ``repro``, ``seed/{topk,full}/beta{β}``, ``spot/...``, ``perf/...``):

- ``env``: versions, the device, the upstream file judged (path, sha256) and what the proof carries (a check:
  it fails at :data:`CARRY_LIMIT_MIB` MiB or more);
- ``defect/repro`` and ``fix/repro``: the seed report's synthetic repro (3×64, β 0.5, T 0.9) on the device, upstream's
  ``gkd_loss`` and the fix's on the raw inputs (FP32 student, BF16 teacher: nothing rounded or divided for them);
- ``defect/seed/{topk,full}/beta{β}`` and ``fix/seed/...``: V = 248,320, FP32 student / BF16 teacher (top-k 64
  log-probs or the full vocabulary), β ∈ {0, 0.5, 0.9, 1}, T = 0.9: upstream and the fix against the reference;
- ``spot/{topk,full}``: the training FP64 spot check (``gkd_harness.harness.rank.spot_check.spot_check``) of the fix
  under test (the terms the instrument records for it) at the seed shape against the reference on the same rows
  (its ``spot/loss``, ``spot/loss_fp64`` and ``spot/grad_rel_l2``), with its time and peak memory over one call;
- ``perf/{topk,full}``: the loss's time and peak memory, fp32 against upstream (warm, median of 3): measurements
  against the goals of :data:`PERF_GOALS`, printed as met or missed, never counted as checks.

A **defect** row is a *finding* on upstream (``gkd_harness.harness.loss.proof.defect_parts``): ``reproduced`` when its
loss is negative where the exact one is not, or its gradient is off by more than 1e-2 relative L2. A **fix** row,
``env`` and ``spot`` are *checks* that fail on a negative or non-finite loss, a value or gradient beyond the
tolerances of ``harness/loss/tolerances.py``, or an error. ``rows.jsonl``, ``bare_checks.json`` and
``bare_checks.md`` are rewritten after every row, so a run cut short leaves its evidence.

Exit status (bits, :func:`outcome`): 0 the defect reproduced in every defect row and every check held; 1 a check
failed (the fix did not hold); 4 the defect was not reproduced in some defect row (``defect not reproduced``:
the proof's first claim failed on this device); 5 both. 2 is a usage error.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

BETAS = (0.0, 0.5, 0.9, 1.0)
TEMPERATURE = 0.9
UPSTREAM_MODULE = "swift.rlhf_trainers.gkd_loss"
#: tokens per seed-shape row (top-k, full vocabulary): on CUDA the seed's micro batch; on a CPU a rehearsal
TOKENS = {"cuda": (4096, 256), "cpu": (8, 2)}
#: the proof's carried files must stay under this (the device machine takes 64 MiB in all)
CARRY_LIMIT_MIB = 60
#: the perf rows' goals (docs/performance.md's goal rows, measured there at other shapes): (ratio, at most).
#: A perf row is a measurement reported as meeting or missing them, never a check (timings on a shared machine
#: and at the rehearsal's sizes are not evidence for or against the fix).
PERF_GOALS = {"topk": (("time_ratio", 0.80),), "full": (("time_ratio", 0.80), ("memory_ratio", 0.50))}
#: exit bits: a check failed / the defect was not reproduced (2 stays argparse's usage error)
EXIT_CHECK_FAILED, EXIT_NOT_REPRODUCED = 1, 4
#: ``GKD_UPSTREAM_LOSS``: a ``gkd_loss.py`` carried in place of the installed one
UPSTREAM_FILE_ENV = "GKD_UPSTREAM_LOSS"
#: ``GKD_FIX_LOSS``: the fix under test, a file with ms-swift's ``gkd_loss.py`` interface (default: harness fp32)
FIX_FILE_ENV = "GKD_FIX_LOSS"
#: the spot check's row cap: monitor.spot_check.max_tokens of configs/monitor/default.yaml (read, not copied)
MONITOR_DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "monitor" / "default.yaml"


def _empty_parents(root: Path) -> None:
    """Register ``swift`` and ``swift.rlhf_trainers`` as empty packages over ``root`` (their ``__init__`` not run)."""
    for name in ("swift", "swift.rlhf_trainers"):
        sys.modules.pop(name, None)
    for name, folder in (("swift", root), ("swift.rlhf_trainers", root / "rlhf_trainers")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        sys.modules[name] = mod


def _load_file(path: Path) -> types.ModuleType:
    """``path`` (a copy of ms-swift's ``gkd_loss.py``) imported as ``swift.rlhf_trainers.gkd_loss``."""
    if not path.is_file():
        raise SystemExit(f"gpu_bare: {UPSTREAM_FILE_ENV}={path}: no such file")
    _empty_parents(path.parent.parent)
    spec = importlib.util.spec_from_file_location(UPSTREAM_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[UPSTREAM_MODULE] = module
    spec.loader.exec_module(module)
    return module


def load_upstream_loss(upstream_file: Optional[str] = None) -> tuple[types.ModuleType, str]:
    """ms-swift's ``gkd_loss.py`` as ``swift.rlhf_trainers.gkd_loss``; -> (module, how it was loaded).

    ``upstream_file`` (default: ``$GKD_UPSTREAM_LOSS``) carries a copy of the file in place of the installed one:
    it is loaded by path, under that name, with empty ``swift`` parents. Otherwise the real package when ``import
    swift.rlhf_trainers.gkd_loss`` works (a full image); else (a bare image: ms-swift's wheel without its
    dependencies) the package folders are registered as empty parents, without running ms-swift's ``__init__``
    files, and the loss file is imported from the wheel's own folder.
    """
    upstream_file = upstream_file or os.environ.get(UPSTREAM_FILE_ENV) or None
    if upstream_file:
        loaded = sys.modules.get(UPSTREAM_MODULE)
        path = Path(upstream_file).resolve()
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded, f"carried file {path} (already imported)"
        if loaded is not None:
            raise SystemExit(f"gpu_bare: {UPSTREAM_MODULE} is already imported from {loaded.__file__}, not {path}")
        return _load_file(path), f"carried file {path}"
    if UPSTREAM_MODULE in sys.modules:
        return sys.modules[UPSTREAM_MODULE], "already imported"
    spec = importlib.util.find_spec("swift")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "gpu_bare: ms-swift is not installed: carry its wheel (pip download ms-swift==4.6.0 "
            "--no-deps -d wheels/) and pip install --no-index --no-deps wheels/ms_swift-*.whl"
        )
    try:
        return importlib.import_module(UPSTREAM_MODULE), "ms-swift package"
    except Exception as e:  # noqa: BLE001 - a bare image: ms-swift's __init__ needs what is not there
        why = f"{type(e).__name__}: {e}"
    _empty_parents(Path(list(spec.submodule_search_locations)[0]))
    module = importlib.import_module(UPSTREAM_MODULE)
    return module, f"loss file only ({module.__file__}; the package's __init__ did not import: {why[:160]})"


def load_fix(fix_file: str) -> Callable:
    """The ``gkd_loss`` of ``fix_file`` (a candidate with ms-swift's ``gkd_loss.py`` interface: torch only), loaded
    by path under a module name of its own."""
    path = Path(fix_file).resolve()
    if not path.is_file():
        raise SystemExit(f"gpu_bare: {FIX_FILE_ENV}={path}: no such file")
    spec = importlib.util.spec_from_file_location("gkd_fix_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "gkd_loss", None)):
        raise SystemExit(f"gpu_bare: {FIX_FILE_ENV}={path}: defines no gkd_loss")
    return module.gkd_loss


def carried_bytes(root: Path) -> int:
    """Bytes of the checkout the proof runs from: git's tracked files when ``root`` is a git work tree, else every
    file under it outside hidden folders and ``outputs/``."""
    try:
        names = (
            subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60)
            .stdout.decode()
            .split("\0")
        )
        return sum((root / n).stat().st_size for n in names if n and (root / n).is_file())
    except (OSError, subprocess.SubprocessError):
        pass
    total = 0
    for p in root.rglob("*"):
        rel = p.relative_to(root).parts
        if p.is_file() and not any(part.startswith(".") for part in rel) and rel[0] != "outputs":
            total += p.stat().st_size
    return total


# ------------------------------------------------------------------------------------------------- measuring
def _cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def measure(fn: Callable[[], Any], device: str) -> tuple[Any, float, Optional[int]]:
    """``fn()`` once -> (its result, wall ms, peak bytes allocated on the GPU above the level before; None on a CPU)."""
    import torch

    cuda = _cuda(device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return out, ms, (torch.cuda.max_memory_allocated() - base) if cuda else None


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if _cuda(device):
        torch.cuda.empty_cache()


def report_rows(device: str, upstream: Callable, fix: Callable) -> List[Dict[str, Any]]:
    """``defect/repro`` (upstream's ``gkd_loss``) and ``fix/repro`` (the fix's), on the report's raw inputs."""
    from gkd_harness.harness.loss.proof import report_repro

    rec = report_repro(device, upstream, fix)
    common = {k: rec[k] for k in ("device", "rows", "vocab", "beta", "temperature")}
    return [
        {
            "check": "defect/repro",
            "kind": "defect",
            **{k: rec[k] for k in ("finding", "sign", "gradient", "criteria")},
            "upstream_loss": rec["upstream"],
            "reference_loss": rec["reference"],
            "grad_rel_l2": rec["upstream_grad_rel_l2"],
            **common,
        },
        {"check": "fix/repro", "kind": "fix", **rec["fix"], "reference_loss": rec["reference"], **common},
    ]


def seed_rows(mode: str, beta: float, n: int, device: str, upstream: Callable, fix: Callable) -> List[Dict[str, Any]]:
    """One ``defect/seed/...`` finding and one ``fix/seed/...`` check at the seed shape."""
    from gkd_harness.harness.loss.proof import (
        SEED_TOPK,
        SEED_VOCAB,
        defect_parts,
        fix_verdict,
        grad_rel_l2,
        loss_and_grad,
        reference,
        seed_like_inputs,
    )

    student, to, labels = seed_like_inputs(n, SEED_VOCAB, device, mode)
    ref = reference(student, to, labels, beta, TEMPERATURE)
    shape = {
        "tokens": n,
        "vocab": SEED_VOCAB,
        "topk": SEED_TOPK if mode == "topk" else None,
        "beta": beta,
        "temperature": TEMPERATURE,
        "student_dtype": "float32",
        "teacher_dtype": "bfloat16",
    }
    rows = []
    for kind, fn in (("defect", upstream), ("fix", fix)):
        (total, nv, loss, grad), ms, peak = measure(
            partial(loss_and_grad, fn, student, to, labels, beta, TEMPERATURE), device
        )
        timing = {"ms": round(ms, 3), "max_memory_allocated": peak}
        if kind == "defect":
            rows.append(
                {
                    "check": f"defect/seed/{mode}/beta{beta:g}",
                    "kind": "defect",
                    **defect_parts(loss, ref["loss"], grad_rel_l2(grad, ref["grad"])),
                    "upstream_loss": loss,
                    "reference_loss": ref["loss"],
                    "grad_rel_l2": grad_rel_l2(grad, ref["grad"]),
                    **timing,
                    **shape,
                }
            )
        else:
            rows.append(
                {
                    "check": f"fix/seed/{mode}/beta{beta:g}",
                    "kind": "fix",
                    **fix_verdict(total, nv, grad, ref),
                    "reference_loss": ref["loss"],
                    **timing,
                    **shape,
                }
            )
        del grad
    del student, to, labels, ref
    _free(device)
    return rows


def spot_max_tokens() -> int:
    """``monitor.spot_check.max_tokens`` of the default monitor config (the training default)."""
    import yaml

    return int(yaml.safe_load(MONITOR_DEFAULTS.read_text())["spot_check"]["max_tokens"])


def spot_row(mode: str, n: int, device: str, fix: Callable, run_terms: Callable) -> Dict[str, Any]:
    """The training spot check of the fix under test at the seed shape (V = 248,320; top-k 64 or the full
    vocabulary): ``run_terms`` is the fix as the instrument records it (the harness's fp32 terms, or a candidate's
    ``candidate_terms``); its values against the reference on the same rows (the first ``max_tokens`` active ones),
    its time and peak memory over one call of the fix (forward + backward) on the whole call."""
    from gkd_harness.harness.contract import SPOT_GRAD_REL_L2, SPOT_LOSS, SPOT_LOSS_FP64
    from gkd_harness.harness.loss.proof import SEED_VOCAB, loss_and_grad, reference, seed_like_inputs
    from gkd_harness.harness.loss.tolerances import FP64_RTOL, GRAD_REL_L2_FP32_STUDENT, loss_tol
    from gkd_harness.harness.losses import make_gkd_loss_terms
    from gkd_harness.harness.rank.spot_check import spot_check

    cap = spot_max_tokens()
    student, to, labels = seed_like_inputs(n, SEED_VOCAB, device, mode)
    ref_terms = make_gkd_loss_terms("fp64")
    loss_and_grad(fix, student, to, labels, 0.5, TEMPERATURE)  # warm-up
    _, loss_ms, loss_peak = measure(partial(loss_and_grad, fix, student, to, labels, 0.5, TEMPERATURE), device)
    spot_check(run_terms, ref_terms, student, to, labels, 0.5, TEMPERATURE, cap)  # warm-up
    vals, spot_ms, spot_peak = measure(
        partial(spot_check, run_terms, ref_terms, student, to, labels, 0.5, TEMPERATURE, cap), device
    )
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    m = min(cap, n)  # every row is active: the spot check's rows are the first m
    cut = lambda x: None if x is None else x[:, :m]  # noqa: E731
    to_m = TeacherOutput(
        full_logits=cut(to.full_logits),
        topk_logprobs=cut(to.topk_logprobs),
        topk_indices=cut(to.topk_indices),
        labels=cut(to.labels),
    )
    ref = reference(student[:, :m], to_m, labels[:, :m], 0.5, TEMPERATURE)
    ref_err = abs(vals[SPOT_LOSS_FP64] - ref["loss"])
    why = []
    if not ref_err <= FP64_RTOL * abs(ref["loss"]):
        why.append(f"spot/loss_fp64 off the reference by {ref_err:.2e}")
    run_err, run_tol = abs(vals[SPOT_LOSS] - ref["loss"]), loss_tol(ref["total"], ref["num_valid"]) / ref["num_valid"]
    if not run_err <= run_tol:
        why.append(
            f"spot/loss {vals[SPOT_LOSS]:.6e} off the reference {ref['loss']:.6e} by {run_err:.2e} > {run_tol:.2e}"
        )
    if not vals[SPOT_GRAD_REL_L2] <= GRAD_REL_L2_FP32_STUDENT:
        why.append(f"spot/grad_rel_l2 {vals[SPOT_GRAD_REL_L2]:.2e} > {GRAD_REL_L2_FP32_STUDENT:.0e}")
    if spot_peak is not None and loss_peak is not None and spot_peak > loss_peak:
        why.append(f"spot peak {spot_peak} B above the loss call's {loss_peak} B")
    row = {
        "check": f"spot/{mode}",
        "kind": "check",
        "ok": not why,
        "why": "; ".join(why),
        "tokens": n,
        "vocab": SEED_VOCAB,
        "max_tokens": cap,
        "spot": vals,
        "reference_loss": ref["loss"],
        "loss_call_ms": round(loss_ms, 3),
        "spot_ms": round(spot_ms, 3),
        "time_ratio": spot_ms / loss_ms,
        "loss_call_max_memory_allocated": loss_peak,
        "spot_max_memory_allocated": spot_peak,
        "memory_ratio": (spot_peak / loss_peak) if spot_peak is not None and loss_peak else None,
    }
    del student, to, labels, to_m, ref
    _free(device)
    return row


def perf_row(mode: str, n: int, device: str, upstream: Callable, fix: Callable, reps: int = 3) -> Dict[str, Any]:
    """The loss's time (median of ``reps`` warm forward + backward calls) and peak memory, fix against upstream."""
    from gkd_harness.harness.loss.proof import SEED_VOCAB, loss_and_grad, seed_like_inputs

    student, to, labels = seed_like_inputs(n, SEED_VOCAB, device, mode)
    ms: Dict[str, float] = {}
    peak: Dict[str, Optional[int]] = {}
    for name, fn in (("upstream", upstream), ("fp32", fix)):
        call = partial(loss_and_grad, fn, student, to, labels, 0.5, TEMPERATURE)  # noqa: E731
        call()  # warm-up
        runs = [measure(call, device) for _ in range(reps)]
        ms[name] = round(statistics.median(r[1] for r in runs), 3)
        peak[name] = max((r[2] or 0) for r in runs) if _cuda(device) else None
    got = {name: {"ms": ms[name], "max_memory_allocated": peak[name]} for name in ms}
    del student, to, labels
    _free(device)
    up_peak, fx_peak = peak["upstream"], peak["fp32"]
    ratios: Dict[str, Optional[float]] = {
        "time_ratio": ms["fp32"] / ms["upstream"],
        "memory_ratio": fx_peak / up_peak if fx_peak is not None and up_peak else None,
    }
    goals = {
        key: {"at_most": bound, "met": None if (r := ratios[key]) is None else r <= bound}
        for key, bound in PERF_GOALS[mode]
    }
    return {
        "check": f"perf/{mode}",
        "kind": "measure",
        "tokens": n,
        "vocab": SEED_VOCAB,
        **{f"{k}_{f}": v[f] for k, v in got.items() for f in v},
        **ratios,
        "goals": goals,
    }


def env_row(
    device: str, how: str, carried: int, upstream_path: Optional[str], fix_path: Optional[str] = None
) -> Dict[str, Any]:
    import importlib.metadata as md

    import torch

    def version(dist: str) -> Optional[str]:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    from gkd_harness import harness

    mib = carried / 2**20
    return {
        "check": "env",
        "kind": "check",
        "ok": mib < CARRY_LIMIT_MIB,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if _cuda(device) else None,
        "transformers": version("transformers"),
        "ms_swift": version("ms-swift"),
        "ms_swift_loaded": how,
        "upstream_file": upstream_path,
        "upstream_sha256": hashlib.sha256(Path(upstream_path).read_bytes()).hexdigest() if upstream_path else None,
        "fix_file": fix_path or "harness fp32",
        "fix_sha256": hashlib.sha256(Path(fix_path).read_bytes()).hexdigest() if fix_path else None,
        "harness_from": str(Path(harness.__file__).resolve().parent),
        "carried_mib": round(mib, 2),
        "carry_limit_mib": CARRY_LIMIT_MIB,
    }


# ------------------------------------------------------------------------------------------------- the run
def _verdict(r: Dict[str, Any]) -> str:
    """A row's verdict: a defect row's finding, ``measured`` for a perf row, ``ok`` / ``FAIL`` for a check (a row
    that raised is a FAIL whatever its kind)."""
    if "error" in r:
        return "FAIL"
    if r.get("kind") == "defect":
        return str(r["finding"])
    if r.get("kind") == "measure":
        return "measured"
    return "ok" if r["ok"] else "FAIL"


def _detail(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    c = r["check"]
    if c.startswith("defect/"):
        parts = [p for p in ("sign", "gradient") if r[p]]
        return (
            f"upstream {r['upstream_loss']:+.4e}, reference {r['reference_loss']:+.4e}, grad rel L2 "
            f"{r['grad_rel_l2']:.2e}: {' and '.join(parts) or 'neither sign nor gradient'} ({r['criteria']})"
        )
    if c.startswith("fix/"):
        out = (
            f"loss {r['loss']:+.4e} (reference {r['reference_loss']:+.4e}, |Δtotal| {r['loss_abs_err']:.1e} "
            f"≤ {r['loss_tol']:.1e}), grad {r['grad_rel_l2']:.1e} ≤ {r['grad_tol']:.1e}"
        )
        return out + (f"; {r['why']}" if r["why"] else "")
    if c.startswith("spot/"):
        return (
            f"{r['spot_ms']:.1f} ms = {r['time_ratio']:.2f}x a loss call, peak {r['spot_max_memory_allocated']} "
            f"B (loss call {r['loss_call_max_memory_allocated']} B)" + (f"; {r['why']}" if r["why"] else "")
        )
    if c.startswith("perf/"):
        goals = "; ".join(
            f"{k} goal ≤ {g['at_most']:.2f}: {'n/a' if g['met'] is None else 'met' if g['met'] else 'missed'}"
            for k, g in r["goals"].items()
        )
        return (
            f"fp32 {r['fp32_ms']:.1f} ms vs upstream {r['upstream_ms']:.1f} ms ({r['time_ratio']:.2f}x), peak "
            f"{r['fp32_max_memory_allocated']} vs {r['upstream_max_memory_allocated']} B; {goals} "
            "(a measurement, not a check)"
        )
    return ", ".join(f"{k}={r[k]}" for k in r if k not in ("check", "ok", "kind"))[:300]


def outcome(rows: List[Dict[str, Any]]) -> tuple[int, str]:
    """The proof's exit status and its one-line verdict.

    Two claims: the seed's defect exists on this device (every defect row ``reproduced``) and the fix holds
    (every check ``ok``; a row that raised counts as a failed check). Exit bits: :data:`EXIT_CHECK_FAILED` when a
    check failed, :data:`EXIT_NOT_REPRODUCED` when a defect row is ``not reproduced`` or none ran (a run whose
    ``--only`` kept no defect row proves no defect). Measurements count for neither.
    """
    checks = [r for r in rows if _verdict(r) in ("ok", "FAIL")]
    defects = [r for r in rows if r.get("kind") == "defect" and "error" not in r]
    failed = [r["check"] for r in checks if _verdict(r) == "FAIL"]
    missed = [r["check"] for r in defects if r["finding"] != "reproduced"]
    measures = sum(r.get("kind") == "measure" and "error" not in r for r in rows)
    code = (EXIT_CHECK_FAILED if failed else 0) | (EXIT_NOT_REPRODUCED if missed or not defects else 0)
    if not defects:
        defect = "defect not reproduced: no defect row ran"
    elif missed:
        defect = f"defect not reproduced in {len(missed)}/{len(defects)} rows ({', '.join(missed)})"
    else:
        defect = f"defect reproduced in {len(defects)}/{len(defects)} rows"
    fix = (
        f"fix held: {len(checks)}/{len(checks)} checks ok"
        if not failed
        else f"fix did NOT hold: {len(checks) - len(failed)}/{len(checks)} checks ok (FAIL: {', '.join(failed)})"
    )
    return code, f"{defect}; {fix}; {measures} measurements (not checks); exit {code}"


def summary_line(rows: List[Dict[str, Any]]) -> str:
    return outcome(rows)[1]


def _markdown(rows: List[Dict[str, Any]], wall_s: float, done: bool) -> str:
    lines = [
        "# gkd-harness bare GPU check",
        "",
        f"{summary_line(rows)}; wall {wall_s:.1f} s" + ("." if done else " (still running, or cut short)."),
        "",
        "| row | verdict | s | detail |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['check']} | {_verdict(r)} | {r.get('wall_s', 0):.1f} | {_detail(r).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def run(
    out: Path,
    device: str,
    tokens: Optional[tuple] = None,
    only: tuple = (),
    upstream: Optional[Callable] = None,
    fix: Optional[Callable] = None,
    upstream_file: Optional[str] = None,
    fix_file: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Every row on ``device`` (those whose name starts with one of ``only``, when given; env always), written under
    ``out`` after every row (3 files); returns the rows. ``upstream`` / ``fix`` replace ms-swift's ``gkd_loss`` and
    the harness's fp32 variant (tests); ``upstream_file`` carries a copy of ms-swift's ``gkd_loss.py``
    (:func:`load_upstream_loss`), ``fix_file`` (default ``$GKD_FIX_LOSS``) the fix under test (:func:`load_fix`):
    the fix and spot rows judge it."""
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    module, how = load_upstream_loss(upstream_file)
    from gkd_harness.harness.loss.candidate import candidate_terms  # after ms-swift's loss file: they import it
    from gkd_harness.harness.losses import make_gkd_loss, make_gkd_loss_terms

    upstream = upstream or module.gkd_loss
    fix_file = fix_file or os.environ.get(FIX_FILE_ENV) or None
    if fix is None and fix_file:
        fix = load_fix(fix_file)
    run_terms = make_gkd_loss_terms("fp32") if fix is None else candidate_terms(fix)
    fix = fix or make_gkd_loss("fp32")
    n_topk, n_full = tokens or TOKENS["cuda" if _cuda(device) else "cpu"]
    carried = carried_bytes(Path(__file__).resolve().parents[2])
    print(
        f"bare GPU check on {device}: carries {carried / 2**20:.2f} MiB (limit {CARRY_LIMIT_MIB} MiB) -> {out}",
        flush=True,
    )
    rows: List[Dict[str, Any]] = []
    (out / "rows.jsonl").write_text("")

    def write(done: bool) -> None:
        wall = time.time() - t0
        with open(out / "rows.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
        (out / "bare_checks.json").write_text(
            json.dumps(
                {
                    "wall_s": wall,
                    "device": device,
                    "done": done,
                    "exit": outcome(rows)[0],
                    "summary": summary_line(rows),
                    "rows": rows,
                },
                indent=1,
            )
        )
        (out / "bare_checks.md").write_text(_markdown(rows, wall, done))

    def add(make: Callable[[], Any], name: str, kind: str = "check") -> None:
        if only and name != "env" and not name.startswith(tuple(only)):
            return
        t = time.time()
        try:
            got = make()
        except Exception as e:  # noqa: BLE001 - one row failing never stops the next
            got = {"check": name, "kind": kind, "ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
            _free(device)
        for row in got if isinstance(got, list) else [got]:
            row["wall_s"] = round(time.time() - t, 3)
            rows.append(row)
            print(f"{row['check']:<28} {_verdict(row):<15} {row['wall_s']:7.1f} s", flush=True)
        write(False)

    add(partial(env_row, device, how, carried, getattr(module, "__file__", None), fix_file), "env")
    add(partial(report_rows, device, upstream, fix), "repro")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        for beta in BETAS:
            add(partial(seed_rows, mode, beta, n, device, upstream, fix), f"seed/{mode}/beta{beta:g}")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        add(partial(spot_row, mode, n, device, fix, run_terms), f"spot/{mode}")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        add(partial(perf_row, mode, n, device, upstream, fix), f"perf/{mode}")
    write(True)
    print(f"bare GPU check: {summary_line(rows)} in {time.time() - t0:.1f} s -> {out}")
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gkd_harness.launch.gpu_bare", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the output folder (rows.jsonl, bare_checks.json, bare_checks.md)")
    p.add_argument("--device", default="cuda", help="cuda (the proof) or cpu (a rehearsal)")
    p.add_argument(
        "--tokens",
        type=int,
        nargs=2,
        metavar=("TOPK_N", "FULL_N"),
        default=None,
        help="tokens of the seed-shape rows (default: 4096 256 on CUDA, 8 2 on a CPU)",
    )
    p.add_argument(
        "--only",
        nargs="*",
        default=(),
        help="run only the row groups whose names start so (repro, seed/topk, seed/full/beta0.5, spot, perf, ...)",
    )
    p.add_argument(
        "--upstream-file",
        default=None,
        help=f"a copy of ms-swift's gkd_loss.py to judge in place of the installed one (default: ${UPSTREAM_FILE_ENV})",
    )
    p.add_argument(
        "--fix-file",
        default=None,
        help=f"the fix under test, a file with ms-swift's gkd_loss.py interface (default: ${FIX_FILE_ENV}, else the "
        "harness's fp32 variant): the fix and spot rows judge it",
    )
    a = p.parse_args(argv)
    rows = run(
        Path(a.out),
        a.device,
        tuple(a.tokens) if a.tokens else None,
        tuple(a.only),
        upstream_file=a.upstream_file,
        fix_file=a.fix_file,
    )
    return outcome(rows)[0]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
