"""The certificate of a loaded candidate as data, and its text / markdown renderings (``gkd-certify`` and the
sign-off's ``candidate_certified`` both use it)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

__all__ = [
    "BUILTINS",
    "CERTIFICATE_MD",
    "CERTIFICATE_JSON",
    "STRICT_BARS",
    "load",
    "families_for",
    "certify",
    "render_text",
    "render_markdown",
    "write",
    "why",
]

BUILTINS = ("fp32", "fp64", "native")
CERTIFICATE_MD, CERTIFICATE_JSON = "certificate.md", "certificate.json"


def load(spec: str, name: Optional[str], beta_form: str, unchanged: Sequence[str]):
    """``(Candidate, beta_form)`` for a file / module spec or a harness variant name."""
    from gkd_harness.harness.loss.candidate import Candidate, load_candidate, loss_source_path, loss_source_sha256

    if spec in BUILTINS:
        from gkd_harness.harness.losses import make_gkd_loss, make_jsd_loss

        cand = Candidate(
            name=name or f"harness {spec}",
            source=spec,
            path=loss_source_path(spec),
            sha256=loss_source_sha256(spec),
            gkd_loss=make_gkd_loss(spec, beta_form),
            jsd_loss=make_jsd_loss(spec, beta_form),
        )
    else:
        cand = load_candidate(spec, name)
    if unchanged:
        cand.unchanged = tuple(unchanged)
    return cand


def families_for(cand, strict: bool, only: Sequence[str] = ()) -> List[Any]:
    from gkd_harness.analysis.certify.families import HARD_FAMILIES, REQUIRED_FAMILIES, identity_family

    fams = list(REQUIRED_FAMILIES)
    if cand.unchanged:
        fams.append(identity_family(cand.unchanged))
    fams += HARD_FAMILIES
    if only:
        fams = [f for f in fams if any(o.lower() in f.name.lower() for o in only)]
    return fams


#: ``--strict``'s bar in the hard regimes: ``upstream`` (never worse than upstream's own formula computed in FP32
#: on the same inputs: the bar for an outside fix) or ``tolerance`` (the suite's tolerance: the harness's own bar).
STRICT_BARS = ("upstream", "tolerance")


def _source_text(cand) -> Optional[str]:
    try:
        return Path(cand.path).read_text() if cand.path and Path(cand.path).is_file() else None
    except OSError:
        return None


def certify(
    cand,
    beta_form: str = "paper",
    quick: bool = False,
    strict: bool = False,
    only: Sequence[str] = (),
    bar: str = "upstream",
) -> Dict[str, Any]:
    """The certificate of a loaded candidate as plain data (what ``certificate.json`` holds).

    ``strict``: the hard regimes gate the verdict too, each case against ``bar`` (:data:`STRICT_BARS`)."""
    import torch
    from swift.rlhf_trainers import gkd_loss as upstream

    from gkd_harness.analysis.certify.evaluate import run_family

    if bar not in STRICT_BARS:
        raise ValueError(f"bar: {bar!r}, expected one of {STRICT_BARS}")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    source = _source_text(cand)
    rows = [
        run_family(
            cand.gkd_loss,
            f,
            beta_form,
            quick,
            upstream=upstream.gkd_loss,
            source=source,
            relative=strict and bar == "upstream" and not f.required,
        )
        for f in families_for(cand, strict, only)
    ]
    gating = [r for r in rows if r.required or strict]
    verdict = "PASS" if all(r.passed for r in gating) else "FAIL"
    return {
        "candidate": cand.provenance(),
        "beta_form": beta_form,
        "quick": quick,
        "strict": strict,
        "strict_bar": bar if strict else None,
        "declared_unchanged": list(cand.unchanged),
        "verdict": verdict,
        "failed_families": [r.name for r in gating if not r.passed],
        "families": [{**r.__dict__, "passed": r.passed, "gating": r.required or strict} for r in rows],
        "wall_s": round(time.perf_counter() - t0, 2),
        "versions": _versions(),
    }


def _versions() -> Dict[str, Optional[str]]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("ms-swift", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _fmt_ratio(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3g}"


HEADER = ("family", "required", "cases", "failures", "worst err/tol", "severity", "negatives", "NaN")


def table_rows(cert: Dict[str, Any]) -> List[List[str]]:
    return [
        [
            f["name"],
            "yes" if f["required"] else ("strict" if f["gating"] else "no"),
            str(f["cases"]),
            str(f["failures"]),
            _fmt_ratio(f["worst_ratio"]),
            f.get("severity") or "-",
            str(f["negatives"]),
            str(f["nonfinite"]),
        ]
        for f in cert["families"]
    ]


def why(f: Dict[str, Any]) -> str:
    """One line for a failing family: worst case, its error ÷ tolerance, severity, and the cause if recognised."""
    first = f["failing"][0] if f["failing"] else {}
    line = (
        f"{f['name']}: {f.get('severity') or 'defect'}, {f['failures']} of {f['cases']} cases fail; worst "
        f"{first.get('case')!r} at {_fmt_ratio(first.get('ratio', math.inf))}x tolerance ({first.get('note')})"
    )
    return line + (f"; likely cause: {f['cause']}" if f.get("cause") else "")


def render_text(cert: Dict[str, Any]) -> str:
    rows = [list(HEADER)] + table_rows(cert)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    c = cert["candidate"]
    head = (
        f"gkd-certify {c['name']}  sha256 {c['sha256'] or '-'}  beta_form={cert['beta_form']}"
        f"{'  --quick' if cert['quick'] else ''}"
        f"{'  --strict (' + str(cert.get('strict_bar')) + ')' if cert['strict'] else ''}"
    )
    tail = [
        f"verdict: {cert['verdict']}"
        + (f" (failed: {', '.join(cert['failed_families'])})" if cert["failed_families"] else "")
        + f"  [{cert['wall_s']} s]"
    ]
    for f in cert["families"]:
        if f["failing"] and f["gating"]:
            tail.append(f"  {why(f)}")
    return "\n".join([head] + lines + tail) + "\n"


def render_markdown(cert: Dict[str, Any]) -> str:
    c = cert["candidate"]
    out = [
        f"# GKD loss certificate: {c['name']}",
        "",
        f"- source: `{c['source']}`",
        f"- file: `{c['path']}`",
        f"- sha256: `{c['sha256']}`",
        f"- β form judged: {cert['beta_form']}; mode: {'quick' if cert['quick'] else 'full'}"
        f"{', strict' if cert['strict'] else ''}; ms-swift {cert['versions'].get('ms-swift')}, "
        f"torch {cert['versions'].get('torch')}",
        f"- declared unchanged vs upstream: {', '.join(cert['declared_unchanged']) or 'nothing'}",
        f"- **verdict: {cert['verdict']}**"
        + (f" (failed: {', '.join(cert['failed_families'])})" if cert["failed_families"] else ""),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    out += ["| " + " | ".join(r) + " |" for r in table_rows(cert)]
    out += [
        "",
        "References: the independent FP64 reference (harness/loss/reference.py); tolerance per case: value "
        "1e-5·|ref| + 1e-6·N, student-logit gradient rel-L2 1e-4 (+2× the dtype's own rounding for BF16/FP16 "
        "students) (harness/loss/tolerances.py). err/tol > 1 fails a case; bit-exact checks report 0 or inf. Severity "
        "of a failing family: near (every failing case finite, non-negative, within 10x its tolerance) or "
        "defect. Under --strict (upstream) a hard-regime case fails only where the candidate is worse than "
        "upstream's formula computed in FP32 on the same inputs.",
    ]
    failing = [(f["name"], x) for f in cert["families"] for x in f["failing"]]
    if failing:
        out += [
            "",
            "## Failing cases (worst first, up to 5 per family)",
            "",
            "| family | case | err/tol | note |",
            "|---|---|---|---|",
        ]
        out += [f"| {n} | {x['case']} | {_fmt_ratio(x['ratio'])} | {x['note']} |" for n, x in failing]
        out += ["", "## Why", ""] + [f"- {why(f)}" for f in cert["families"] if f["failing"] and f["gating"]]
    return "\n".join(out) + "\n"


def write(cert: Dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CERTIFICATE_MD).write_text(render_markdown(cert))
    (out_dir / CERTIFICATE_JSON).write_text(
        json.dumps(cert, indent=2, default=str, allow_nan=True).replace("Infinity", "1e999")
    )
