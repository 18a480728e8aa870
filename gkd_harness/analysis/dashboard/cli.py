"""gkd-dashboard: build the standard wandb workspace and sign-off report of a sweep.

    gkd-dashboard SWEEP --out spec.json          # no server: write the workspace and report specs as JSON
    gkd-dashboard SWEEP --push                   # save both to wandb (online, logged in) and print their URLs

SWEEP is a sweep folder (its run folders, and the wandb offline files inside them), a folder of wandb offline
runs (--source wandb-offline), or ENTITY/PROJECT (--source wandb, with --group). Panels whose metrics no run
logged are left out, with a note.

Exit codes: 0 the spec was written or the dashboard saved; 1 saving to wandb failed (not logged in, server
unreachable, no access); 2 unusable input (a missing or unreadable sweep, a bad criteria file, a bad option).
The sign-off verdict is shown in the report, not in the exit code (gkd-analyze gives that); it is gkd-analyze's
verdict, computed by the same function from the same runs and plan (gkd_harness.analysis.signoff.judge).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

__all__ = ["main", "EXIT_OK", "EXIT_PUSH_FAILED", "EXIT_UNUSABLE"]

EXIT_OK, EXIT_PUSH_FAILED, EXIT_UNUSABLE = 0, 1, 2


def _version() -> str:
    from gkd_harness.harness.store.provenance import harness_version

    return harness_version()


def _version_line() -> str:
    from gkd_harness.harness.store.provenance import version_line

    return version_line("gkd-dashboard")


def _parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(
        prog="gkd-dashboard",
        description="\n\n".join(doc[:3]),
        epilog="\n\n".join(doc[3:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep", metavar="SWEEP", help="sweep folder, folder of wandb offline runs, or ENTITY/PROJECT")
    p.add_argument("--out", type=Path, metavar="FILE", help="write the workspace and report specs to FILE (JSON)")
    p.add_argument("--push", action="store_true", help="save the workspace and the report to wandb, print URLs")
    p.add_argument(
        "--source", choices=("local", "wandb-offline", "wandb"), default="local", help="what SWEEP is (default: local)"
    )
    p.add_argument("--group", help="the sweep's wandb group (default: the runs' own; required with wandb)")
    p.add_argument("--experiment", help="experiment name to filter on (default: the runs' own)")
    p.add_argument("--entity", help="wandb entity (default: the runs' tracking.wandb.entity, WANDB_ENTITY)")
    p.add_argument("--project", help="wandb project (default: the runs' tracking.wandb.project, WANDB_PROJECT)")
    p.add_argument(
        "--criteria",
        type=Path,
        metavar="FILE",
        help="criteria YAML merged over configs/signoff/default.yaml (tolerance lines, verdict)",
    )
    p.add_argument("--name", help="workspace name (default: 'gkd-harness GROUP')")
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="judge runs that are not one comparison together (runs outside the plan, several groups, ...), "
        "as gkd-analyze --allow-mixed; refused otherwise (exit 2)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines (they only show on a terminal anyway)")
    p.add_argument("--verbose", action="store_true", help="print the Python traceback of an error")
    p.add_argument("--version", action="version", version=_version_line())
    return p


def missing_path(args) -> Optional[str]:
    """A path argument that does not exist, as one line, checked before the heavy imports (wandb-workspaces,
    pandas, the sign-off): a missing sweep is refused in well under a second."""
    if args.source != "wandb" and not Path(args.sweep).exists():
        return f"sweep folder {args.sweep} does not exist"
    if args.criteria is not None and not args.criteria.is_file():
        return f"--criteria {args.criteria}: no such file"
    return None


def _facts(args):
    from gkd_harness.analysis.dashboard.facts import facts_from_folder, facts_from_wandb
    from gkd_harness.analysis.sweep.records import UnusableInput

    if args.source == "wandb":
        if not args.group:
            raise UnusableInput("--source wandb needs --group (the sweep's wandb group)")
        return facts_from_wandb(args.sweep, args.group, args.experiment)
    return facts_from_folder(args.sweep, args.source, args.group, args.experiment, args.project, args.entity)


def main(argv: Optional[list] = None) -> int:
    args = _parser().parse_args(argv)
    if not args.out and not args.push:
        _parser().error("give --out FILE, --push, or both")
    missing = missing_path(args)
    if missing:
        print(f"gkd-dashboard: unusable input: {missing}", file=sys.stderr)
        return EXIT_UNUSABLE
    return _build(args)


def _unusable(e: Exception, verbose: bool) -> int:
    if verbose:
        import traceback

        traceback.print_exc()
    print(f"gkd-dashboard: unusable input: {e}", file=sys.stderr)
    return EXIT_UNUSABLE


def _build(args) -> int:
    from gkd_harness.analysis.dashboard.build import build_report, build_workspace, push, spec_dict
    from gkd_harness.analysis.dashboard.panels import keep_available, standard_sections
    from gkd_harness.analysis.signoff.criteria import load_criteria
    from gkd_harness.analysis.signoff.judge import judge, load_runs
    from gkd_harness.analysis.sweep.records import UnusableInput
    from gkd_harness.harness.launcher.stage_lines import Stages

    stage = Stages("gkd-dashboard", 4 if args.push and args.out else 3, args.quiet).begin
    try:
        stage("reading the runs' metrics")
        criteria = load_criteria(args.criteria)
        facts = _facts(args)
    except UnusableInput as e:
        return _unusable(e, args.verbose)
    if args.entity and args.source == "wandb":
        facts.entity = args.entity
    if args.project and args.source == "wandb":
        facts.project = args.project
    for note in facts.notes:
        print(f"note: {note}", file=sys.stderr)
    sections, left_out = keep_available(standard_sections(criteria), facts.metric_keys)
    for note in left_out:
        print(f"left out: {note}", file=sys.stderr)
    try:  # the verdict of gkd-analyze: the same runs, the same plan, the same criteria, computed in one place
        stage("judging the runs (gkd-analyze's verdict)")
        judged = judge(load_runs(args.source, args.sweep, args.group), args.criteria, args.allow_mixed, args.sweep)
    except UnusableInput as e:
        return _unusable(e, args.verbose)
    verdict, results = judged.verdict, judged.results
    n_judged = len(judged.sweep.runs)
    workspace = build_workspace(sections, facts, args.name)
    n_panels = sum(len(s.panels) for s in sections)
    if args.out:
        stage("building the workspace and report specs")
        report = build_report(sections, facts, verdict, results, with_project=False)
        spec = spec_dict(workspace, report, sections, facts, left_out, verdict, results, _version())
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(spec, indent=1, allow_nan=False) + "\n")
        except OSError as e:
            print(f"gkd-dashboard: cannot write {args.out}: {e}", file=sys.stderr)
            return EXIT_UNUSABLE
        print(
            f"spec: {n_panels} panels in {len(sections)} sections, {facts.n_runs} runs of group "
            f"{facts.group}, verdict {verdict.upper()} ({n_judged} runs judged, as gkd-analyze) -> {args.out}"
        )
    if args.push:
        if not facts.entity:
            try:
                import wandb

                facts.entity = wandb.Api().default_entity
            except Exception as e:  # noqa: BLE001 - not logged in, unreachable
                print(
                    f"gkd-dashboard: cannot reach wandb to find your entity ({e}); log in "
                    "(`wandb login`) or pass --entity",
                    file=sys.stderr,
                )
                return EXIT_PUSH_FAILED
            workspace = build_workspace(sections, facts, args.name)
        try:
            stage("saving the workspace and report to wandb")
            report = build_report(sections, facts, verdict, results, with_project=True)
            ws_url, report_url = push(workspace, report)
        except Exception as e:  # noqa: BLE001 - auth, network, permissions: one line, exit 1
            print(f"gkd-dashboard: saving to wandb {facts.entity}/{facts.project} failed: {e}", file=sys.stderr)
            return EXIT_PUSH_FAILED
        print(f"workspace: {ws_url}")
        print(f"report: {report_url}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
