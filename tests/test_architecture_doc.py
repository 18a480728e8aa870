"""docs/architecture.md lists every module under its layer ("Every module, by layer"), so the map cannot drift
from the tree: a module added, moved or deleted without its line fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
SECTION = "## Every module, by layer"
#: The packages the index covers (configs/ holds YAML, not modules).
PACKAGES = ("harness", "launch", "analysis", "bench")


def modules_on_disk(root: Path = REPO / "gkd_harness") -> set[str]:
    """``folder/name.py`` of every module of :data:`PACKAGES` (``__init__.py`` left out)."""
    return {
        p.relative_to(root).as_posix()
        for pkg in PACKAGES
        for p in (root / pkg).rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }


def modules_in_doc(text: str) -> set[str]:
    """``folder/name.py`` of every ``- `name.py`: ...`` line under a ``### `folder/` `` heading of :data:`SECTION`."""
    assert SECTION in text, f"{DOC}: no '{SECTION}' section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out, folder = set(), None
    for line in section.splitlines():
        heading = re.fullmatch(r"### `([\w/]+/)`", line.strip())
        if heading:
            folder = heading.group(1)
            continue
        item = re.match(r"- `([\w]+\.py)`: \S", line)
        if item:
            assert folder is not None, f"{DOC}: {line!r} before any folder heading"
            out.add(folder + item.group(1))
    return out


def index_drift(text: str, on_disk: set[str]) -> list[str]:
    """What the index lacks (``missing: ...``) and what it lists that is not there (``gone: ...``)."""
    listed = modules_in_doc(text)
    return [f"missing: {m}" for m in sorted(on_disk - listed)] + [f"gone: {m}" for m in sorted(listed - on_disk)]


def test_architecture_lists_every_module_under_its_layer():
    drift = index_drift(DOC.read_text(), modules_on_disk())
    assert not drift, f"{DOC.relative_to(REPO)} '{SECTION}' drifted:\n" + "\n".join(drift)


def test_the_index_check_sees_a_new_a_moved_and_a_deleted_module():
    text = DOC.read_text()
    on_disk = modules_on_disk()
    assert index_drift(text, on_disk | {"harness/loss/new_variant.py"}) == ["missing: harness/loss/new_variant.py"]
    moved = text.replace("- `proof.py`:", "- `proof_moved.py`:")
    assert index_drift(moved, on_disk) == ["missing: harness/loss/proof.py", "gone: harness/loss/proof_moved.py"]
    assert index_drift(text, on_disk - {"bench/cases.py"}) == ["gone: bench/cases.py"]
