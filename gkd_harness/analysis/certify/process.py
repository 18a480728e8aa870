"""The candidate in a process of its own: ``gkd-certify`` and the sign-off run every call of a candidate in a
spawned child, with a time bound on its import and on each family.

Whatever the candidate does to its process is evidence, never the judge's own exit: an exit (``os._exit``,
``sys.exit``) or a signal during a family, or a family that does not finish within its bound (the child is
killed), fails the certificate with one line saying what happened and where (:func:`certify_in_child` returns a
FAIL certificate holding the families that finished, ``process`` naming the event); the same at import refuses
the candidate (:class:`~gkd_harness.harness.loss.candidate.CandidateError`, exit 2). The child checks the global
torch state before and after the import (:func:`_import_row`); every call's is checked by the evaluation
(``evaluate._call``); ``torch.set_num_threads`` records its calls there, so that a candidate that sets the count the
judge already has (1) shows.

Messages, child to parent: ``("ready",)`` (torch, ms-swift and the harness imported: the candidate's import
begins), ``("refused", line)``, ``("loaded",)``, then :func:`~gkd_harness.analysis.certify.certificate.certify`'s
events ``("family", name, limit_s)``, ``("case", id)``, ``("row", family)``, and ``("done", certificate)``.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

#: Seconds the child may take to import torch, ms-swift and the harness (no candidate code runs yet).
STARTUP_S = 600.0
#: Seconds the candidate's import may take.
IMPORT_S = 120.0
#: The name of the row that judges the candidate's import.
IMPORT_ROW = "import (global torch state)"


class JudgeError(RuntimeError):
    """The child process failed before any candidate code ran (the judge's own problem, not the candidate's)."""


def _what(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def certify_in_child(
    spec: str,
    name: Optional[str],
    beta_form: str,
    unchanged: Sequence[str] = (),
    time_limit_s: Optional[float] = None,
    on_family: Optional[Callable[[str, bool], None]] = None,
    **options: Any,
) -> Dict[str, Any]:
    """The certificate of candidate ``spec`` (``PATH.py``, ``module[:attr]`` or a harness variant), computed in a
    spawned child. ``options``: :func:`~gkd_harness.analysis.certify.certificate.certify`'s. ``time_limit_s``:
    the bound on the import and on every family instead of their own (:data:`IMPORT_S`, ``Family.limit_s``).
    ``on_family(name, passed)``: called as each family's row arrives (gkd-certify's progress lines).

    Raises:
        CandidateError: the candidate is refused (cannot be loaded; exits, is killed or hangs while importing).
        JudgeError: the child failed before the candidate's import began.
    """
    from gkd_harness.analysis.certify.certificate import assemble, options_of
    from gkd_harness.harness.loss.candidate import CandidateError

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=_child, args=(send, spec, name, beta_form, tuple(unchanged), options), name="gkd-certify-candidate"
    )
    child.daemon = True
    child.start()
    send.close()
    rows: List[Dict[str, Any]] = []
    stage, limit, since, family, case = "start", STARTUP_S, time.monotonic(), "", ""
    t0 = time.monotonic()
    provenance: Dict[str, Any] = {"name": name or spec, "source": spec, "path": None, "sha256": None}
    try:
        while True:
            left = limit - (time.monotonic() - since)
            event: Optional[tuple] = None
            if left > 0 and receive.poll(min(left, 1.0)):
                try:
                    event = receive.recv()
                except EOFError:
                    event = ("gone",)
            elif left > 0 and child.is_alive():
                continue
            elif left > 0:
                event = ("gone",)
            if event is None:  # past the bound: a hang
                child.kill()
                child.join(10)
                what = f"did not finish within {limit:g} s and was killed"
                event = ("hung", what)
            kind = event[0]
            if kind == "ready":
                stage, limit, since = "import", time_limit_s or IMPORT_S, time.monotonic()
            elif kind == "refused":
                raise CandidateError(event[1])
            elif kind == "loaded":
                stage, provenance = "families", event[1]
            elif kind == "family":
                family, case, since = event[1], "", time.monotonic()
                limit = time_limit_s or event[2]
            elif kind == "case":
                case = event[1]
            elif kind == "row":
                rows.append(event[1])
                if on_family is not None:
                    on_family(rows[-1]["name"], bool(rows[-1]["passed"]))
            elif kind == "done":
                child.join(30)
                return event[1]
            else:  # the child is gone (exit, signal) or hung
                if kind == "gone":
                    child.join(10)
                    what = _what(child.exitcode)
                else:
                    what = event[1]
                if stage == "start":
                    raise JudgeError(f"gkd-certify's child process {what} before importing the candidate")
                if stage == "import":
                    raise CandidateError(f"{spec}: the candidate's process {what} while importing it")
                where = f"in family {family!r}" + (f", case {case!r}" if case else "")
                return assemble(
                    rows,
                    options_of(provenance, beta_form, unchanged, **options),
                    wall_s=time.monotonic() - t0,
                    process=f"{what} {where}",
                )
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
        receive.close()


def _import_row(changed: List[str]) -> Dict[str, Any]:
    """The row of the candidate's import: one case, failed when the import changed global torch state (every rank
    imports the candidate, so a change there is a change to the trainer)."""
    from gkd_harness.analysis.certify.evaluate import FamilyResult

    what = ", ".join(changed)
    row = FamilyResult(
        IMPORT_ROW,
        True,
        "the global torch state before and after importing the candidate",
        cases=1,
        failures=int(bool(changed)),
        worst_ratio=math.inf if changed else 0.0,
        negatives=0,
        nonfinite=0,
        failing=[
            {
                "case": "import the candidate",
                "ratio": math.inf,
                "note": f"changes global torch state at import: {what}",
                "cause": "global state",
                "repro": "",
            }
        ]
        if changed
        else [],
        seconds=0.0,
        severity="defect" if changed else "",
        cause=f"changes global torch state ({what}) at import: every rank imports the candidate; leave it as found"
        if changed
        else "",
    )
    return {**row.__dict__, "passed": row.passed, "gating": True}


def _child(conn, spec: str, name: Optional[str], beta_form: str, unchanged: tuple, options: Dict[str, Any]) -> None:
    """The child's body: import the candidate between two looks at the global torch state, then certify it,
    telling the parent each step."""

    from gkd_harness.analysis.certify.certificate import certify, load
    from gkd_harness.analysis.certify.evaluate import changed_state, torch_state, watch_threads
    from gkd_harness.harness.loss.candidate import CandidateError

    watch_threads()
    before = torch_state()
    conn.send(("ready",))
    try:
        cand = load(spec, name, beta_form, unchanged)
    except CandidateError as e:
        conn.send(("refused", str(e)))
        return
    changed = changed_state(before)  # restores what the import changed
    conn.send(("loaded", cand.provenance()))
    only = options.get("only") or ()
    first = [_import_row(changed)] if changed or not only or any(o.lower() in IMPORT_ROW for o in only) else []
    cert = certify(cand, beta_form, on_event=conn.send, first_rows=first, **options)
    conn.send(("done", cert))
    conn.close()
