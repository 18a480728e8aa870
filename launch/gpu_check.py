"""Helpers of ``launch/gpu_check.sh``: the import preflight, the seed repro on CUDA and the final table.

``python -m launch.gpu_check preflight --out CHECKS.jsonl``
    One row per prerequisite of the GPU path (:data:`PREFLIGHT`): torch with CUDA, Transformer Engine,
    megatron.core, mcore_bridge, vLLM. Each import runs in a fresh interpreter (a broken install cannot take the
    preflight down); a row says exactly what is missing: not installed (and how to get it), installed but the
    import fails (the error's last line), or, for torch, a CPU build / no visible GPU. Prints
    ``PREFLIGHT_FAILED=name,...`` last, which the script reads to skip the checks that cannot run.

``python -m launch.gpu_check repro [--device cuda]``
    The seed report's synthetic reproduction (student FP32 from BF16-rounded ``randn*2``, teacher = student +
    ``randn*0.03`` in BF16, β=0.5, T=0.9, 3×64) on the device: upstream ``jsd_loss`` exactly as the report calls
    it, and the harness variants (native / fp32 / fp64) with the relative L2 error of d loss / d logits against
    FP64. Writes one JSON object per line to ``--out``.

``python -m launch.gpu_check table CHECKS.jsonl``
    Prints the short table: one row per check (repro, each run folder), with PASS / WARN / FAIL, and exits 1
    when any row FAILs.

Each line of CHECKS.jsonl is a repro record (``{"check": "repro", ...}``), a plain command record
(``{"check", "rc", "wall_s", "detail"}``), or ``{"check": NAME, "group_dir": PATH, "expect": {...}, "rc": int,
"wall_s": float}`` for a gkd-train command: every run folder under ``group_dir`` (a folder with
``summary.json``) becomes a row. ``expect`` may hold ``student_dtype``, ``teacher_dtype`` and ``neg_calls``
("zero" | "positive" | "by_precision": positive for ``loss.precision`` native, zero otherwise).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterable
from harness.contract import LOSS_CALLS_TOTAL, METRICS_FILE, NEG_LOSS_CALLS_TOTAL, SPOT_LOSS_REL_ERR, SUMMARY_FILE

#: (row name, module to import, distribution name, what to do when it is missing), in the order they are needed.
PREFLIGHT = (
    ("torch_cuda", "torch", "torch", "the CUDA build of torch the cluster image provides (never a CPU wheel)"),
    ("transformer_engine", "transformer_engine", "transformer-engine",
     "Transformer Engine is an image prerequisite (NGC PyTorch images ship it; building it needs the CUDA toolkit "
     "and cuDNN headers): see docs/cluster.md"),
    ("megatron.core", "megatron.core", "megatron-core", 'pip install "gkd-harness[gpu]" (megatron-core)'),
    ("mcore_bridge", "mcore_bridge", "mcore-bridge", 'pip install "gkd-harness[gpu]" (mcore-bridge)'),
    ("vllm", "vllm", "vllm", 'pip install "gkd-harness[gpu]" (vllm, pinned to the torch it was built for)'),
)

_TORCH_PROBE = ("import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
                "'available': torch.cuda.is_available(), 'count': torch.cuda.device_count() if "
                "torch.cuda.is_available() else 0}))")


def _probe(code: str, timeout: float) -> tuple[int, str, str]:
    """Run ``code`` in a fresh interpreter; ``(rc, stdout, stderr)`` (rc 124 on timeout)."""
    import subprocess

    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        return 124, "", f"import did not finish in {timeout:.0f} s"


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", line)]
    return (errors or lines or ["no output"])[-1][:240]


def preflight_row(name: str, module: str, dist: str, remedy: str, timeout: float = 180.0) -> dict[str, Any]:
    """One preflight record ``{"check": "preflight/<name>", "rc": 0|1, "detail": ...}``."""
    import importlib.metadata
    import importlib.util
    import os

    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = None
    top = module.split(".")[0]
    if version is None and importlib.util.find_spec(top) is None:
        return {"check": f"preflight/{name}", "rc": 1, "detail": f"missing: {dist} is not installed; {remedy}"}
    if name == "torch_cuda":
        rc, out, err = _probe(_TORCH_PROBE, timeout)
        if rc != 0:
            return {"check": f"preflight/{name}", "rc": 1, "detail": f"torch {version} does not import: "
                    f"{_last_error(err)}"}
        info = json.loads(out.strip().splitlines()[-1])
        if not info["cuda"]:
            return {"check": f"preflight/{name}", "rc": 1, "detail": f"missing: CUDA in torch: torch {info['version']} "
                    f"is a CPU build (torch.version.cuda is None); install {remedy}"}
        if not info["available"]:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return {"check": f"preflight/{name}", "rc": 1, "detail": f"missing: a visible GPU: torch {info['version']} "
                    f"(CUDA {info['cuda']}) sees none (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES="
                    f"{visible!r}); check the driver (nvidia-smi) and the allocation"}
        return {"check": f"preflight/{name}", "rc": 0, "detail": f"torch {info['version']}, CUDA {info['cuda']}, "
                f"{info['count']} GPU(s)"}
    rc, _, err = _probe(f"import {module}", timeout)
    if rc != 0:
        return {"check": f"preflight/{name}", "rc": 1, "detail": f"{dist} {version or '(version unknown)'} is "
                f"installed but `import {module}` fails: {_last_error(err)}"}
    return {"check": f"preflight/{name}", "rc": 0, "detail": f"{dist} {version}"}


def preflight(out: str | None = None) -> list[dict[str, Any]]:
    """Every :data:`PREFLIGHT` row, appended to ``out`` (JSONL) when given."""
    rows = [preflight_row(*spec) for spec in PREFLIGHT]
    if out:
        with open(out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return rows


#: fp32 vs FP64 on the seed inputs: the per-position mean loss within 1e-4·|ref| + 2e-6, gradients within 1e-3.
LOSS_RTOL, LOSS_ATOL, GRAD_REL_L2_MAX = 1e-4, 2e-6, 1e-3


def seed_repro(device: str = "cuda", seed: int = 0) -> dict[str, Any]:
    """The seed report's repro on ``device``; returns losses and gradient errors of every variant.

    Returns:
        ``{"upstream_native": float, "variants": {"native"|"fp32"|"fp64": {"loss", "grad_rel_l2"}}, ...}``.
    """
    import torch
    from swift.rlhf_trainers.gkd_loss import TeacherOutput, jsd_loss

    from analysis.replay import evaluate_variants, synthetic_inputs

    student, teacher_out, labels = synthetic_inputs(seed=seed)  # [1, 3, 64] fp32 student, bf16 teacher
    student, labels = student.to(device), labels.to(device)
    teacher = teacher_out.full_logits.to(device)
    # upstream, exactly as the report calls it (caller divides by T, then jsd_loss / rows)
    s = student[0].detach().clone().requires_grad_(True)
    upstream = jsd_loss(s / 0.9, teacher[0] / 0.9, beta=0.5) / s.shape[0]
    variants = evaluate_variants(student, TeacherOutput(full_logits=teacher, labels=labels), labels, beta=0.5,
                                 temperature=0.9)
    return {"check": "repro", "device": str(student.device), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else "",
            "upstream_native": float(upstream.detach()), "variants": variants}


def _last_metrics(run_dir: Path) -> dict[str, Any]:
    path = run_dir / METRICS_FILE
    last: dict[str, Any] = {}
    try:
        for line in path.read_text().splitlines():
            try:
                last.update(json.loads(line))
            except ValueError:
                continue
    except OSError:
        pass
    return last


def _max_metric(run_dir: Path, key: str) -> float | None:
    best = None
    try:
        for line in (run_dir / METRICS_FILE).read_text().splitlines():
            try:
                val = json.loads(line).get(key)
            except ValueError:
                continue
            if isinstance(val, (int, float)):
                best = val if best is None else max(best, val)
    except OSError:
        pass
    return best


def judge_repro(rec: dict[str, Any]) -> tuple[str, str]:
    """PASS when upstream is negative, fp32 matches FP64 (loss and gradient) and is positive."""
    v = rec["variants"]
    ref, f32 = v["fp64"]["loss"], v["fp32"]["loss"]
    ok_fp32 = abs(f32 - ref) <= LOSS_RTOL * abs(ref) + LOSS_ATOL and v["fp32"]["grad_rel_l2"] <= GRAD_REL_L2_MAX
    detail = (f"upstream {rec['upstream_native']:+.3e}, native {v['native']['loss']:+.3e} "
              f"(grad {v['native']['grad_rel_l2']:.1e}), fp32 {f32:+.3e} (grad {v['fp32']['grad_rel_l2']:.1e}), "
              f"fp64 {ref:+.3e}")
    if not ok_fp32 or f32 <= 0:
        return "FAIL", detail
    if rec["upstream_native"] >= 0:
        return "WARN", detail + " (upstream not negative on this GPU)"
    return "PASS", detail


def judge_run(rec: dict[str, Any]) -> tuple[str, str]:
    """Judge one gkd-train run folder against its ``expect`` block."""
    run_dir = Path(rec["run_dir"])
    summary = {}
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        pass
    status = summary.get("status", "missing")
    last = _last_metrics(run_dir)
    # what reached ms-swift's loss call before any harness cast (falls back to what the loss saw)
    dtypes = summary.get("dtypes_arrived") or summary.get("dtypes_seen") or {}
    neg = last.get(NEG_LOSS_CALLS_TOTAL)
    calls = last.get(LOSS_CALLS_TOTAL)
    rel = _max_metric(run_dir, SPOT_LOSS_REL_ERR)
    parts = [f"status {status}", f"steps {summary.get('last_step', last.get('step', '-'))}",
             f"dtypes S={dtypes.get('student', '?')} T={dtypes.get('teacher', '?')}",
             f"neg {neg}/{calls}"]
    if rel is not None:
        parts.append(f"max spot rel {rel:.1e}")
    verdict = "PASS"
    if status != "completed":  # a sweep's rc is shared by its points: judge each by its own summary
        err = (summary.get("error") or "").strip().splitlines()
        return "FAIL", ", ".join(parts) + (f", error: {err[-1][:120]}" if err else f", rc {rec.get('rc')}")
    expect = dict(rec.get("expect") or {})
    if expect.get("neg_calls") == "by_precision":
        native = (summary.get("config") or {}).get("loss.precision") == "native"
        expect["neg_calls"] = "positive" if native else "zero"
    for side in ("student", "teacher"):
        want = expect.get(f"{side}_dtype")
        if want and dtypes.get(side) != want:
            verdict = "FAIL"
            parts.append(f"{side} dtype {dtypes.get(side)} != {want}")
    if expect.get("neg_calls") == "zero" and neg not in (0, 0.0):
        verdict = "FAIL"
    if expect.get("neg_calls") == "positive" and not (isinstance(neg, (int, float)) and neg > 0):
        verdict = "WARN" if verdict == "PASS" else verdict
        parts.append("no negative calls seen")
    return verdict, ", ".join(parts)


def table(records: Iterable[dict[str, Any]]) -> tuple[str, bool]:
    """The printed table and whether every row passed (WARN counts as passed)."""
    rows, ok = [], True
    expanded: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("group_dir") and not rec.get("planned"):
            found = sorted(p.parent for p in Path(rec["group_dir"]).rglob(SUMMARY_FILE))
            if not found:
                expanded.append({**rec, "run_dir": rec["group_dir"]})
            for run_dir in found:
                name = run_dir.name if run_dir != Path(rec["group_dir"]) else ""
                expanded.append({**rec, "check": f"{rec['check']}/{name}".rstrip("/"), "run_dir": str(run_dir)})
        else:
            expanded.append(rec)
    for rec in expanded:
        if rec.get("planned"):
            verdict, detail = "PLAN", f"timeout {rec['timeout_s']} s (estimate {rec['estimate_s']} s): {rec['planned']}"
        elif rec.get("skipped"):
            verdict, detail = "SKIP", rec["skipped"]
        elif rec.get("check") == "repro" and "variants" in rec:
            verdict, detail = judge_repro(rec)
        elif rec.get("run_dir"):
            verdict, detail = judge_run(rec)
        else:
            verdict = "PASS" if rec.get("rc", 1) == 0 else "FAIL"
            detail = rec.get("detail", "")
        ok &= verdict != "FAIL"
        wall = rec.get("wall_s")
        rows.append((rec.get("check", "?"), verdict, f"{wall:.0f}s" if isinstance(wall, (int, float)) else "-",
                     detail))
    width = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'check':<{width}}  {'result':<6}  {'wall':>5}  detail", "-" * (width + 60)]
    lines += [f"{c:<{width}}  {v:<6}  {w:>5}  {d}" for c, v, w, d in rows]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.gpu_check")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rep = sub.add_parser("repro", help="seed repro on a device")
    rep.add_argument("--device", default="cuda")
    rep.add_argument("--out", required=True, help="append the record to this JSONL file")
    tab = sub.add_parser("table", help="print the table from a checks JSONL file")
    tab.add_argument("checks")
    tab.add_argument("--dry-run", action="store_true", help="planned checks: always exit 0")
    pre = sub.add_parser("preflight", help="import preflight of the GPU prerequisites")
    pre.add_argument("--out", required=True, help="append the rows to this JSONL file")
    args = parser.parse_args(argv)
    if args.cmd == "preflight":
        rows = preflight(args.out)
        for row in rows:
            print(f"  {row['check']:<30} {'ok' if row['rc'] == 0 else 'MISSING'}  {row['detail']}")
        print("PREFLIGHT_FAILED=" + ",".join(r["check"].split("/", 1)[1] for r in rows if r["rc"] != 0))
        return 0
    if args.cmd == "repro":
        t0 = time.perf_counter()
        rec = seed_repro(args.device)
        rec["wall_s"] = time.perf_counter() - t0
        with open(args.out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(json.dumps(rec, indent=1))
        return 0
    records = [json.loads(line) for line in Path(args.checks).read_text().splitlines() if line.strip()]
    text, ok = table(records)
    print(text)
    return 0 if ok or args.dry_run else 1


if __name__ == "__main__":
    sys.exit(main())
