"""Helpers of ``launch/gpu_check.sh``: the import preflight, the seed repro on CUDA and the final table.

``python -m gkd_harness.launch.gpu_check preflight --out CHECKS.jsonl``
    One row per prerequisite of the GPU path (:data:`PREFLIGHT`): torch with CUDA, Transformer Engine,
    megatron.core, mcore_bridge, vLLM. Each import runs in a fresh interpreter (a broken install cannot take the
    preflight down); a row says exactly what is missing: not installed (and how to get it), installed but the
    import fails (the error's last line), or, for torch, a CPU build / no visible GPU; an import that does not finish
    in :data:`PREFLIGHT_TIMEOUT_S` is SLOW (a warning: its checks still run), never a failure. Prints
    ``PREFLIGHT_FAILED=name,...`` last, which the script reads to skip the checks that cannot run.

``python -m gkd_harness.launch.gpu_check repro [--device cuda]``
    The seed report's synthetic reproduction (student FP32 from BF16-rounded ``randn*2``, teacher = student +
    ``randn*0.03`` in BF16, β=0.5, T=0.9, 3×64) made on the device: upstream's ``gkd_loss`` on those raw
    mixed-dtype inputs (a finding: reproduced or not) and the harness's fp32 variant (a check), both against the independent
    FP64 reference ``harness/loss/reference.py`` (``gkd_harness.harness.loss.proof``). Writes one JSON object per line to
    ``--out``.

``python -m gkd_harness.launch.gpu_check table CHECKS.jsonl``
    Prints the short table: one row per check (repro/defect and repro/fix, each run folder), with PASS / WARN /
    FAIL (FOUND / NOT FOUND for the defect, a finding). Exit bits as the bare proof's: 1 when any row FAILs, 4 when
    the repro ran and the defect was NOT FOUND.

``python -m gkd_harness.launch.gpu_check table --dry-run CHECKS.jsonl``
    The plan: a preflight row whose prerequisite is missing says MISSING, a planned check that needs it says
    WOULD-SKIP (naming what is missing), one that would run PLAN; the last line counts the checks that would run.
    Exits 0 when every planned check would run, 1 otherwise (the plan would not run in full).

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

from gkd_harness.harness.contract import (
    LOSS_CALLS_TOTAL,
    NATIVE,
    NEG_LOSS_CALLS_TOTAL,
    SPOT_LOSS_REL_ERR,
)
from gkd_harness.harness.store.records import RecordError, folders_with_summary, read_metrics_rows, read_summary

#: (row name, module to import, distribution name, what to do when it is missing), in the order they are needed.
PREFLIGHT = (
    ("torch_cuda", "torch", "torch", "the CUDA build of torch the cluster image provides (never a CPU wheel)"),
    (
        "transformer_engine",
        "transformer_engine",
        "transformer-engine",
        "Transformer Engine is an image prerequisite (NGC PyTorch images ship it; building it needs the CUDA toolkit "
        "and cuDNN headers): see docs/cluster.md",
    ),
    ("megatron.core", "megatron.core", "megatron-core", 'pip install "gkd-harness[gpu]" (megatron-core)'),
    ("mcore_bridge", "mcore_bridge", "mcore-bridge", 'pip install "gkd-harness[gpu]" (mcore-bridge)'),
    ("vllm", "vllm", "vllm", 'pip install "gkd-harness[gpu]" (vllm, pinned to the torch it was built for)'),
)

#: Seconds a preflight import may take; past it the row says slow (a loaded machine, a cold disk cache), not failed.
PREFLIGHT_TIMEOUT_S = 180.0

_TORCH_PROBE = (
    "import json, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
    "'available': torch.cuda.is_available(), 'count': torch.cuda.device_count() if "
    "torch.cuda.is_available() else 0}))"
)


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


def preflight_row(
    name: str, module: str, dist: str, remedy: str, timeout: float = PREFLIGHT_TIMEOUT_S
) -> dict[str, Any]:
    """One preflight record ``{"check": "preflight/<name>", "rc": 0|1, "detail": ...}``; an import that does not
    finish in ``timeout`` is ``{"rc": 0, "slow": True}``: slow, not failed (the checks that need it still run)."""
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
        if rc == 124:
            return _slow(name, "torch", dist, version, timeout)
        if rc != 0:
            return {
                "check": f"preflight/{name}",
                "rc": 1,
                "detail": f"torch {version} does not import: {_last_error(err)}",
            }
        info = json.loads(out.strip().splitlines()[-1])
        if not info["cuda"]:
            return {
                "check": f"preflight/{name}",
                "rc": 1,
                "detail": f"missing: CUDA in torch: torch {info['version']} "
                f"is a CPU build (torch.version.cuda is None); install {remedy}",
            }
        if not info["available"]:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return {
                "check": f"preflight/{name}",
                "rc": 1,
                "detail": f"missing: a visible GPU: torch {info['version']} "
                f"(CUDA {info['cuda']}) sees none (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES="
                f"{visible!r}); check the driver (nvidia-smi) and the allocation",
            }
        return {
            "check": f"preflight/{name}",
            "rc": 0,
            "detail": f"torch {info['version']}, CUDA {info['cuda']}, {info['count']} GPU(s)",
        }
    rc, _, err = _probe(f"import {module}", timeout)
    if rc == 124:
        return _slow(name, module, dist, version, timeout)
    if rc != 0:
        return {
            "check": f"preflight/{name}",
            "rc": 1,
            "detail": f"{dist} {version or '(version unknown)'} is "
            f"installed but `import {module}` fails: {_last_error(err)}",
        }
    return {"check": f"preflight/{name}", "rc": 0, "detail": f"{dist} {version}"}


def _slow(name: str, module: str, dist: str, version: str | None, timeout: float) -> dict[str, Any]:
    return {
        "check": f"preflight/{name}",
        "rc": 0,
        "slow": True,
        "detail": f"slow: `import {module}` ({dist}, {f'version {version}' if version else 'version unknown'}) did "
        f"not finish in {timeout:.0f} s (a loaded machine or a cold disk cache?); not a failure: the "
        "checks that need it still run, each under its own timeout",
    }


def preflight(out: str | None = None) -> list[dict[str, Any]]:
    """Every :data:`PREFLIGHT` row, appended to ``out`` (JSONL) when given."""
    rows = [preflight_row(*spec, timeout=PREFLIGHT_TIMEOUT_S) for spec in PREFLIGHT]
    if out:
        with open(out, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return rows


def seed_repro(device: str = "cuda", seed: int = 0) -> dict[str, Any]:
    """The seed report's repro on ``device`` (``gkd_harness.harness.loss.proof.report_repro``: upstream's ``gkd_loss`` on the
    report's raw inputs, and the harness's fp32 variant, both against the independent FP64 reference).

    Returns:
        ``{"check": "repro", "upstream": float, "reference": float, "finding": "reproduced" | "not reproduced",
        "fix": {"ok", "loss", "grad_rel_l2", "why", ...}, ...}``.
    """
    import torch

    from gkd_harness.harness.loss.proof import report_repro

    rec = report_repro(device, seed=seed)
    return {
        "check": "repro",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else "",
        **rec,
    }


def _last_metrics(run_dir: Path) -> dict[str, Any]:
    last: dict[str, Any] = {}
    try:
        for row in read_metrics_rows(run_dir):
            last.update(row)
    except OSError:
        pass
    return last


def _max_metric(run_dir: Path, key: str) -> float | None:
    best = None
    try:
        for row in read_metrics_rows(run_dir):
            val = row.get(key)
            if isinstance(val, (int, float)):
                best = val if best is None else max(best, val)
    except OSError:
        pass
    return best


def judge_repro(rec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The repro record as two table rows ``(check, verdict, detail)``: ``repro/defect`` is a finding (FOUND when
    upstream's loss is negative where the exact one is not, else NOT FOUND; never a pass or a fail) and
    ``repro/fix`` a check (PASS, or FAIL on a negative loss or an error beyond the tolerances)."""
    fix = rec["fix"]
    found = rec["finding"] == "reproduced"
    defect = (
        f"upstream {rec['upstream']:+.3e}, reference {rec['reference']:+.3e}, grad rel L2 "
        f"{rec.get('upstream_grad_rel_l2', float('nan')):.2e}: defect "
        f"{'reproduced' if found else 'NOT reproduced on this device'} ({rec.get('criteria', 'sign')})"
    )
    detail = (
        f"fp32 {fix['loss']:+.3e} (grad {fix['grad_rel_l2']:.1e} <= {fix['grad_tol']:.1e}), "
        f"reference {rec['reference']:+.3e}" + (f": {fix['why']}" if fix["why"] else "")
    )
    return [
        ("repro/defect", "FOUND" if found else "NOT FOUND", defect),
        ("repro/fix", "PASS" if fix["ok"] else "FAIL", detail),
    ]


