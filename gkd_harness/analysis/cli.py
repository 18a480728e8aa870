"""gkd-analyze: turn a sweep into a sign-off report and a verdict.

    gkd-analyze SWEEP --report DIR [--criteria FILE] [--source local|wandb|wandb-offline] [--group G] [--wandb]
                [--allow-mixed] [--junit PATH] [--summary PATH]
    gkd-analyze --verify REPORT_DIR [--criteria FILE] [SWEEP]

Exit codes: 0 the verdict is PASS; 1 the verdict is FAIL; 2 the input cannot be used (missing or corrupt files,
a bad criteria file, a bad --report folder, runs outside the sweep's plan, runs of two ms-swift versions,
rank-side codes or loss sources without --allow-mixed) or gkd-analyze itself failed. Every exit 2 prints one line saying why; --verbose adds the Python
traceback. --verify: 0 the report matches its run folders, 1 the first difference (one line), 2 unusable input.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Optional

from gkd_harness.harness.config.text import console_safe

__all__ = ["main"]

EXIT_UNUSABLE = 2  # = gkd_harness.analysis.signoff.report.EXIT_UNUSABLE (not imported here: --help stays fast)

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
     a --report folder holding what gkd-analyze did not write; runs outside
     the sweep's plan (sweep_manifest.json), runs of two ms-swift versions
     or rank-side codes, runs without provenance, or a variant with two
     loss sources, unless --allow-mixed) or an
     internal error; one line on stderr says why (--verbose adds the traceback)

--verify REPORT_DIR recomputes the verdict from the run folders the report
names (or from SWEEP) with the criteria given by --criteria (default: the
shipped ones): exit 0 when verdict.json, report.md's verdict, the runs'
metrics.jsonl / summary.json / config.yaml and the criteria all match; exit 1
naming the first difference.

examples:
  gkd-analyze outputs/multirun/smoke --report report
  gkd-analyze outputs/multirun/smoke --report report --criteria my_criteria.yaml
  gkd-analyze outputs/multirun/smoke --report report --source wandb-offline --group smoke
  gkd-analyze my-team/gkd-harness --source wandb --group smoke --report report
  gkd-analyze outputs/multirun/smoke --report report --junit report.xml --summary "$GITHUB_STEP_SUMMARY"
  gkd-analyze --verify report"""


def _parser() -> argparse.ArgumentParser:
    from gkd_harness.harness.store.provenance import version_line

    p = argparse.ArgumentParser(
        prog="gkd-analyze",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sweep",
        metavar="SWEEP",
        nargs="?",
        default=None,
        help="the sweep folder, the folder with wandb offline runs, or ENTITY/PROJECT (with --verify: "
        "where the runs are now, default: where verdict.json says they were)",
    )
    p.add_argument(
        "--out",
        "--report",
        dest="report",
        type=Path,
        metavar="DIR",
        help="report folder to write (created; an earlier report in it is replaced)",
    )
    p.add_argument(
        "--verify",
        type=Path,
        metavar="REPORT_DIR",
        default=None,
        help="recompute the verdict of an existing report from its run folders; exit 0 when everything "
        "matches, 1 naming the first difference",
    )
    p.add_argument(
        "--criteria",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML file of criteria values, merged over the shipped defaults "
        "(configs/signoff/default.yaml); unknown keys are an error",
    )
    p.add_argument(
        "--source",
        choices=("local", "wandb", "wandb-offline"),
        default="local",
        help="where the runs come from (default: local)",
    )
    p.add_argument(
        "--group",
        default=None,
        metavar="G",
        help="the sweep's wandb group; required with --source wandb, optional with wandb-offline",
    )
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also log the verdict, tables and plots as an analysis run in the sweep's wandb group",
    )
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="analyse runs of several groups, copies of one run id, runs outside the sweep's plan or differing "
        "in a training key it does not sweep, two ms-swift versions or rank-side codes, runs without "
        "provenance, or a variant with two loss sources together (refused otherwise: exit 2); recorded in "
        "verdict.json and shown in the banner",
    )
    p.add_argument(
        "--junit",
        type=Path,
        metavar="PATH",
        default=None,
        help="also write the verdict as JUnit XML, one test case per criterion (for CI test reports)",
    )
    p.add_argument(
        "--summary",
        type=Path,
        metavar="PATH",
        default=None,
        help='also append the verdict as a Markdown step summary (e.g. --summary "$GITHUB_STEP_SUMMARY")',
    )
    p.add_argument("--verbose", action="store_true", help="print the Python traceback of an error")
    p.add_argument("--quiet", action="store_true", help="no progress lines (they only show on a terminal anyway)")
    p.add_argument("--version", action="version", version=version_line("gkd-analyze"))
    return p


