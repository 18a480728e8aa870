"""The certificate in the sign-off: every distinct candidate of a sweep (by sha256 and β form) is certified once,
cached in the sweep folder (``certificates/<sha256>-<beta_form>/certificate.json`` and ``.md``), and a failed
certificate fails the verdict (criterion ``candidate_certified``, wrapped by :mod:`gkd_harness.analysis.signoff.criteria`).

The candidate certified is the copy its run kept (``<run>/candidate/<file>``, the evidence after the branch
moved), else the ``loss.source`` it named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from gkd_harness.harness.contract import CANDIDATE, CANDIDATE_DIR

CACHE_DIR = "certificates"
THRESHOLD = "every required family of gkd-certify passes (docs/certify.md); once per candidate sha256"


def _candidate_file(run: Dict[str, Any]) -> Optional[str]:
    """The run folder's copy of the candidate, else its ``loss.source``."""
    source = run.get("loss.source")
    if not isinstance(source, str) or not source:
        return None
    folder = run.get("path")
    if folder:
        copies = sorted((Path(folder) / CANDIDATE_DIR).glob("*.py"))
        if copies:
            return str(copies[0])
    return source


def _certificate(
    source: str, name: Optional[str], beta_form: str, cache_root: Optional[Path], quick: bool, strict: bool
) -> Dict[str, Any]:
    from gkd_harness.analysis.certify.certificate import CERTIFICATE_JSON, complete, recall, write
    from gkd_harness.analysis.certify.process import certify_in_child
    from gkd_harness.harness.loss.candidate import loss_source_sha256

    sha = loss_source_sha256(CANDIDATE, source)
    cache = (
        cache_root / CACHE_DIR / f"{sha}-{beta_form}{'-quick' if quick else ''}{'-strict' if strict else ''}"
        if cache_root is not None and sha
        else None
    )
    if cache is not None and (cache / CERTIFICATE_JSON).is_file():
        cert = json.loads((cache / CERTIFICATE_JSON).read_text())
        if complete(cert):  # one that ran fewer draws than asked, or whose process died, is recomputed
            cert["cached"] = str(cache)
            return cert
    # the certificate gkd-certify --out kept for this file (sha256) and harness version, if any (issue 40, item 8)
    kept = recall(sha, beta_form, quick, strict, name=name) if sha else None
    cert = kept if kept is not None else certify_in_child(source, name, beta_form, quick=quick, strict=strict)
    if cache is not None and complete(cert):
        try:
            write(cert, cache)
            cert["cached"] = str(cache)
        except OSError:  # a read-only sweep folder: certified, not cached
            pass
    return cert


def certificate_rows(
    runs, sweep_dir: Optional[str], quick: bool = False, strict: bool = False
) -> Tuple[str, str, str, List[str], str]:
    """``(status, threshold, measured, details, applies)`` of ``candidate_certified`` for the sweep's runs table."""
    from gkd_harness.analysis.certify.certificate import why
    from gkd_harness.harness.loss.candidate import CandidateError, loss_source_sha256

    if "loss.precision" not in runs:
        return (
            "not_applicable",
            THRESHOLD,
            "no candidate run",
            [],
            "not applicable: the sweep has no loss=candidate run",
        )
    cand = runs[runs["loss.precision"] == CANDIDATE]
    if cand.empty:
        return (
            "not_applicable",
            THRESHOLD,
            "no candidate run",
            [],
            "not applicable: the sweep has no loss=candidate run",
        )
    if sweep_dir and sweep_dir.startswith(
        "local:"
    ):  # gkd_harness.analysis.sweep.runs names a local sweep "local:<folder>"
        sweep_dir = sweep_dir[len("local:") :]
    root = Path(sweep_dir) if sweep_dir and Path(sweep_dir).is_dir() else None
    seen: Dict[Tuple[str, str], Dict[str, Any]] = {}
    details, failed, missing = [], [], []
    for run in cand.to_dict("records"):
        src = _candidate_file(run)
        if src is None:
            missing.append(str(run.get("run")))
            continue
        form = str(run.get("loss.beta_form") or "paper")
        name = run.get("loss.name") if isinstance(run.get("loss.name"), str) else None
        key = (src, form)
        try:
            key = (loss_source_sha256(CANDIDATE, src) or src, form)
            if key not in seen:
                seen[key] = _certificate(src, name or Path(str(run.get("loss.source"))).stem, form, root, quick, strict)
        except CandidateError as e:
            seen[key] = {
                "verdict": "FAIL",
                "candidate": {"name": name or src, "sha256": key[0]},
                "failed_families": [f"cannot be loaded: {e}"],
                "families": [],
            }
    for (_sha, form), cert in seen.items():
        c = cert["candidate"]
        label = f"{c['name']} (sha256 {str(c.get('sha256'))[:12]}, {form})"
        required = [f for f in cert.get("families", []) if f.get("gating")]
        if cert["verdict"] != "PASS":
            failed.append(label)
            for f in required:
                if not f["passed"]:
                    details.append(f"{label}: {why(f)}")  # worst case, err/tol, severity, recognised cause
            details += [f"{label}: {x}" for x in cert.get("failed_families", []) if x.startswith("cannot")]
        else:
            details.append(
                f"{label}: PASS ({len(required)} required families"
                + (f"; certificate {cert['cached']}" if cert.get("cached") else "")
                + ")"
            )
    details += [f"{r}: loss=candidate without loss.source" for r in missing]
    measured = (
        "; ".join(
            f"{cert['candidate']['name']} (sha256 {str(cert['candidate'].get('sha256'))[:12]}): {cert['verdict']}"
            for cert in seen.values()
        )
        or "no certificate"
    )
    status = "fail" if failed or missing or not seen else "pass"
    applies = f"applies: {len(cand)} candidate runs, {len(seen)} distinct candidates"
    return status, THRESHOLD, measured, details, applies
