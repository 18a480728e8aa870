"""pyproject.toml's pins (issue 47, item 12), read from the file: torch has the tested upper bound, mcore-bridge the
same cap in every extra, msgspec a range, and the bench extra does not repeat ms-swift's own trl requirement.
Before: ``torch>=2.6`` (a fresh 3.12 venv pulled 2.14.1, untested), ``mcore-bridge`` capped in ``gpu`` only,
``msgspec`` unpinned, ``bench = ["trl"]``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _req(name: str, reqs) -> Requirement:
    return next(r for r in map(Requirement, reqs) if r.name == name)


def test_torch_has_an_upper_bound_that_admits_the_ci_build():
    torch = _req("torch", PROJECT["dependencies"])
    assert any(s.operator == "<" for s in torch.specifier), torch
    ci = re.search(r'"torch==([\d.]+)"', (REPO / "launch" / "setup_env.sh").read_text()).group(1)
    assert Version(ci) in torch.specifier and Version("2.14.1") not in torch.specifier


def test_mcore_bridge_has_the_same_cap_in_every_extra():
    caps = {
        extra: str(_req("mcore-bridge", reqs).specifier)
        for extra, reqs in PROJECT["optional-dependencies"].items()
        if any(Requirement(r).name == "mcore-bridge" for r in reqs)
    }
    assert len(caps) >= 2 and len(set(caps.values())) == 1, caps
    assert "<" in next(iter(caps.values()))


def test_msgspec_is_pinned_to_a_range():
    msgspec = _req("msgspec", PROJECT["dependencies"])
    assert {s.operator for s in msgspec.specifier} >= {">=", "<"}, msgspec


def test_the_bench_extra_does_not_repeat_ms_swifts_trl():
    assert not [r for r in PROJECT["optional-dependencies"]["bench"] if Requirement(r).name == "trl"]