def _freeze_imported_heap() -> None:
    """In a gkd-analyze process of its own: import the report's modules (pandas and matplotlib are in by now;
    torch and the harness's loss variants, which the seed defect table and the FP64 β-curve run), then move every
    object alive now out of the cyclic garbage collector's reach (``gc.freeze``), so that each later full
    collection scans only what the report creates, not the ~250,000 objects of those modules. Measured on the
    200 x 2,000 sweep: full collections took 0.62 s of a ~11 s report before. Not done when ``main`` is called
    with arguments (a notebook, a test): there the frozen objects would stay until the process ends."""
    import gc

    import gkd_harness.harness.losses  # noqa: F401  (torch, ms-swift's loss: imported by the report anyway)

    gc.freeze()


def _missing_path(args) -> Optional[str]:
    """A local SWEEP or a --verify folder that does not exist, as the one line gkd-analyze prints (checked before
    anything heavy is imported); None when there is nothing to say."""
    if args.verify is not None and not args.verify.exists():
        return f"report folder {args.verify} does not exist"
    if args.sweep is not None and args.source in ("local", "wandb-offline") and not Path(args.sweep).exists():
        return f"sweep folder {args.sweep} does not exist"
    if args.verify is None and args.sweep is not None and args.report is None:
        return "give --report DIR (the report folder to write), or --verify REPORT_DIR"
    return None


def _run(args, own_process: bool = False) -> int:
    from gkd_harness.analysis.signoff.judge import judge, load_runs, margin_line, rests_on
    from gkd_harness.analysis.signoff.report import build_report
    from gkd_harness.analysis.sweep.records import UnusableInput
    from gkd_harness.harness.launcher.stage_lines import Stages

    if args.sweep is None or args.report is None:
        raise UnusableInput("give SWEEP and --report DIR (or --verify REPORT_DIR)")
    stage = Stages("gkd-analyze", 4 if args.wandb else 3, args.quiet).begin
    stage("loading the runs")
    sweep = load_runs(args.source, args.sweep, args.group)
    stage("judging the runs")
    j = judge(sweep, args.criteria, args.allow_mixed, label=args.sweep)
    if own_process:
        _freeze_imported_heap()
    stage("writing the report")
    result = build_report(j, args.report, source={"source": args.source, "sweep": args.sweep, "group": args.group})
    for c in result["criteria"]:
        print(console_safe(f"[{c['status']:>12}] {c['title']}: {c['measured']}", multiline=True))
    for name, why in result.get("failed_reasons", {}).items():
        print(console_safe(f"FAIL {name}: {why}", multiline=True))
    if args.allow_mixed and j.mixed:
        print(f"--allow-mixed: {'; '.join(j.mixed)}")
    rests = rests_on(j)
    print(
        console_safe(
            f"verdict: {result['verdict'].upper()} ({len(sweep.runs)} runs{margin_line(j)}"
            + (f"; not the shipped criteria: {rests}" if rests else "")
            + ") -> "
        )
        + console_safe(args.report / "report.md")
    )
    if args.junit is not None or args.summary is not None:
        from gkd_harness.analysis.signoff.ci import write_ci_files

        write_ci_files(result, args.junit, args.summary, args.report)
    if args.wandb:
        from gkd_harness.analysis.signoff.wandb_log import log_analysis_run, wandb_target

        stage("logging the analysis run to wandb")
        where = log_analysis_run(result, wandb_target(sweep), args.report, sweep)
        print(f"analysis run logged: {where}")
    return int(result["exit_code"])  # gkd_harness.analysis.signoff.verdict.EXIT_PASS or EXIT_FAIL