def judge_run(rec: dict[str, Any]) -> tuple[str, str]:
    """Judge one gkd-train run folder against its ``expect`` block."""
    run_dir = Path(rec["run_dir"])
    summary: dict[str, Any] = {}
    try:
        summary = dict(read_summary(run_dir, check=False) or {})
    except (OSError, RecordError):
        pass
    status = summary.get("status", "missing")
    last = _last_metrics(run_dir)
    # what reached ms-swift's loss call before any harness cast (falls back to what the loss saw)
    dtypes = summary.get("dtypes_arrived") or summary.get("dtypes_seen") or {}
    neg = last.get(NEG_LOSS_CALLS_TOTAL)
    calls = last.get(LOSS_CALLS_TOTAL)
    rel = _max_metric(run_dir, SPOT_LOSS_REL_ERR)
    parts = [
        f"status {status}",
        f"steps {summary.get('last_step', last.get('step', '-'))}",
        f"dtypes S={dtypes.get('student', '?')} T={dtypes.get('teacher', '?')}",
        f"neg {neg}/{calls}",
    ]
    if rel is not None:
        parts.append(f"max spot rel {rel:.1e}")
    verdict = "PASS"
    if status != "completed":  # a sweep's rc is shared by its points: judge each by its own summary
        err = (summary.get("error") or "").strip().splitlines()
        return "FAIL", ", ".join(parts) + (f", error: {err[-1][:120]}" if err else f", rc {rec.get('rc')}")
    expect = dict(rec.get("expect") or {})
    if expect.get("neg_calls") == "by_precision":
        native = (summary.get("config") or {}).get("loss.precision") == NATIVE
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


