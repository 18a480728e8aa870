"""``gkd-certify --export-pytest PATH``: the regression suite (analysis/certify/suite.py) as one self-contained
pytest module, importing only torch, pytest, the standard library and the module under test.

The suite's source is copied with each ``# EXPORT:`` marker replaced: ``target`` sets ``TARGET`` (a module name,
``swift.rlhf_trainers.gkd_loss`` by default, or a ``.py`` file); ``inline MODULE`` replaces the import on the next
line by that module's source (the FP64 reference ``harness/loss/reference.py``, the tolerances
``harness/loss/tolerances.py``: their one home stays there); ``inline MODULE:NAMES`` copies those top-level
definitions (the inputs' generator in ``analysis/certify/cases.py``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

DEFAULT_TARGET = "swift.rlhf_trainers.gkd_loss"
MARK = "# EXPORT:"


def _module_body(name: str) -> str:
    src = inspect.getsource(importlib.import_module(name))
    lines = [ln for ln in src.splitlines() if not ln.startswith("from __future__")]
    return f"# ---- {name} (copied from gkd-harness) ----\n" + "\n".join(lines).strip("\n") + "\n# ---- end " + name


def _definitions(name: str, names) -> str:
    src = inspect.getsource(importlib.import_module(name))
    tree = ast.parse(src)
    out = []
    for node in tree.body:
        defined = (
            [node.name]
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            else [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(node, ast.Assign)
            else []
        )
        if any(d in names for d in defined):
            out.append(ast.get_source_segment(src, node))
    missing = set(names) - {n for seg in out for n in names if n in seg}
    if missing:
        raise ValueError(f"{name}: no top-level {sorted(missing)}")
    return f"# ---- {name}: {', '.join(names)} (copied from gkd-harness) ----\n" + "\n\n\n".join(out)


def render(target: str = DEFAULT_TARGET) -> str:
    """The suite's text for ``target``."""
    from gkd_harness.analysis.certify import suite

    lines = inspect.getsource(suite).splitlines()
    out, skip = [], False
    for ln in lines:
        if skip:  # the import line the marker replaces
            skip = False
            continue
        code, _, mark = ln.partition(MARK)
        mark = mark.strip()
        if not mark:
            out.append(ln)
        elif mark == "target":
            out.append(f"TARGET = {target!r}")
        elif mark.startswith("inline "):
            spec = mark[len("inline ") :]
            mod, _, names = spec.partition(":")
            out.append(_definitions(mod, names.split(",")) if names else _module_body(mod))
            skip = True
        else:
            raise ValueError(f"unknown export marker {mark!r}")
    return "\n".join(out) + "\n"


def export_pytest(path: Path, target: str = DEFAULT_TARGET) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(target))
    return path