def _verify(args) -> int:
    """``--verify REPORT_DIR``: recompute the judgement from the run folders and their plan (the same
    :func:`gkd_harness.analysis.signoff.judge.judge` as gkd-analyze); 0 match, 1 the first difference."""
    from gkd_harness.analysis.signoff.judge import judge, load_runs
    from gkd_harness.analysis.signoff.verdict import (
        criteria_digest,
        first_difference,
        judgement,
        read_verdict,
        report_files_difference,
    )

    recorded = read_verdict(args.verify)
    inputs = recorded["inputs"]
    where = args.sweep or inputs.get("sweep")
    sweep = load_runs(inputs.get("source") or "local", where, inputs.get("group"))
    j = judge(sweep, args.criteria, bool(recorded.get("allow_mixed")), label=where)
    fresh = judgement(j)
    md, html = args.verify / "report.md", args.verify / "report.html"
    diff = first_difference(
        recorded,
        fresh,
        criteria_digest(j.cfg, args.criteria),
        md.read_text() if md.exists() else None,
        html.read_text() if html.exists() else None,
    ) or report_files_difference(recorded, args.verify)
    if diff is not None:
        print(console_safe(f"gkd-analyze --verify {args.verify}: DIFFERS: {diff}", multiline=True))
        return 1
    print(
        f"gkd-analyze --verify {console_safe(args.verify)}: matches: verdict {j.verdict.upper()} recomputed from "
        f"{len(sweep.runs)} runs ({sum(len(v) for v in fresh['run_files'].values())} run files) with the same "
        "criteria and plan; report.md and report.html unchanged"
    )
    return 0


def main(argv: Optional[list] = None) -> int:
    """Entry point of ``gkd-analyze``; returns the exit code (0 pass, 1 fail, 2 unusable input / error), also for
    ``--help`` / ``--version`` (0) and a usage error (2, after argparse's one line): a notebook's
    ``main([...])`` gets the code, never ``SystemExit``. Nothing heavy is imported before the arguments parse."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse's exits: --help, --version, a usage error
        return e.code if isinstance(e.code, int) else EXIT_UNUSABLE
    missing = _missing_path(args)
    if missing is not None:  # before anything heavy is imported: one line, at once
        print(f"gkd-analyze: unusable input: {console_safe(missing)}", file=sys.stderr)
        return EXIT_UNUSABLE
    from gkd_harness.analysis.sweep.records import UnusableInput

    try:
        return _verify(args) if args.verify is not None else _run(args, own_process=argv is None)
    except UnusableInput as e:
        print(f"gkd-analyze: unusable input: {console_safe(e, multiline=True)}", file=sys.stderr)
    except OSError as e:  # a report folder on a read-only or full disk: the path and the cause, not "internal error"
        from gkd_harness.harness.store.files import os_error_line

        print(f"gkd-analyze: unusable path: {console_safe(os_error_line(e))}", file=sys.stderr)
    except Exception as e:  # gkd-analyze's own failure: exit 2, never 1 (which means a FAIL verdict)
        hint = "" if args.verbose else " (--verbose shows the traceback)"
        print(
            f"gkd-analyze: internal error: {type(e).__name__}: {console_safe(e, multiline=True)}{hint}", file=sys.stderr
        )
        if args.verbose:
            traceback.print_exc()
    return EXIT_UNUSABLE


if __name__ == "__main__":
    sys.exit(main())
