"""``gkd-certify CANDIDATE``: the loss-level certificate of a candidate fix, no training.

CANDIDATE is a file with ms-swift's ``gkd_loss.py`` interface (``PATH.py``, e.g. a pull request's file), an
importable ``package.module[:attr]`` (``swift.rlhf_trainers.gkd_loss`` is the installed upstream), or one of the
harness's own variants (``fp32``, ``fp64``, ``native``). Every family runs through the candidate's ``gkd_loss``
against the project's independent FP64 reference (``gkd_harness.harness.loss.reference``) with the suite's tolerances
(``gkd_harness.harness.loss.tolerances``).

Exit codes: 0 every required family passes (with ``--strict``: the hard regimes too), 1 one fails, 2 unusable
input (a candidate that cannot be loaded, a bad argument).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from gkd_harness.analysis.certify.certificate import (
    CERTIFICATE_JSON,
    CERTIFICATE_MD,
    STRICT_BARS,
    remember,
    render_text,
    write,
)
from gkd_harness.harness.contract import BETA_FORMS, DTYPE_NAMES


def build_parser() -> argparse.ArgumentParser:
    from gkd_harness.harness.store.provenance import version_line

    p = argparse.ArgumentParser(
        prog="gkd-certify",
        description="The loss-level certificate of a candidate GKD loss fix, no training: every family runs "
        "through the candidate's gkd_loss against the independent FP64 reference.",
        epilog="Exit codes: 0 every required family passes, 1 one fails, 2 unusable input. docs/certify.md.",
    )
    p.add_argument("candidate", nargs="?", help="PATH.py | package.module[:attr] | fp32 | fp64 | native")
    p.add_argument("--name", help="label of the candidate (default: the file or module name)")
    p.add_argument(
        "--beta-form",
        choices=BETA_FORMS,
        default="paper",
        help="the β form the candidate computes (default: paper, upstream's)",
    )
    p.add_argument("--quick", action="store_true", help="a subset of every family (CI)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="the hard regimes gate the verdict too: a case fails only where the candidate is worse than "
        "upstream's own formula computed in FP32 on the same inputs",
    )
    p.add_argument(
        "--strict-bar",
        choices=STRICT_BARS,
        default="upstream",
        help="with --strict: 'upstream' (default) or 'tolerance' (the suite's tolerance, the harness's own bar)",
    )
    p.add_argument(
        "--unchanged",
        action="append",
        default=[],
        metavar="STUDENT/TEACHER",
        help="dtype pair on which the candidate claims bit-identity with the installed ms-swift, e.g. "
        "float32/float32 (repeatable; default: the file's GKD_CERTIFY_UNCHANGED)",
    )
    p.add_argument("--family", action="append", default=[], help="only families whose name contains this")
    p.add_argument("--search-seed", type=int, default=0, metavar="SEED", help="the random search's seed (default 0)")
    p.add_argument(
        "--search-draws",
        type=int,
        default=None,
        metavar="N",
        help="the random search's number of draws, every one run on every machine (default 48, --quick 24; 0: no "
        "search)",
    )
    p.add_argument(
        "--search-draw", type=int, default=None, metavar="I", help="run only draw I of the search (a reproduction)"
    )
    p.add_argument(
        "--no-speed", action="store_true", help="skip timing the candidate against upstream at a production size"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="S",
        help="the bound, in seconds, on the candidate's import and on each family in its child process (default: "
        "120 s for the import, each family's own); past it the child is killed and the certificate fails",
    )
    p.add_argument("--version", action="version", version=version_line("gkd-certify"))
    p.add_argument("--quiet", action="store_true", help="no line per family (they only show on a terminal anyway)")
    p.add_argument("--verbose", action="store_true", help="print the Python traceback of an unusable candidate")
    p.add_argument("--out", type=Path, help=f"write {CERTIFICATE_MD} and {CERTIFICATE_JSON} here")
    p.add_argument(
        "--export-pytest",
        type=Path,
        metavar="PATH",
        help="write the regression suite as one self-contained pytest module (imports only torch, pytest, "
        "the standard library and --target) and exit; no CANDIDATE needed",
    )
    p.add_argument(
        "--target",
        default=None,
        metavar="MODULE|PATH.py",
        help="with --export-pytest: the module under test (default swift.rlhf_trainers.gkd_loss)",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.export_pytest is not None:
        from gkd_harness.analysis.certify.export import DEFAULT_TARGET, export_pytest, left_out_line

        path = export_pytest(args.export_pytest, args.target or DEFAULT_TARGET, args.beta_form, args.search_seed)
        print(f"wrote {path} (target {args.target or DEFAULT_TARGET}, beta form {args.beta_form})")
        print(left_out_line())
        sys.exit(0)
    if args.candidate is None:
        print("gkd-certify: CANDIDATE: required (or --export-pytest PATH)", file=sys.stderr)
        sys.exit(2)
    if args.target is not None:
        print("gkd-certify: --target: only with --export-pytest", file=sys.stderr)
        sys.exit(2)
    from gkd_harness.harness.launcher.stage_lines import Stages, family_line
    from gkd_harness.harness.loss.candidate import CandidateError

    pairs = set(DTYPE_NAMES)
    for pair in args.unchanged:
        if len(pair.split("/")) != 2 or not set(x.strip() for x in pair.split("/")) <= pairs:
            print(f"gkd-certify: --unchanged {pair!r}: expected STUDENT/TEACHER from {sorted(pairs)}", file=sys.stderr)
            sys.exit(2)
    for key in ("search_draws", "search_draw", "time_limit"):
        if getattr(args, key) is not None and getattr(args, key) < 0:
            print(f"gkd-certify: --{key.replace('_', '-')} {getattr(args, key)}: must be >= 0", file=sys.stderr)
            sys.exit(2)
    from gkd_harness.analysis.certify.process import JudgeError, certify_in_child

    try:
        cert = certify_in_child(
            args.candidate,
            args.name,
            args.beta_form,
            args.unchanged,
            time_limit_s=args.time_limit or None,
            quick=args.quick,
            strict=args.strict,
            only=args.family,
            bar=args.strict_bar,
            search_seed=args.search_seed,
            search_draws=args.search_draws,
            search_draw=args.search_draw,
            speed=not args.no_speed,
            on_family=family_line(Stages("gkd-certify", quiet=args.quiet)),
        )
    except CandidateError as e:
        if args.verbose:
            raise
        print(f"gkd-certify: {e}", file=sys.stderr)
        sys.exit(2)
    except JudgeError as e:
        print(f"gkd-certify: {e}", file=sys.stderr)
        sys.exit(2)
    if not cert["families"] and not cert.get("process"):
        print(f"gkd-certify: no family matches {args.family}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.write(render_text(cert))
    if args.out:
        write(cert, args.out)
        print(f"wrote {args.out / CERTIFICATE_MD} and {args.out / CERTIFICATE_JSON}")
        kept = remember(cert)
        if kept is not None:
            print(f"kept for gkd-analyze (same sha256 and harness version): {kept}")
    sys.exit(0 if cert["verdict"] == "PASS" else 1)


if __name__ == "__main__":
    main()
