"""A seeded fuzz of ``gkd-train run.dry_run=true OVERRIDE`` (issue 48, item 1), run in-process.

:func:`overrides` draws hostile command-line overrides from the composed config's own keys and groups (unset
``${oc.env:...}``, ``${hydra:...}``, self and cross references, non-finite numbers, huge strings, terminal escapes,
bidi overrides, device files, system folders, new and deleted keys, unknown presets). :func:`outcome` runs one
through ``gkd_harness.harness.launcher.cli.main`` and classifies what happened:

* ``refused``: exit 2 and exactly one line on stderr, ``gkd-train: <label>: KEY: ...``, naming the override's own
  key (or, for a cross-field rule, naming it in the message; for a preset, its group);
* ``accepted``: exit 0 and the dry run's plan on stdout;
* anything else (a traceback, exit 1, several lines, a neighbouring key, a raw control character on the console)
  is ``other``, with the reason.

Also run by hand for the counts: ``python -m tests.harness.launcher.fuzz_overrides [N] [SEED]``.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import sys
from dataclasses import dataclass
from typing import List, Sequence

UNSET_ENV = "GKD_FUZZ_SURELY_UNSET"
#: where an override cannot be fuzzed (it must stay a dry run)
NOT_FUZZED = ("run.dry_run",)
GROUPS = ("loss", "model", "backend", "rollout", "tracking", "monitor", "experiment", "gkd", "signoff")

_VALUES = (
    "0",
    "-1",
    "7",
    "2147483648",
    "0.5",
    "-0.5",
    "1e309",
    "nan",
    "inf",
    "-inf",
    "true",
    "false",
    "null",
    "''",
    "abc",
    "fp33",
    "'a b'",
    "[]",
    "[1,2]",
    "{a: 1}",
    "'" + "a" * 5000 + "'",
    "${oc.env:" + UNSET_ENV + "}",
    "${oc.env:HOME}",
    "${hydra:runtime.cwd}",
    "${hydra:runtime.output_dir}",
    "${hydra:job.name}",
    "${gkd.beta}",
    "${run}",
    "${nope.nothing}",
    "${oc.decode:'[1'}",
    "/dev/zero",
    "/etc",
    "/",
    "../../..",
    "'\x1b]0;pwned\x07'",
    "'ab\u202ecd'",
    "'\x1b[31mred'",
)


def _keys() -> List[str]:
    """Every leaf key of the composed default config (Hydra's own node left out)."""
    from omegaconf import DictConfig

    from gkd_harness.harness.launcher.compose import compose

    master = compose([])
    keys: List[str] = []

    def walk(node, prefix: str) -> None:
        for k in node.keys():
            child = node._get_node(k)
            name = f"{prefix}{k}"
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_interpolation():
                walk(child, name + ".")
            else:
                keys.append(name)

    walk(master, "")
    return sorted(k for k in keys if not k.startswith("hydra") and k not in NOT_FUZZED)


def overrides(n: int = 320, seed: int = 48) -> List[str]:
    """``n`` seeded random overrides (the same list for the same ``n`` and ``seed``)."""
    rng = random.Random(seed)
    keys = _keys()
    out = []
    for _ in range(n):
        kind = rng.random()
        key = rng.choice(keys)
        value = rng.choice(_VALUES)
        if kind < 0.08:
            value = "${" + key + "}"  # a self reference
        elif kind < 0.16:
            key = rng.choice(GROUPS)  # a preset, real or not
            value = rng.choice(("fp33", "tiny", "none", "smoke", "null", "${gkd.beta}", "../x", value))
        elif kind < 0.22:
            key = "+" + rng.choice(("fuzz", "run.fuzz", "gkd.fuzz_key", "model.embedded.fuzz"))
        elif kind < 0.26:
            out.append("~" + key)
            continue
        out.append(f"{key}={value}")
    return out


@dataclass(frozen=True)
class Outcome:
    override: str
    kind: str  # refused | accepted | other
    why: str = ""


_ONE_LINE = re.compile(r"gkd-train: [a-z ]+: (?P<key>[^\s:]+): ")
#: what must never reach the console raw: C0 controls but newline, ESC included; DEL, C1; bidi overrides
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _override_key(override: str) -> str:
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def _names_it(named: str, line: str, key: str) -> bool:
    named = named.split("[", 1)[0]
    if named == key or named.startswith(key + ".") or key.startswith(named + ".") or named.startswith(key + "/"):
        return True
    return key in line.split(": ", 2)[-1]


def outcome(override: str) -> Outcome:
    """``gkd-train run.dry_run=true OVERRIDE`` in this process, classified."""
    from gkd_harness.harness.launcher.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    argv = sys.argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["run.dry_run=true", override])
    except SystemExit as e:
        code = e.code
    except BaseException as e:  # noqa: BLE001 - that is what the fuzz looks for
        return Outcome(override, "other", f"{type(e).__name__}: {str(e)[:200]}")
    finally:
        sys.argv = argv
    text_out, text_err = out.getvalue(), err.getvalue()
    if _RAW_CONTROL.search(text_out + text_err):
        return Outcome(override, "other", "a raw control character on the console")
    lines = text_err.strip().splitlines()
    if lines and any(x.startswith("Available options in") for x in lines):  # an unknown preset and its group's list
        lines = lines[: [x.startswith("Available options in") for x in lines].index(True)]
    if code in (0, None):
        if "# gkd-train dry run" in text_out:
            return Outcome(override, "accepted")
        return Outcome(override, "other", f"exit 0 without a plan: {text_err[-200:]!r}")
    if code != 2:
        return Outcome(override, "other", f"exit {code}: {text_err[-300:]!r}")
    if len(lines) != 1:
        return Outcome(override, "other", f"{len(lines)} lines: {text_err[-300:]!r}")
    m = _ONE_LINE.match(lines[0])
    if not m:
        return Outcome(override, "other", f"not one line naming a key: {lines[0][:200]!r}")
    if len(lines[0]) > 600:
        return Outcome(override, "other", f"a {len(lines[0])}-character line")
    if not _names_it(m.group("key"), lines[0], _override_key(override)):
        return Outcome(override, "other", f"names another key: {lines[0][:200]!r}")
    return Outcome(override, "refused")


def run(items: Sequence[str]) -> List[Outcome]:
    env = os.environ.pop("HYDRA_FULL_ERROR", None)
    os.environ.pop(UNSET_ENV, None)
    try:
        return [outcome(o) for o in items]
    finally:
        if env is not None:
            os.environ["HYDRA_FULL_ERROR"] = env


def counts(results: Sequence[Outcome]) -> dict:
    return {k: sum(r.kind == k for r in results) for k in ("refused", "accepted", "other")}


if __name__ == "__main__":  # pragma: no cover - the counts for a report
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 320
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    os.environ.setdefault("GKD_OUTPUT_ROOT", tempfile.mkdtemp(prefix="gkd-fuzz-"))
    os.chdir(tempfile.mkdtemp(prefix="gkd-fuzz-cwd-"))
    results = run(overrides(n, seed))
    for r in results:
        if r.kind == "other":
            print(f"OTHER {r.override[:80]!r}: {r.why}")
    print(counts(results))
