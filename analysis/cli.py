"""gkd-analyze: turn a sweep into a sign-off report and a verdict.

    gkd-analyze SWEEP --report DIR [--criteria FILE] [--source local|wandb|wandb-offline] [--group G] [--wandb]

Exit codes: 0 the verdict is PASS; 1 the verdict is FAIL; 2 the input cannot be used (missing or corrupt files,
a bad criteria file, a bad --report folder) or gkd-analyze itself failed. Every exit 2 prints one line saying
why; --verbose adds the Python traceback.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Optional

from analysis.sweep.records import UnusableInput

__all__ = ["main"]

EXIT_UNUSABLE = 2  # = analysis.signoff.report.EXIT_UNUSABLE (not imported here: --help stays fast)

_DESCRIPTION = """\
Read the runs of one sweep, check them against the sign-off criteria, and write
a report folder: report.md, report.html (the same report in one self-contained
file), the plots as PNG files, and verdict.json. The folder is written
completely or not at all; an earlier report in it is replaced.

SWEEP is one of:
  a sweep folder of run folders, as gkd-train writes them (--source local,
    the default);
  a folder holding wandb offline runs (--source wandb-offline); all attempts
    of one run (a resumed run) count as one run;
  ENTITY/PROJECT on a wandb server (--source wandb, with --group)."""

_EPILOG = """\
exit codes:
  0  verdict PASS: every required criterion passed
  1  verdict FAIL: a required criterion failed or had nothing to measure
     (the report says which)
  2  unusable input (missing sweep, corrupt run files, bad criteria file,
     bad --report folder) or an internal error; one line on stderr says why
     (--verbose adds the traceback)

examples:
  gkd-analyze outputs/multirun/smoke --report report
  gkd-analyze outputs/multirun/smoke --report report --criteria my_criteria.yaml
  gkd-analyze outputs/multirun/smoke --report report --source wandb-offline --group smoke
  gkd-analyze my-team/gkd-harness --source wandb --group smoke --report report"""


def _version() -> str:
    from harness.store.provenance import harness_version

    return harness_version()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gkd-analyze", description=_DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", metavar="SWEEP", help="the sweep folder, the folder with wandb offline runs, or ENTITY/PROJECT")
    p.add_argument("--report", required=True, type=Path, metavar="DIR",
                   help="report folder to write (created; an earlier report in it is replaced)")
    p.add_argument("--criteria", type=Path, default=None, metavar="FILE",
                   help="a YAML file of criteria values, merged over the shipped defaults "
                        "(configs/signoff/default.yaml); unknown keys are an error")
    p.add_argument("--source", choices=("local", "wandb", "wandb-offline"), default="local",
                   help="where the runs come from (default: local)")
    p.add_argument("--group", default=None, metavar="G",
                   help="the sweep's wandb group; required with --source wandb, optional with wandb-offline")
    p.add_argument("--wandb", action="store_true",
                   help="also log the verdict, tables and plots as an analysis run in the sweep's wandb group")
    p.add_argument("--allow-mixed", action="store_true",
                   help="analyse runs of several groups, or several copies of one run id, together (refused "
                        "otherwise: exit 2)")
    p.add_argument("--verbose", action="store_true", help="print the Python traceback of an error")
    p.add_argument("--version", action="version", version=f"gkd-analyze (gkd-harness {_version()})")
    return p


def _load(args):
    from analysis.sweep.offline import load_wandb_offline
    from analysis.sweep.runs import load_sweep
    from analysis.sweep.wandb_api import load_wandb_sweep

    if args.source == "local":
        return load_sweep(args.sweep)
    if args.source == "wandb-offline":
        return load_wandb_offline(args.sweep, args.group)
    if not args.group:
        raise UnusableInput("--source wandb needs --group (the sweep's wandb group)")
    return load_wandb_sweep(args.sweep, args.group)


def _run(args) -> int:
    from analysis.signoff.report import build_report
    from analysis.signoff.criteria_file import load_criteria

    from analysis.sweep.records import mixed_sweep_problems

    cfg = load_criteria(args.criteria)
    sweep = _load(args)
    mixed = mixed_sweep_problems(sweep)
    if mixed and not args.allow_mixed:
        raise UnusableInput(f"{args.sweep} is not one sweep: {'; '.join(mixed)} (--allow-mixed analyses them "
                            "together)")
    result = build_report(sweep, args.report, cfg)
    for c in result["criteria"]:
        print(f"[{c['status']:>12}] {c['title']}: {c['measured']}")
    for name, why in result.get("failed_reasons", {}).items():
        print(f"FAIL {name}: {why}")
    print(f"verdict: {result['verdict'].upper()} ({len(sweep.runs)} runs) -> {args.report / 'report.md'}")
    if args.wandb:
        from analysis.signoff.wandb_log import log_analysis_run, wandb_target

        where = log_analysis_run(result, wandb_target(sweep), args.report)
        print(f"analysis run logged: {where}")
    return int(result["exit_code"])  # analysis.signoff.report.EXIT_PASS or EXIT_FAIL


def main(argv: Optional[list] = None) -> int:
    """Entry point of ``gkd-analyze``; returns the exit code (0 pass, 1 fail, 2 unusable input / error)."""
    args = _parser().parse_args(argv)  # a usage error exits 2 (argparse)
    try:
        return _run(args)
    except UnusableInput as e:
        print(f"gkd-analyze: unusable input: {e}", file=sys.stderr)
    except Exception as e:  # gkd-analyze's own failure: exit 2, never 1 (which means a FAIL verdict)
        hint = "" if args.verbose else " (--verbose shows the traceback)"
        print(f"gkd-analyze: internal error: {type(e).__name__}: {e}{hint}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
    return EXIT_UNUSABLE

if __name__ == "__main__":
    sys.exit(main())
