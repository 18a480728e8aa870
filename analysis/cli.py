"""``gkd-analyze``: a sweep -> sign-off report and verdict.

    gkd-analyze SWEEP --report DIR [--wandb] [--criteria FILE] [--source local|wandb|wandb-offline] [--group G]

SWEEP is a sweep folder of run folders (``--source local``, the default), a folder holding wandb offline runs
(``--source wandb-offline``), or ``ENTITY/PROJECT`` for the wandb public API (``--source wandb --group G``).
Exit code: 0 pass, 1 fail, 2 unusable input (the message names the file or key).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from analysis.load import UnusableInput

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gkd-analyze", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="sweep folder (local), folder with wandb offline runs, or ENTITY/PROJECT (wandb)")
    p.add_argument("--report", required=True, type=Path, help="folder to write report.md/.html, PNGs, verdict.json")
    p.add_argument("--criteria", type=Path, default=None,
                   help="criteria YAML merged over configs/signoff/default.yaml")
    p.add_argument("--source", choices=("local", "wandb", "wandb-offline"), default="local")
    p.add_argument("--group", default=None, help="wandb group (required with --source wandb)")
    p.add_argument("--wandb", action="store_true",
                   help="also log the verdict, tables and plots to an analysis run (job_type=analysis) in the group")
    return p


def _load(args):
    from analysis.load import load_sweep, load_wandb_offline, load_wandb_sweep

    if args.source == "local":
        return load_sweep(args.sweep)
    if args.source == "wandb-offline":
        return load_wandb_offline(args.sweep, args.group)
    if not args.group:
        raise UnusableInput("--source wandb needs --group (the sweep's wandb group)")
    return load_wandb_sweep(args.sweep, args.group)


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    from analysis.criteria import load_criteria
    from analysis.signoff import EXIT_UNUSABLE, build_report

    try:
        cfg = load_criteria(args.criteria)
        sweep = _load(args)
    except UnusableInput as e:
        print(f"gkd-analyze: unusable input: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    result = build_report(sweep, args.report, cfg)
    for c in result["criteria"]:
        print(f"[{c['status']:>12}] {c['title']}: {c['measured']}")
    print(f"verdict: {result['verdict'].upper()} ({len(sweep.runs)} runs) -> {args.report / 'report.md'}")
    if args.wandb:
        from analysis.wandb_log import log_analysis_run, wandb_target

        where = log_analysis_run(result, wandb_target(sweep), args.report)
        print(f"analysis run logged: {where}")
    return int(result["exit_code"])


if __name__ == "__main__":
    sys.exit(main())
