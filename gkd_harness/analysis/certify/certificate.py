"""The certificate of a loaded candidate as data, and its text / markdown renderings (``gkd-certify`` and the
sign-off's ``candidate_certified`` both use it)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from gkd_harness.harness.contract import BUILTIN_PRECISIONS

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

BUILTINS = BUILTIN_PRECISIONS
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


def families_for(
    cand, strict: bool, only: Sequence[str] = (), search: Tuple[int, int, Optional[int]] = (0, 0, None)
) -> List[Any]:
    """The families to run: the required ones, the declared identity, the random search ``(seed, draws, only
    draw)`` and the hard regimes; ``only``: those whose name holds one of these substrings."""
    from gkd_harness.analysis.certify.families import HARD_FAMILIES, REQUIRED_FAMILIES, Family, identity_family
    from gkd_harness.analysis.certify.search import BUDGET_S, FAMILY, search_cases

    fams = list(REQUIRED_FAMILIES)
    if cand.unchanged:
        fams.append(identity_family(cand.unchanged))
    seed, draws, one = search
    if draws or one is not None:
        fams.append(
            Family(
                FAMILY,
                True,
                f"seed {seed}: {draws if one is None else 1} draws of dtype pair, mode, shape, V, k, β, T, mask and "
                f"row offsets (analysis/certify/search.py); stops at {BUDGET_S:g} s",
                search_cases(seed, draws, one),
                budget_s=BUDGET_S,
            )
        )
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
    search_seed: int = 0,
    search_draws: Optional[int] = None,
    search_draw: Optional[int] = None,
    speed: bool = True,
    on_family: Optional[Callable[[str, bool], None]] = None,
) -> Dict[str, Any]:
    """The certificate of a loaded candidate as plain data (what ``certificate.json`` holds).
    ``on_family(name, passed)``: called as each family is done (gkd-certify's progress lines).

    ``strict``: the hard regimes gate the verdict too, each case against ``bar`` (:data:`STRICT_BARS`).
    ``search_*``: the random search's seed, number of draws (default :data:`search.DRAWS`, 0: none) or one draw.
    ``speed``: time the candidate against upstream at a production size (:func:`speed_note`; reported only)."""
    import torch
    from swift.rlhf_trainers import gkd_loss as upstream

    from gkd_harness.analysis.certify.evaluate import run_family
    from gkd_harness.analysis.certify.search import DRAWS

    if bar not in STRICT_BARS:
        raise ValueError(f"bar: {bar!r}, expected one of {STRICT_BARS}")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    source = _source_text(cand)
    draws = DRAWS if search_draws is None else search_draws
    rows = []
    for f in families_for(cand, strict, only, (search_seed, draws, search_draw)):
        rows.append(
            run_family(
                cand.gkd_loss,
                f,
                beta_form,
                quick,
                upstream=upstream.gkd_loss,
                source=source,
                relative=strict and bar == "upstream" and not f.required,
                explain=f.required or strict,
            )
        )
        if on_family is not None:
            on_family(rows[-1].name, rows[-1].passed)
    gating = [r for r in rows if r.required or strict]
    verdict = "PASS" if all(r.passed for r in gating) else "FAIL"
    families = [{**r.__dict__, "passed": r.passed, "gating": r.required or strict} for r in rows]
    from gkd_harness.analysis.certify.causes import failure_pattern
    from gkd_harness.harness.store.provenance import harness_version

    return {
        "candidate": cand.provenance(),
        "beta_form": beta_form,
        "quick": quick,
        "strict": strict,
        "strict_bar": bar if strict else None,
        "only": list(only),
        "search": {"seed": search_seed, "draws": draws, "draw": search_draw},
        "declared_unchanged": list(cand.unchanged),
        "verdict": verdict,
        "failed_families": [r.name for r in gating if not r.passed],
        "families": families,
        "pattern": failure_pattern([f for f in families if f["gating"]]),
        "speed": speed_note(cand.gkd_loss, upstream.gkd_loss) if speed and not only else None,
        "wall_s": round(time.perf_counter() - t0, 2),
        "versions": _versions(),
        "harness_version": harness_version(),
    }


#: A candidate slower than upstream by more than this at a production size is reported as such.
SLOW_FACTOR = 5.0
#: The production sizes timed (forward and backward, FP32 student, BF16 teacher, full vocabulary): many positions
#: at a moderate vocabulary (a per-position loop shows here) and a few rows at Qwen's vocabulary.
SPEED_SHAPES = ((1, 1024, 512), (1, 4, 151_936))


def _best_time(fn, s, t, lab, repeats: int, stop_above: float = math.inf) -> float:
    """Best of ``repeats`` forward + backward times of ``fn`` on copies of ``s`` (NaN if it raises); stops early once
    a run took more than ``stop_above`` seconds."""
    best = math.inf
    for _ in range(repeats):
        x = s.detach().clone().requires_grad_(True)
        t0 = time.perf_counter()
        try:
            total, n = fn(x, t, lab, 0.5, 1.0)
            if total.requires_grad:
                (total / max(int(n), 1)).backward()
        except Exception:  # noqa: BLE001 - the families report it; no timing
            return math.nan
        best = min(best, time.perf_counter() - t0)
        if best > stop_above:
            break
    return best


def speed_note(fn, upstream_fn, repeats: int = 3) -> Dict[str, Any]:
    """``{"shapes": [...], "worst_ratio", "slow"}``: the candidate's best-of-``repeats`` time (forward and backward)
    over upstream's on the same inputs at each of :data:`SPEED_SHAPES`. Reported, never gating (a
    timing on a shared machine is not a verdict)."""

    from gkd_harness.analysis.certify.cases import problem

    out: List[Dict[str, Any]] = []
    for b, sq, v in SPEED_SHAPES:
        s, t, lab, _ = problem("fp32", "bf16", "full", 0.03, 7, batch=b, seq=sq, vocab=v, masked_prefix=0)
        best = {"upstream": _best_time(upstream_fn, s, t, lab, repeats)}
        # the candidate: best of ``repeats``, but one run already SLOW_FACTOR x 2 over upstream's is enough to say so
        best["candidate"] = _best_time(fn, s, t, lab, repeats, stop_above=2 * SLOW_FACTOR * best["upstream"])
        ratio = best["candidate"] / best["upstream"] if best["upstream"] > 0 else math.nan
        out.append(
            {
                "shape": f"[{b}, {sq}, {v}]",
                "candidate_s": round(best["candidate"], 4),
                "upstream_s": round(best["upstream"], 4),
                "ratio": round(ratio, 2),
            }
        )
    worst = max((float(x["ratio"]) for x in out if math.isfinite(x["ratio"])), default=math.nan)
    return {"shapes": out, "worst_ratio": worst, "slow": bool(worst > SLOW_FACTOR), "factor": SLOW_FACTOR}


def speed_line(speed: Optional[Dict[str, Any]]) -> str:
    if not speed or not math.isfinite(speed.get("worst_ratio", math.nan)):
        return ""
    worst = max(speed["shapes"], key=lambda x: x["ratio"] if math.isfinite(x["ratio"]) else -1)
    head = (
        f"SLOW: {worst['ratio']:.3g}x slower than upstream"
        if speed["slow"]
        else f"speed: {worst['ratio']:.3g}x upstream's time"
    )
    return (
        f"{head} at {worst['shape']} (forward + backward, best of 3: {worst['candidate_s']:.3g} s vs "
        f"{worst['upstream_s']:.3g} s; reported above {speed['factor']:g}x, never gating)"
    )


def _versions() -> Dict[str, Optional[str]]:
    from importlib.metadata import PackageNotFoundError, version

    out: Dict[str, Optional[str]] = {}
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
    return line + (f"; likely cause: {f['cause']}" if f.get("cause") else "; no recognised cause")


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
        if f.get("note"):
            tail.append(f"  {f['name']}: {f['note']}")
        for x in f["failing"]:
            if x.get("repro"):
                tail.append(f"  reproduce: gkd-certify {c['source']} {x['repro']}")
    if cert.get("pattern"):
        tail.append(f"  pattern: {cert['pattern']}")
    if speed_line(cert.get("speed")):
        tail.append(f"  {speed_line(cert.get('speed'))}")
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
        if cert.get("pattern"):
            out.append(f"- pattern: {cert['pattern']}")
        repro = [x["repro"] for f in cert["families"] for x in f["failing"] if x.get("repro")]
        out += [f"- reproduce: `gkd-certify {c['source']} {r}`" for r in repro]
    if speed_line(cert.get("speed")):
        out += ["", f"{speed_line(cert.get('speed'))}"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ one per sha256
def cache_path(sha256: str, beta_form: str, quick: bool, strict: bool, bar: str = "upstream") -> Path:
    """Where gkd-certify keeps the certificate of a file (sha256) for this harness version, the β form and the
    mode: ``$GKD_HARNESS_CACHE/certificates/<sha256>-<form>[-quick][-strict-<bar>]/<harness version>/``."""
    from gkd_harness.harness.contract import cache_dir
    from gkd_harness.harness.store.provenance import harness_version

    mode = f"{'-quick' if quick else ''}{f'-strict-{bar}' if strict else ''}"
    version = "".join(c if c.isalnum() or c in "._-+" else "_" for c in harness_version())
    return cache_dir() / "certificates" / f"{sha256}-{beta_form}{mode}" / version


def _whole(cert: Dict[str, Any]) -> bool:
    """A certificate of every family with the default search (what gkd-analyze would compute)."""
    from gkd_harness.analysis.certify.search import DRAWS

    search = cert.get("search") or {}
    return (
        not cert.get("only") and search.get("seed") == 0 and search.get("draws") == DRAWS and search.get("draw") is None
    )


def remember(cert: Dict[str, Any]) -> Optional[Path]:
    """Keep ``cert`` where :func:`recall` finds it (a whole certificate of a file with a sha256 only); the folder, or
    None. gkd-certify --out calls it, so gkd-analyze reuses the certificate instead of recomputing it."""
    sha = cert["candidate"].get("sha256")
    if not sha or not _whole(cert):
        return None
    folder = cache_path(sha, cert["beta_form"], cert["quick"], cert["strict"], cert.get("strict_bar") or "upstream")
    try:
        write(cert, folder)
    except OSError:
        return None
    return folder


def recall(
    sha256: str, beta_form: str, quick: bool, strict: bool, bar: str = "upstream", name: Optional[str] = None
) -> Optional[Dict[str, Any]]:
    """The certificate :func:`remember` kept for this sha256, β form, mode and harness version, or None. ``name``:
    the label the caller knows the file by (the sha256 is its identity, the name only a label)."""
    from gkd_harness.harness.store.provenance import harness_version

    path = cache_path(sha256, beta_form, quick, strict, bar) / CERTIFICATE_JSON
    try:
        cert = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = (
        cert.get("harness_version") == harness_version()
        and cert.get("candidate", {}).get("sha256") == sha256
        and cert.get("beta_form") == beta_form
        and bool(cert.get("quick")) == quick
        and bool(cert.get("strict")) == strict
        and _whole(cert)
    )
    if not same:
        return None
    cert["reused"] = str(path.parent)
    if name:
        cert["candidate"]["name"] = name
    return cert


def write(cert: Dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CERTIFICATE_MD).write_text(render_markdown(cert))
    (out_dir / CERTIFICATE_JSON).write_text(
        json.dumps(cert, indent=2, default=str, allow_nan=True).replace("Infinity", "1e999")
    )
