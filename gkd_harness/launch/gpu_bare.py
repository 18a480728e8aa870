"""The GPU proof for a bare, offline CUDA node (``bash launch/gpu_check.sh --bare``, or
``PYTHONPATH=. python -m gkd_harness.launch.gpu_bare --out DIR``): loss-level checks only, from a plain checkout.

What the node needs: Python, torch (CUDA), transformers, and ONE carried wheel, ms-swift's (fetched elsewhere with
``pip download ms-swift==4.6.0 --no-deps -d wheels/``, installed on the node with ``pip install --no-index
--no-deps wheels/ms_swift-*.whl``). The project is not installed: it runs from the checkout with ``PYTHONPATH=.``.
ms-swift's package ``__init__`` needs trl, peft, modelscope and more, so only its loss file
(``swift/rlhf_trainers/gkd_loss.py``: torch only) is loaded, by path, under its own module name
(:func:`load_upstream_loss`); the harness's loss and spot check (``gkd_harness.harness.rank.spot_check``) need nothing else.

Every row is judged against ``harness/loss/reference.py`` (FP64, from the formulas; ``gkd_harness.harness.loss.proof``), never
against the harness's own ``fp64`` variant. Row groups, in order (``--only PREFIX...`` keeps the groups whose
name starts so: ``env``, ``repro``, ``native_bitwise/{topk,full}``, ``seed/{topk,full}/beta{β}``, ``spot/...``,
``perf/...``):

- ``env``: versions, the device, and what the proof carries (the checkout's files; printed);
- ``defect/repro`` and ``fix/repro``: the seed report's synthetic repro (3×64, β 0.5, T 0.9) on the device;
- ``native_bitwise/{topk,full}``: the harness's ``native`` variant bit-identical to upstream ``gkd_loss``;
- ``defect/seed/{topk,full}/beta{β}`` and ``fix/seed/...``: V = 248,320, FP32 student / BF16 teacher (top-k 64
  log-probs or the full vocabulary), β ∈ {0, 0.5, 0.9, 1}, T = 0.9: upstream and fp32 against the reference;
- ``spot/{topk,full}``: the training FP64 spot check (``gkd_harness.harness.rank.spot_check.spot_check``) at the seed shape
  against the reference on the same rows, with its time and peak memory over one fp32 loss call;
- ``perf/{topk,full}``: the loss's time and peak memory, fp32 against upstream (warm, median of 3).

A **defect** row reports a *finding*, ``reproduced`` or ``not reproduced``, never "ok". A **fix** row, and every
other row, is a check that fails on a negative or non-finite loss, a value or gradient beyond the tolerances of
``harness/loss/tolerances.py``, or an error. ``rows.jsonl``, ``bare_checks.json`` and ``bare_checks.md`` are
rewritten after every row, so a run cut short leaves its evidence. Exit status: 0 when every check is ok
(findings do not count), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass
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
#: the spot check's row cap: monitor.spot_check.max_tokens of configs/monitor/default.yaml (read, not copied)
MONITOR_DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "monitor" / "default.yaml"


@dataclass
class Upstream:
    """What the proof calls as ms-swift's loss: ``gkd_loss`` (the trainer's entry) and ``jsd_loss`` (as the seed
    report calls it). Tests swap in a fixed loss to see the defect rows turn to "not reproduced"."""

    gkd_loss: Callable
    jsd_loss: Callable


def load_upstream_loss() -> tuple[types.ModuleType, str]:
    """ms-swift's ``gkd_loss.py`` as ``swift.rlhf_trainers.gkd_loss``; -> (module, how it was loaded).

    The real package when ``import swift.rlhf_trainers.gkd_loss`` works (a full image); otherwise (a bare image:
    ms-swift's wheel without its dependencies) the package folders are registered as empty parents, without
    running ms-swift's ``__init__`` files, and the loss file is imported from the wheel's own folder.
    """
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
    root = Path(list(spec.submodule_search_locations)[0])
    for name in ("swift", "swift.rlhf_trainers"):
        sys.modules.pop(name, None)
    for name, folder in (("swift", root), ("swift.rlhf_trainers", root / "rlhf_trainers")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        sys.modules[name] = mod
    module = importlib.import_module(UPSTREAM_MODULE)
    return module, f"loss file only ({module.__file__}; the package's __init__ did not import: {why[:160]})"


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


def report_rows(device: str, upstream: Upstream, fix: Callable) -> List[Dict[str, Any]]:
    """``defect/repro`` (upstream ``jsd_loss`` as the report calls it) and ``fix/repro`` (the fix's ``gkd_loss``)."""
    from gkd_harness.harness.loss.proof import report_repro

    rec = report_repro(device, upstream.jsd_loss, fix)
    common = {k: rec[k] for k in ("device", "rows", "vocab", "beta", "temperature")}
    return [
        {
            "check": "defect/repro",
            "kind": "defect",
            "finding": rec["finding"],
            "ok": True,
            "upstream_loss": rec["upstream"],
            "reference_loss": rec["reference"],
            **common,
        },
        {"check": "fix/repro", "kind": "fix", **rec["fix"], "reference_loss": rec["reference"], **common},
    ]


def native_bitwise(mode: str, n: int, device: str, upstream: Upstream) -> Dict[str, Any]:
    import torch

    from gkd_harness.harness.loss.proof import SEED_VOCAB, loss_and_grad, seed_like_inputs
    from gkd_harness.harness.losses import make_gkd_loss

    student, to, labels = seed_like_inputs(n, SEED_VOCAB, device, mode)
    _, _, ul, ug = loss_and_grad(upstream.gkd_loss, student, to, labels, 0.5, TEMPERATURE)
    _, _, nl, ng = loss_and_grad(make_gkd_loss("native"), student, to, labels, 0.5, TEMPERATURE)
    same_grad = bool(torch.equal(ug, ng))
    return {
        "check": f"native_bitwise/{mode}",
        "kind": "check",
        "ok": ul == nl and same_grad,
        "tokens": n,
        "vocab": SEED_VOCAB,
        "loss_upstream": ul,
        "loss_native": nl,
        "loss_equal": ul == nl,
        "grad_equal": same_grad,
        "grad_max_abs_diff": float((ug.double() - ng.double()).abs().max()),
    }


def seed_rows(mode: str, beta: float, n: int, device: str, upstream: Upstream, fix: Callable) -> List[Dict[str, Any]]:
    """One ``defect/seed/...`` finding and one ``fix/seed/...`` check at the seed shape."""
    from gkd_harness.harness.loss.proof import (
        SEED_TOPK,
        SEED_VOCAB,
        defect_finding,
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
    for kind, fn in (("defect", upstream.gkd_loss), ("fix", fix)):
        (total, nv, loss, grad), ms, peak = measure(
            partial(loss_and_grad, fn, student, to, labels, beta, TEMPERATURE), device
        )
        timing = {"ms": round(ms, 3), "max_memory_allocated": peak}
        if kind == "defect":
            rows.append(
                {
                    "check": f"defect/seed/{mode}/beta{beta:g}",
                    "kind": "defect",
                    "ok": True,
                    "finding": defect_finding(loss, ref["loss"]),
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


def spot_row(mode: str, n: int, device: str) -> Dict[str, Any]:
    """The training spot check at the seed shape (V = 248,320; top-k 64 or the full vocabulary): its values against
    the reference on the same rows (the first ``max_tokens`` active ones), its time and peak memory over one fp32
    loss call (forward + backward) on the whole call."""
    from gkd_harness.harness.contract import SPOT_GRAD_REL_L2, SPOT_LOSS_FP64
    from gkd_harness.harness.loss.proof import SEED_VOCAB, loss_and_grad, reference, seed_like_inputs
    from gkd_harness.harness.loss.tolerances import FP64_RTOL, GRAD_REL_L2_FP32_STUDENT
    from gkd_harness.harness.losses import make_gkd_loss, make_gkd_loss_terms
    from gkd_harness.harness.rank.spot_check import spot_check

    cap = spot_max_tokens()
    student, to, labels = seed_like_inputs(n, SEED_VOCAB, device, mode)
    fp32 = make_gkd_loss("fp32")
    run_terms, ref_terms = make_gkd_loss_terms("fp32"), make_gkd_loss_terms("fp64")
    loss_and_grad(fp32, student, to, labels, 0.5, TEMPERATURE)  # warm-up
    _, loss_ms, loss_peak = measure(partial(loss_and_grad, fp32, student, to, labels, 0.5, TEMPERATURE), device)
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
    if not vals[SPOT_GRAD_REL_L2] <= GRAD_REL_L2_FP32_STUDENT:
        why.append(f"spot/grad_rel_l2 {vals[SPOT_GRAD_REL_L2]:.2e} > {GRAD_REL_L2_FP32_STUDENT:.0e}")
    if _cuda(device) and spot_peak > loss_peak:
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
        "memory_ratio": (spot_peak / loss_peak) if loss_peak else None,
    }
    del student, to, labels, to_m, ref
    _free(device)
    return row


def perf_row(mode: str, n: int, device: str, upstream: Upstream, fix: Callable, reps: int = 3) -> Dict[str, Any]:
    """The loss's time (median of ``reps`` warm forward + backward calls) and peak memory, fix against upstream."""
    from gkd_harness.harness.loss.proof import SEED_VOCAB, loss_and_grad, seed_like_inputs

    student, to, labels = seed_like_inputs(n, SEED_VOCAB, device, mode)
    got = {}
    for name, fn in (("upstream", upstream.gkd_loss), ("fp32", fix)):
        call = partial(loss_and_grad, fn, student, to, labels, 0.5, TEMPERATURE)  # noqa: E731
        call()  # warm-up
        runs = [measure(call, device) for _ in range(reps)]
        got[name] = {
            "ms": round(statistics.median(r[1] for r in runs), 3),
            "max_memory_allocated": max((r[2] or 0) for r in runs) if _cuda(device) else None,
        }
    up, fx = got["upstream"], got["fp32"]
    del student, to, labels
    _free(device)
    return {
        "check": f"perf/{mode}",
        "kind": "check",
        "ok": True,
        "tokens": n,
        "vocab": SEED_VOCAB,
        **{f"{k}_{f}": v[f] for k, v in got.items() for f in v},
        "time_ratio": fx["ms"] / up["ms"],
        "memory_ratio": (
            fx["max_memory_allocated"] / up["max_memory_allocated"] if up["max_memory_allocated"] else None
        ),
    }


def env_row(device: str, how: str, carried: int) -> Dict[str, Any]:
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
        "harness_from": str(Path(harness.__file__).resolve().parent),
        "carried_mib": round(mib, 2),
        "carry_limit_mib": CARRY_LIMIT_MIB,
    }


# ------------------------------------------------------------------------------------------------- the run
def _verdict(r: Dict[str, Any]) -> str:
    if r.get("kind") == "defect" and "error" not in r:
        return r["finding"]
    return "ok" if r["ok"] else "FAIL"


def _detail(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"error: {r['error']}"
    c = r["check"]
    if c.startswith("defect/"):
        return f"upstream {r['upstream_loss']:+.4e}, reference {r['reference_loss']:+.4e}"
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
        return (
            f"fp32 {r['fp32_ms']:.1f} ms vs upstream {r['upstream_ms']:.1f} ms ({r['time_ratio']:.2f}x), peak "
            f"{r['fp32_max_memory_allocated']} vs {r['upstream_max_memory_allocated']} B"
        )
    return ", ".join(f"{k}={r[k]}" for k in r if k not in ("check", "ok", "kind"))[:300]


def summary_line(rows: List[Dict[str, Any]]) -> str:
    checks = [r for r in rows if _verdict(r) in ("ok", "FAIL")]
    defects = [r for r in rows if r not in checks]
    found = sum(r["finding"] == "reproduced" for r in defects)
    return f"{sum(r['ok'] for r in checks)}/{len(checks)} checks ok; defect reproduced in {found}/{len(defects)} rows"


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
    upstream: Optional[Upstream] = None,
    fix: Optional[Callable] = None,
) -> List[Dict[str, Any]]:
    """Every row on ``device`` (those whose name starts with one of ``only``, when given; env always), written under
    ``out`` after every row (3 files); returns the rows. ``upstream`` / ``fix`` replace ms-swift's loss and the
    harness's fp32 variant (tests)."""
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    module, how = load_upstream_loss()
    if upstream is None:
        upstream = Upstream(module.gkd_loss, module.jsd_loss)
    if fix is None:
        from gkd_harness.harness.losses import make_gkd_loss

        fix = make_gkd_loss("fp32")
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
                {"wall_s": wall, "device": device, "done": done, "summary": summary_line(rows), "rows": rows}, indent=1
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

    add(partial(env_row, device, how, carried), "env")
    add(partial(report_rows, device, upstream, fix), "repro")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        add(partial(native_bitwise, mode, n, device, upstream), f"native_bitwise/{mode}")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        for beta in BETAS:
            add(partial(seed_rows, mode, beta, n, device, upstream, fix), f"seed/{mode}/beta{beta:g}")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        add(partial(spot_row, mode, n, device), f"spot/{mode}")
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
        help="run only the row groups whose names start so (repro, "
        "native_bitwise, seed/topk, seed/full/beta0.5, spot, perf, ...)",
    )
    a = p.parse_args(argv)
    rows = run(Path(a.out), a.device, tuple(a.tokens) if a.tokens else None, tuple(a.only))
    return 0 if all(r["ok"] for r in rows if _verdict(r) in ("ok", "FAIL")) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
