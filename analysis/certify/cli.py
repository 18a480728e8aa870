"""``gkd-certify CANDIDATE``: the loss-level certificate of a candidate fix, no training.

CANDIDATE is a file with ms-swift's ``gkd_loss.py`` interface (``PATH.py``, e.g. a pull request's file), an
importable ``package.module[:attr]`` (``swift.rlhf_trainers.gkd_loss`` is the installed upstream), or one of the
harness's own variants (``fp32``, ``fp64``, ``native``). Every family runs through the candidate's ``gkd_loss``
against the project's independent FP64 reference (``harness.loss.reference``) with the suite's tolerances
(``harness.loss.tolerances``).

Exit codes: 0 every required family passes (with ``--strict``: the hard regimes too), 1 one fails, 2 unusable
input (a candidate that cannot be loaded, a bad argument).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

BUILTINS = ("fp32", "fp64", "native")
CERTIFICATE_MD, CERTIFICATE_JSON = "certificate.md", "certificate.json"


def _load(spec: str, name: Optional[str], beta_form: str, unchanged: Sequence[str]):
    """``(Candidate, beta_form)`` for a file / module spec or a harness variant name."""
    from harness.loss.candidate import Candidate, load_candidate, loss_source_path, loss_source_sha256

    if spec in BUILTINS:
        from harness.losses import make_gkd_loss, make_jsd_loss

        cand = Candidate(name=name or f"harness {spec}", source=spec, path=loss_source_path(spec),
                         sha256=loss_source_sha256(spec), gkd_loss=make_gkd_loss(spec, beta_form),
                         jsd_loss=make_jsd_loss(spec, beta_form))
    else:
        cand = load_candidate(spec, name)
    if unchanged:
        cand.unchanged = tuple(unchanged)
    return cand


def families_for(cand, strict: bool, only: Sequence[str] = ()) -> List[Any]:
    from analysis.certify.families import HARD_FAMILIES, REQUIRED_FAMILIES, identity_family

    fams = list(REQUIRED_FAMILIES)
    if cand.unchanged:
        fams.append(identity_family(cand.unchanged))
    fams += HARD_FAMILIES
    if only:
        fams = [f for f in fams if any(o.lower() in f.name.lower() for o in only)]
    return fams


def certify(cand, beta_form: str = "paper", quick: bool = False, strict: bool = False,
            only: Sequence[str] = ()) -> Dict[str, Any]:
    """The certificate of a loaded candidate as plain data (what ``certificate.json`` holds)."""
    import torch
    from swift.rlhf_trainers import gkd_loss as upstream

    from analysis.certify.evaluate import run_family

    torch.manual_seed(0)
    t0 = time.perf_counter()
    rows = [run_family(cand.gkd_loss, f, beta_form, quick, upstream=upstream.gkd_loss)
            for f in families_for(cand, strict, only)]
    gating = [r for r in rows if r.required or strict]
    verdict = "PASS" if all(r.passed for r in gating) else "FAIL"
    return {
        "candidate": cand.provenance(), "beta_form": beta_form, "quick": quick, "strict": strict,
        "declared_unchanged": list(cand.unchanged), "verdict": verdict,
        "failed_families": [r.name for r in gating if not r.passed],
        "families": [{**r.__dict__, "passed": r.passed, "gating": r.required or strict} for r in rows],
        "wall_s": round(time.perf_counter() - t0, 2), "versions": _versions(),
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


HEADER = ("family", "required", "cases", "failures", "worst err/tol", "negatives", "NaN")


def table_rows(cert: Dict[str, Any]) -> List[List[str]]:
    return [[f["name"], "yes" if f["required"] else ("strict" if f["gating"] else "no"), str(f["cases"]),
             str(f["failures"]), _fmt_ratio(f["worst_ratio"]), str(f["negatives"]), str(f["nonfinite"])]
            for f in cert["families"]]


def render_text(cert: Dict[str, Any]) -> str:
    rows = [list(HEADER)] + table_rows(cert)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    c = cert["candidate"]
    head = (f"gkd-certify {c['name']}  sha256 {c['sha256'] or '-'}  beta_form={cert['beta_form']}"
            f"{'  --quick' if cert['quick'] else ''}{'  --strict' if cert['strict'] else ''}")
    tail = [f"verdict: {cert['verdict']}" + (f" (failed: {', '.join(cert['failed_families'])})"
                                             if cert["failed_families"] else "") + f"  [{cert['wall_s']} s]"]
    for f in cert["families"]:
        if f["failing"] and f["gating"]:
            first = f["failing"][0]
            tail.append(f"  {f['name']}: worst case {first['case']!r}: {first['note']}")
    return "\n".join([head] + lines + tail) + "\n"


def render_markdown(cert: Dict[str, Any]) -> str:
    c = cert["candidate"]
    out = [f"# GKD loss certificate: {c['name']}", "",
           f"- source: `{c['source']}`", f"- file: `{c['path']}`", f"- sha256: `{c['sha256']}`",
           f"- β form judged: {cert['beta_form']}; mode: {'quick' if cert['quick'] else 'full'}"
           f"{', strict' if cert['strict'] else ''}; ms-swift {cert['versions'].get('ms-swift')}, "
           f"torch {cert['versions'].get('torch')}",
           f"- declared unchanged vs upstream: {', '.join(cert['declared_unchanged']) or 'nothing'}",
           f"- **verdict: {cert['verdict']}**" + (f" (failed: {', '.join(cert['failed_families'])})"
                                                  if cert["failed_families"] else ""), "",
           "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    out += ["| " + " | ".join(r) + " |" for r in table_rows(cert)]
    out += ["", "References: the independent FP64 reference (harness/loss/reference.py); tolerance per case: value "
            "1e-5·|ref| + 1e-6·N, student-logit gradient rel-L2 1e-4 (+2× the dtype's own rounding for BF16/FP16 "
            "students) (harness/loss/tolerances.py). err/tol > 1 fails a case; bit-exact checks report 0 or inf."]
    failing = [(f["name"], x) for f in cert["families"] for x in f["failing"]]
    if failing:
        out += ["", "## Failing cases (worst first, up to 5 per family)", "", "| family | case | err/tol | note |",
                "|---|---|---|---|"]
        out += [f"| {n} | {x['case']} | {_fmt_ratio(x['ratio'])} | {x['note']} |" for n, x in failing]
    return "\n".join(out) + "\n"


def write(cert: Dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CERTIFICATE_MD).write_text(render_markdown(cert))
    (out_dir / CERTIFICATE_JSON).write_text(json.dumps(cert, indent=2, default=str,
                                                       allow_nan=True).replace("Infinity", "1e999"))


def build_parser() -> argparse.ArgumentParser:
    from harness.store.run_folder import harness_version

    p = argparse.ArgumentParser(
        prog="gkd-certify",
        description="The loss-level certificate of a candidate GKD loss fix, no training: every family runs "
                    "through the candidate's gkd_loss against the independent FP64 reference.",
        epilog="Exit codes: 0 every required family passes, 1 one fails, 2 unusable input. docs/certify.md.")
    p.add_argument("candidate", help="PATH.py | package.module[:attr] | fp32 | fp64 | native")
    p.add_argument("--name", help="label of the candidate (default: the file or module name)")
    p.add_argument("--beta-form", choices=("paper", "continuous"), default="paper",
                   help="the β form the candidate computes (default: paper, upstream's)")
    p.add_argument("--quick", action="store_true", help="a subset of every family (CI)")
    p.add_argument("--strict", action="store_true", help="the hard regimes gate the verdict too")
    p.add_argument("--unchanged", action="append", default=[], metavar="STUDENT/TEACHER",
                   help="dtype pair on which the candidate claims bit-identity with the installed ms-swift, e.g. "
                        "float32/float32 (repeatable; default: the file's GKD_CERTIFY_UNCHANGED)")
    p.add_argument("--family", action="append", default=[], help="only families whose name contains this")
    p.add_argument("--version", action="version", version=f"gkd-certify (gkd-harness {harness_version()})")
    p.add_argument("--out", type=Path, help=f"write {CERTIFICATE_MD} and {CERTIFICATE_JSON} here")
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    from harness.loss.candidate import CandidateError

    pairs = {"float32", "bfloat16", "float16", "float64"}
    for pair in args.unchanged:
        if len(pair.split("/")) != 2 or not set(x.strip() for x in pair.split("/")) <= pairs:
            print(f"gkd-certify: --unchanged {pair!r}: expected STUDENT/TEACHER from {sorted(pairs)}", file=sys.stderr)
            sys.exit(2)
    try:
        cand = _load(args.candidate, args.name, args.beta_form, args.unchanged)
    except CandidateError as e:
        print(f"gkd-certify: {e}", file=sys.stderr)
        sys.exit(2)
    cert = certify(cand, args.beta_form, args.quick, args.strict, args.family)
    if not cert["families"]:
        print(f"gkd-certify: no family matches {args.family}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(render_text(cert))
    if args.out:
        write(cert, args.out)
        print(f"wrote {args.out / CERTIFICATE_MD} and {args.out / CERTIFICATE_JSON}")
    sys.exit(0 if cert["verdict"] == "PASS" else 1)


if __name__ == "__main__":
    main()
