"""The docs say plainly that a candidate's code runs with the caller's rights (issue 48, item 7): before,
docs/certify.md said only that a candidate is "imported by path", and nothing said that ``loss.source`` runs the
file's code in ``gkd-certify`` and in every training rank."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", ["certify.md", "own-models.md"])
def test_the_docs_say_a_candidate_runs_with_your_rights(name):
    text = " ".join((DOCS / name).read_text().split())
    assert "runs with your rights" in text or "runs as the user who started the command" in text
    assert "every training rank" in text and "gkd-certify" in text and "does not sandbox it" in text
