"""The notebook API: ``gkd_harness.train``, ``gkd_harness.analyze``, ``gkd_harness.certify`` (docs/python-api.md).

Each is the library call its command makes, returning data instead of an exit code: one training run
(``gkd-train`` without ``-m``), a sweep's verdict and report (``gkd-analyze``), a candidate's certificate
(``gkd-certify``). ``import gkd_harness`` imports none of this: the package resolves these names on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Sequence

__all__ = ["train", "analyze", "certify"]


def train(*overrides: str) -> Dict[str, Any]:
    """One training run, as ``gkd-train OVERRIDES`` (``run.dry_run=true`` prints the plan and trains nothing).

    Returns:
        the run's final ``summary.json`` content (``{"status": "dry_run"}`` for a dry run).

    Raises:
        ConfigError: an invalid config, naming the key (before any model loads).
        TrainingFailed: ms-swift failed, or the run did not meet the harness's checks.
    """
    from gkd_harness.harness.launcher.compose import compose_point
    from gkd_harness.harness.launcher.run import train as train_run

    point = compose_point(list(overrides))
    return train_run(point.cfg, experiment=point.experiment)


def analyze(
    sweep: str | Path,
    out: str | Path,
    source: str = "local",
    group: Optional[str] = None,
    criteria: Optional[str | Path] = None,
    allow_mixed: bool = False,
) -> Dict[str, Any]:
    """A sweep's sign-off, as ``gkd-analyze SWEEP --out DIR``: the report folder written, the result returned.

    Returns:
        ``verdict`` ("pass" | "fail"), ``criteria`` (one dict per criterion), ``exit_code`` and the rest of
        what ``verdict.json`` records.

    Raises:
        UnusableInput: the sweep cannot be judged (no runs, mixed groups without ``allow_mixed``, ...).
    """
    from gkd_harness.analysis.signoff.judge import judge, load_runs
    from gkd_harness.analysis.signoff.report import build_report

    criteria_file = Path(criteria) if criteria is not None else None
    runs = load_runs(source, str(sweep), group)
    j = judge(runs, criteria_file, allow_mixed, label=str(sweep))
    return build_report(j, Path(out), source={"source": source, "sweep": str(sweep), "group": group})


def certify(
    candidate: str,
    beta_form: str = "paper",
    quick: bool = False,
    strict: bool = False,
    families: Sequence[str] = (),
    out: Optional[str | Path] = None,
    name: Optional[str] = None,
    speed: bool = True,
) -> Dict[str, Any]:
    """A candidate loss's certificate, as ``gkd-certify CANDIDATE`` (a file, ``module:attr`` or a variant name).

    Returns:
        the certificate (``verdict`` "PASS" | "FAIL", ``families``, ...); written to ``out`` when given.
        ``families``: only the families whose name holds one of these substrings; ``speed``: time the candidate
        against upstream (reported only).

    Raises:
        CandidateError: the candidate cannot be loaded, or its process exits, is killed or hangs while importing.
        ValueError: no family matches ``families``.
    """
    from gkd_harness.analysis.certify.certificate import write
    from gkd_harness.analysis.certify.process import certify_in_child

    # the candidate's code runs in a spawned child, as in gkd-certify: its exit, hang or global state is evidence
    cert = certify_in_child(
        candidate, name, beta_form, (), quick=quick, strict=strict, only=tuple(families), speed=speed
    )
    if not cert["families"]:
        raise ValueError(f"families: no family matches {list(families)}")
    if out is not None:
        write(cert, Path(out))
    return cert
