"""The GPU proof for a bare, offline CUDA node (``bash launch/gpu_check.sh --bare``, or
``PYTHONPATH=. python -m launch.gpu_bare --out DIR``): loss-level checks only, from a plain checkout.

What the node needs: Python, torch (CUDA), transformers, and ONE carried wheel, ms-swift's (1.36 MiB; fetched
elsewhere with ``pip download ms-swift==4.6.0 --no-deps -d wheels/`` and installed on the node with
``pip install --no-index --no-deps wheels/ms_swift-4.6.0-py3-none-any.whl``). The project itself is not installed:
it runs from the checkout with ``PYTHONPATH=.``. ms-swift's own package ``__init__`` needs trl, peft, modelscope
and more, so only its loss file ``swift/rlhf_trainers/gkd_loss.py`` (which imports torch alone) is loaded, by
path, under its own module name (:func:`load_upstream_loss`): the harness then binds to it as usual.

One JSON row per check (``{"check": ..., "ok": bool, ...}``), written as they finish to ``DIR/rows.jsonl`` and at
the end to ``DIR/bare_checks.json`` and ``DIR/bare_checks.md`` (3 files):

- ``env``: Python, torch, CUDA, GPU, transformers, ms-swift (how it was loaded), the harness checkout;
- ``repro``: the seed report's synthetic repro on the device (``launch.gpu_check.seed_repro``);
- ``native_bitwise/{topk,full}``: the harness's ``native`` variant bit-identical to upstream ``gkd_loss``
  (loss and d loss / d logits, ``torch.equal``) at the seed shape;
- ``seed_shape/{topk,full}/beta{β}``: V = 248,320, FP32 student / BF16 teacher (top-k 64 teacher log-probs, or
  the full vocabulary), β ∈ {0, 0.5, 0.9, 1}, T = 0.9: upstream vs harness fp32 vs harness fp64 (the
  reference): loss, sign, relative L2 error of the gradient vs fp64, time, ``max_memory_allocated``;
- ``spot_check/{topk,full}``: the FP64 spot check's extra time and peak memory over one fp32 loss step
  (``bench.cases``);
- ``bench/...``: gkd-bench's loss rows (``bench.cases``: its ``loss_rows`` function when the checkout has one,
  every group on CUDA, topk and full in a CPU rehearsal; else each loss case of ``bench.cases.LOSS_CASES`` timed
  here); a case whose package is absent (TRL) is a row with ``skipped`` and the reason.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

VOCAB = 248_320  # Qwen3.5's vocabulary (the seed)
TOPK = 64
BETAS = (0.0, 0.5, 0.9, 1.0)
TEMPERATURE = 0.9
UPSTREAM_MODULE = "swift.rlhf_trainers.gkd_loss"
#: tokens per check: (top-k, full vocabulary) on CUDA (the seed's micro batch of one sequence) and on a CPU
TOKENS = {"cuda": (4096, 256), "cpu": (16, 2)}
#: fp32 vs fp64 at the seed shape: the loss within 1e-4 relative (+2e-6), the gradient within 1e-3 relative L2
LOSS_RTOL, LOSS_ATOL, GRAD_REL_L2_MAX = 1e-4, 2e-6, 1e-3


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
        raise SystemExit("gpu_bare: ms-swift is not installed: carry its wheel (pip download ms-swift==4.6.0 "
                         "--no-deps -d wheels/) and pip install --no-index --no-deps wheels/ms_swift-*.whl")
    try:
        return importlib.import_module(UPSTREAM_MODULE), "ms-swift package"
    except Exception as e:  # noqa: BLE001 - a bare image: ms-swift's __init__ needs what is not there
        why = f"{type(e).__name__}: {e}"
    for name in ("swift", "swift.rlhf_trainers"):
        sys.modules.pop(name, None)
    root = Path(list(spec.submodule_search_locations)[0])
    for name, folder in (("swift", root), ("swift.rlhf_trainers", root / "rlhf_trainers")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(folder)]
        sys.modules[name] = mod
    module = importlib.import_module(UPSTREAM_MODULE)
    return module, f"loss file only ({module.__file__}; the package's __init__ did not import: {why[:160]})"


# ------------------------------------------------------------------------------------------------- measuring
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], device: str) -> tuple[Any, float, Optional[int]]:
    """``fn()`` once -> (its result, wall ms, peak bytes allocated on the GPU during it; None on a CPU)."""
    import torch

    cuda = device.startswith("cuda")
    _sync(device)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    ms = (time.perf_counter() - t0) * 1e3
    return out, ms, (torch.cuda.max_memory_allocated() - base) if cuda else None


def seed_inputs(n: int, mode: str, device: str, seed: int = 0):
    """Seed-shape inputs: student ``[1, n, V]`` FP32 (BF16-rounded ``randn*2``, as a BF16 model's upcast output),
    teacher = student + ``randn*0.03`` in BF16, as full logits ``[1, n, V]`` or top-64 log-probs ``[1, n, 64]``
    with ids; labels ``[1, n]`` all valid."""
    import torch
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    g = torch.Generator(device="cpu").manual_seed(seed)
    student = (torch.randn(n, VOCAB, generator=g) * 2).bfloat16().float()
    teacher = (student + torch.randn(n, VOCAB, generator=g) * 0.03).bfloat16()
    labels = torch.zeros(1, n, dtype=torch.long, device=device)
    student = student[None].to(device)
    if mode == "full":
        return student, TeacherOutput(full_logits=teacher[None].to(device), labels=labels), labels
    vals, ids = torch.topk(torch.log_softmax(teacher.float(), -1), TOPK, dim=-1)
    return student, TeacherOutput(topk_logprobs=vals.bfloat16()[None].to(device), topk_indices=ids[None].to(device),
                                  labels=labels), labels


def _loss_and_grad(fn: Callable, student, teacher_output, labels, beta: float):
    """(loss = total / num_valid as a 0-d tensor, d loss / d student logits) of a ``gkd_loss``-shaped ``fn``."""
    import torch

    s = student.detach().clone().requires_grad_(True)
    total, nv = fn(s, teacher_output, labels, beta, TEMPERATURE)
    loss = total / nv
    (grad,) = torch.autograd.grad(loss, s)
    return loss.detach(), grad


def native_bitwise(mode: str, n: int, device: str) -> Dict[str, Any]:
    from harness.losses import make_gkd_loss_terms
    from swift.rlhf_trainers.gkd_loss import gkd_loss as upstream

    student, to, labels = seed_inputs(n, mode, device)
    terms = make_gkd_loss_terms("native")

    def native(s, t, lab, beta, temp):
        out = terms(s, t, lab, beta, temp)
        return out.total, out.num_valid

    ul, ug = _loss_and_grad(upstream, student, to, labels, 0.5)
    nl, ng = _loss_and_grad(native, student, to, labels, 0.5)
    import torch

    same_loss, same_grad = bool(torch.equal(ul, nl)), bool(torch.equal(ug, ng))
    return {"check": f"native_bitwise/{mode}", "ok": same_loss and same_grad, "tokens": n, "vocab": VOCAB,
            "loss_upstream": float(ul), "loss_native": float(nl), "loss_equal": same_loss, "grad_equal": same_grad,
            "grad_max_abs_diff": float((ug - ng).abs().max())}


def seed_shape(mode: str, beta: float, n: int, device: str) -> Dict[str, Any]:
    import torch
    from harness.losses import make_gkd_loss
    from swift.rlhf_trainers.gkd_loss import gkd_loss as upstream

    student, to, labels = seed_inputs(n, mode, device)
    fns = {"upstream": upstream, "fp32": make_gkd_loss("fp32"), "fp64": make_gkd_loss("fp64")}
    got = {}
    for name, fn in fns.items():
        (loss, grad), ms, peak = measure(lambda: _loss_and_grad(fn, student, to, labels, beta), device)
        got[name] = {"loss": float(loss.double()), "ms": round(ms, 3), "max_memory_allocated": peak,
                     "grad": grad.double()}
        del loss
    ref_loss, ref_grad = got["fp64"]["loss"], got["fp64"]["grad"]
    ref_norm = float(ref_grad.norm())
    for name, row in got.items():
        err = float((row.pop("grad") - ref_grad).norm())
        row["grad_rel_l2_vs_fp64"] = err / ref_norm if ref_norm > 0 else err
        row["loss_rel_err_vs_fp64"] = abs(row["loss"] - ref_loss) / abs(ref_loss) if ref_loss else abs(row["loss"])
        row["negative"] = row["loss"] < 0
    fp32 = got["fp32"]
    ok = (abs(fp32["loss"] - ref_loss) <= LOSS_RTOL * abs(ref_loss) + LOSS_ATOL
          and fp32["grad_rel_l2_vs_fp64"] <= GRAD_REL_L2_MAX and not (ref_loss >= 0 and fp32["negative"]))
    del student, to, labels, ref_grad
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"check": f"seed_shape/{mode}/beta{beta:g}", "ok": bool(ok), "tokens": n, "vocab": VOCAB,
            "topk": TOPK if mode == "topk" else None, "beta": beta, "temperature": TEMPERATURE,
            "student_dtype": "float32", "teacher_dtype": "bfloat16", "variants": got,
            "upstream_negative": got["upstream"]["negative"]}


def spot_check(group: str, device: str) -> Dict[str, Any]:
    """The FP64 spot check's cost over one fp32 loss step on gkd-bench's inputs (``bench.cases``)."""
    from bench.cases import Sizes, build_case

    sizes = Sizes() if device.startswith("cuda") else Sizes.quick()
    rows = {}
    for variant in ("loss", "check"):
        case = build_case(f"{group}/{variant}", sizes, device)
        case.step()  # warm-up
        _, ms, peak = measure(case.step, device)
        rows[variant] = {"ms": round(ms, 3), "max_memory_allocated": peak}
        del case
    extra_mem = (None if rows["loss"]["max_memory_allocated"] is None
                 else rows["check"]["max_memory_allocated"] - rows["loss"]["max_memory_allocated"])
    return {"check": f"spot_check/{group.split('_', 1)[1]}", "ok": True, "sizes": sizes.__dict__, "loss_step": rows["loss"],
            "spot_check": rows["check"], "extra_ms": round(rows["check"]["ms"] - rows["loss"]["ms"], 3),
            "extra_memory_bytes": extra_mem, "max_tokens": sizes.spot_max_tokens}


def bench_rows(device: str) -> List[Dict[str, Any]]:
    """gkd-bench's loss rows on ``device``: ``bench.cases.loss_rows(device)`` when present, else each loss case of
    ``bench.cases.LOSS_CASES`` (groups topk and full) timed here, one forward+backward after a warm-up."""
    import bench.cases as cases

    note = "bench.cases has no loss_rows: each case timed by launch.gpu_bare"
    if callable(getattr(cases, "loss_rows", None)):
        try:
            return [{"check": f"bench/{r.get('case', '?')}", "ok": "error" not in r, "source": "bench.cases.loss_rows",
                     **r} for r in cases.loss_rows(device, **({} if device.startswith("cuda") else
                                                                {"groups": ("topk", "full")}))]
        except ImportError as e:  # what loss_rows needs is absent here: time the cases here instead
            note = f"bench.cases.loss_rows unavailable ({type(e).__name__}: {e}); each case timed by launch.gpu_bare"
    sizes = cases.Sizes() if device.startswith("cuda") else cases.Sizes.quick()
    out = []
    for group in ("topk", "full"):
        for variant in cases.LOSS_CASES[group]:
            name = f"{group}/{variant}"
            try:
                case = cases.build_case(name, sizes, device)
                case.step()
                _, ms, peak = measure(case.step, device)
                out.append({"check": f"bench/{name}", "ok": True, "ms": round(ms, 3), "max_memory_allocated": peak,
                            "loss": cases.nan_to_none(case.value()), "source": note})
            except ModuleNotFoundError as e:  # a package absent on a bare image (TRL): skipped, with the reason
                out.append({"check": f"bench/{name}", "ok": True, "skipped": f"{type(e).__name__}: {e}"})
            except Exception as e:  # noqa: BLE001
                out.append({"check": f"bench/{name}", "ok": False, "error": f"{type(e).__name__}: {e}"[:400]})
    return out


def env_row(device: str, how: str) -> Dict[str, Any]:
    import importlib.metadata as md

    import torch

    def version(dist: str) -> Optional[str]:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    import harness

    return {"check": "env", "ok": True, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": device,
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
            "transformers": version("transformers"), "triton": version("triton"), "ms_swift": version("ms-swift"),
            "ms_swift_loaded": how, "harness_from": str(Path(harness.__file__).resolve().parent),
            "gkd_harness_installed": version("gkd-harness") is not None}


# ------------------------------------------------------------------------------------------------- the run
def _markdown(rows: List[Dict[str, Any]], wall_s: float) -> str:
    lines = ["# gkd-harness bare GPU check", "", f"{sum(r['ok'] for r in rows)}/{len(rows)} checks ok, "
             f"wall {wall_s:.1f} s.", "", "| check | ok | detail |", "|---|---|---|"]
    for r in rows:
        if "error" in r:
            detail = f"error: {r['error']}"
        elif r["check"].startswith("seed_shape/"):
            v = r["variants"]
            detail = "; ".join(f"{k} loss {v[k]['loss']:.6g}, grad err {v[k]['grad_rel_l2_vs_fp64']:.2e}, "
                               f"{v[k]['ms']:.1f} ms, peak {v[k]['max_memory_allocated']}" for k in v)
        elif "skipped" in r:
            detail = f"skipped: {r['skipped']}"
        else:
            detail = ", ".join(f"{k}={r[k]}" for k in r if k not in ("check", "ok"))[:300]
        lines.append(f"| {r['check']} | {'yes' if r['ok'] else 'NO'} | {detail.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def run(out: Path, device: str, tokens: Optional[tuple] = None, only: tuple = ()) -> List[Dict[str, Any]]:
    """Every check on ``device`` (those whose name starts with one of ``only``, when given; env always); rows
    written under ``out`` (3 files); returns the rows."""
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    _, how = load_upstream_loss()
    n_topk, n_full = tokens or TOKENS["cuda" if device.startswith("cuda") else "cpu"]
    rows: List[Dict[str, Any]] = []
    stream = open(out / "rows.jsonl", "w")

    def add(make: Callable[[], Any], name: str) -> None:
        if only and name != "env" and not name.startswith(tuple(only)):
            return
        t = time.time()
        try:
            got = make()
        except Exception as e:  # noqa: BLE001 - one check failing never stops the next
            got = {"check": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        for row in got if isinstance(got, list) else [got]:
            row.setdefault("wall_s", round(time.time() - t, 3))
            rows.append(row)
            stream.write(json.dumps(row) + "\n")
            stream.flush()
            print(f"{row['check']:<28} {'ok' if row['ok'] else 'FAIL'} {row['wall_s']:.1f} s", flush=True)

    from launch.gpu_check import judge_repro, seed_repro

    add(lambda: env_row(device, how), "env")

    def repro():
        rec = seed_repro(device)
        verdict, detail = judge_repro(rec)
        return {**rec, "ok": verdict != "FAIL", "verdict": verdict, "detail": detail}

    add(repro, "repro")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        add(lambda: native_bitwise(mode, n, device), f"native_bitwise/{mode}")
    for mode, n in (("topk", n_topk), ("full", n_full)):
        for beta in BETAS:
            add(lambda: seed_shape(mode, beta, n, device), f"seed_shape/{mode}/beta{beta:g}")
    for group in ("spot_topk", "spot_full"):
        add(lambda: spot_check(group, device), f"spot_check/{group.split('_', 1)[1]}")
    add(lambda: bench_rows(device), "bench")
    stream.close()
    wall = time.time() - t0
    (out / "bare_checks.json").write_text(json.dumps({"wall_s": wall, "device": device, "rows": rows}, indent=1))
    (out / "bare_checks.md").write_text(_markdown(rows, wall))
    print(f"bare GPU check: {sum(r['ok'] for r in rows)}/{len(rows)} ok in {wall:.1f} s -> {out}")
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launch.gpu_bare", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the output folder (rows.jsonl, bare_checks.json, bare_checks.md)")
    p.add_argument("--device", default="cuda", help="cuda (the proof) or cpu (a rehearsal)")
    p.add_argument("--tokens", type=int, nargs=2, metavar=("TOPK_N", "FULL_N"), default=None,
                   help="tokens of the seed-shape checks (default: 4096 256 on CUDA, 16 2 on a CPU)")
    p.add_argument("--only", nargs="*", default=(), help="run only the checks whose names start so")
    a = p.parse_args(argv)
    rows = run(Path(a.out), a.device, tuple(a.tokens) if a.tokens else None, tuple(a.only))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