def table(records: Iterable[dict[str, Any]], dry_run: bool = False) -> tuple[str, bool]:
    """The printed table and whether every row passed (WARN counts as passed). ``dry_run``: the plan's table, and
    whether every planned check would run (no MISSING prerequisite, no WOULD-SKIP check)."""
    rows, ok = [], True
    expanded: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("group_dir") and not rec.get("planned"):
            found = folders_with_summary(rec["group_dir"])
            if not found:
                expanded.append({**rec, "run_dir": rec["group_dir"]})
            for run_dir in found:
                name = run_dir.name if run_dir != Path(rec["group_dir"]) else ""
                expanded.append({**rec, "check": f"{rec['check']}/{name}".rstrip("/"), "run_dir": str(run_dir)})
        else:
            expanded.append(rec)
    planned = would_run = 0
    for rec in expanded:
        if rec.get("planned"):
            planned += 1
            detail = f"timeout {rec['timeout_s']} s (estimate {rec['estimate_s']} s): {rec['planned']}"
            if rec.get("missing"):
                verdict, detail = "WOULD-SKIP", f"preflight found missing: {rec['missing']}; {detail}"
                ok = False
            else:
                verdict = "PLAN"
                would_run += 1
        elif dry_run and str(rec.get("check", "")).startswith("preflight") and rec.get("rc", 1) != 0:
            verdict, detail = "MISSING", rec.get("detail", "")
            ok = False
        elif rec.get("skipped"):
            verdict, detail = "SKIP", rec["skipped"]
        elif rec.get("slow"):
            verdict, detail = "SLOW", rec.get("detail", "")
        elif rec.get("check") == "repro" and "fix" in rec:
            for check, verdict, detail in judge_repro(rec):
                ok &= verdict != "FAIL"
                rows.append((check, verdict, "-", detail))
            continue
        elif rec.get("run_dir"):
            verdict, detail = judge_run(rec)
        else:
            verdict = "PASS" if rec.get("rc", 1) == 0 else "FAIL"
            detail = rec.get("detail", "")
        ok &= verdict != "FAIL"
        wall = rec.get("wall_s")
        rows.append((rec.get("check", "?"), verdict, f"{wall:.0f}s" if isinstance(wall, (int, float)) else "-", detail))
    width = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'check':<{width}}  {'result':<6}  {'wall':>5}  detail", "-" * (width + 60)]
    lines += [f"{c:<{width}}  {v:<6}  {w:>5}  {d}" for c, v, w, d in rows]
    if dry_run:
        lines.append(
            f"plan: {would_run}/{planned} checks would run"
            + ("" if ok else "; the plan would NOT run in full (a prerequisite is missing): exit 1")
        )
    return "\n".join(lines), ok


def defect_not_found(records: Iterable[dict[str, Any]]) -> bool:
    """True when a repro record ran and its defect finding is not ``reproduced``."""
    return any(rec.get("check") == "repro" and rec.get("finding") not in (None, "reproduced") for rec in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gkd_harness.launch.gpu_check")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rep = sub.add_parser("repro", help="seed repro on a device")
    rep.add_argument("--device", default="cuda")
    rep.add_argument("--out", required=True, help="append the record to this JSONL file")
    tab = sub.add_parser("table", help="print the table from a checks JSONL file")
    tab.add_argument("checks")
    tab.add_argument(
        "--dry-run", action="store_true", help="planned checks: exit 0 when every one would run, 1 otherwise"
    )
    pre = sub.add_parser("preflight", help="import preflight of the GPU prerequisites")
    pre.add_argument("--out", required=True, help="append the rows to this JSONL file")
    args = parser.parse_args(argv)
    if args.cmd == "preflight":
        rows = preflight(args.out)
        for row in rows:
            state = "SLOW" if row.get("slow") else "ok" if row["rc"] == 0 else "MISSING"
            print(f"  {row['check']:<30} {state}  {row['detail']}")
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
    text, ok = table(records, dry_run=args.dry_run)
    print(text)
    if args.dry_run:
        return 0 if ok else 1
    return (0 if ok else 1) | (4 if defect_not_found(records) else 0)


if __name__ == "__main__":
    sys.exit(main())
