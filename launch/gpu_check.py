"""Helpers of ``launch/gpu_check.sh``: the seed repro on CUDA and the final table read back from run folders.

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
import sys
import time
from pathlib import Path
from typing import Any, Iterable

#: fp32 vs FP64 on the seed inputs: the per-position mean loss within 1e-4·|ref| + 2e-6, gradients within 1e-3.
LOSS_RTOL, LOSS_ATOL, GRAD_REL_L2_MAX = 1e-4, 2e-6, 1e-3


def seed_repro(device: str = "cuda", seed: int = 0) -> dict[str, Any]:
    """The seed report's repro on ``device``; returns losses and gradient errors of every variant.

    Returns:
        ``{"upstream_native": float, "variants": {"native"|"fp32"|"fp64": {"loss", "grad_rel_l2"}}, ...}``.
    """
    import torch
    from swift.rlhf_trainers.gkd_loss import TeacherOutput, jsd_loss

    from harness.replay import evaluate_variants, synthetic_inputs

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
    path = run_dir / "metrics.jsonl"
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
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
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
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        pass
    status = summary.get("status", "missing")
    last = _last_metrics(run_dir)
    # what reached ms-swift's loss call before any harness cast (falls back to what the loss saw)
    dtypes = summary.get("dtypes_arrived") or summary.get("dtypes_seen") or {}
    neg = last.get("gkd/neg_loss_calls_total")
    calls = last.get("gkd/loss_calls_total")
    rel = _max_metric(run_dir, "spot/loss_rel_err")
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
        if rec.get("group_dir"):
            found = sorted(p.parent for p in Path(rec["group_dir"]).rglob("summary.json"))
            if not found:
                expanded.append({**rec, "run_dir": rec["group_dir"]})
            for run_dir in found:
                name = run_dir.name if run_dir != Path(rec["group_dir"]) else ""
                expanded.append({**rec, "check": f"{rec['check']}/{name}".rstrip("/"), "run_dir": str(run_dir)})
        else:
            expanded.append(rec)
    for rec in expanded:
        if rec.get("check") == "repro":
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
    args = parser.parse_args(argv)
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
