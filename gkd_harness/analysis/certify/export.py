"""``gkd-certify --export-pytest PATH``: the regression suite (analysis/certify/suite.py) as one self-contained
pytest module, importing only torch, pytest, the standard library and the module under test.

The suite's source is read as a file (not imported: pytest is not needed to export) and copied with each
``# EXPORT:`` marker replaced: ``target`` sets ``TARGET`` (a module name, ``swift.rlhf_trainers.gkd_loss`` by
default, or a ``.py`` file); ``form`` sets ``FORM``, the β form the module judges (``--beta-form``); ``inline MODULE`` replaces the import on the next
line by that module's source (the FP64 reference ``harness/loss/reference.py``, the tolerances
``harness/loss/tolerances.py``: their one home stays there); ``inline MODULE:NAMES`` copies those top-level
definitions (the inputs' generator in ``analysis/certify/cases.py``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import List

from gkd_harness.harness.contract import BETA_FORMS, PAPER

DEFAULT_TARGET = "swift.rlhf_trainers.gkd_loss"
MARK = "# EXPORT:"


def _resolve_harness_imports(lines: List[str], name: str) -> List[str]:
    """An inlined module's own ``from gkd_harness.X import A, B`` lines, replaced by the values (constants) or the
    top-level definitions (functions, classes) they import, so the copy imports nothing of the harness."""
    out: List[str] = []
    for ln in lines:
        m = re.match(r"from (gkd_harness(?:\.\w+)+) import (.+)$", ln)
        if not m:
            out.append(ln)
            continue
        if m.group(2).strip().startswith("("):
            raise ValueError(f"{name}: a multi-line import of the harness cannot be inlined: {ln}")
        mod = importlib.import_module(m.group(1))
        for item in m.group(2).split("#")[0].split(","):
            parts = [x.strip() for x in item.split(" as ")]
            obj = getattr(mod, parts[0])
            if isinstance(obj, (str, int, float, bool, tuple, type(None))):
                out.append(f"{parts[-1]} = {obj!r}  # {m.group(1)}.{parts[0]}")
            elif parts[-1] == parts[0]:
                out.append(_definitions(m.group(1), [parts[0]]))
            else:
                raise ValueError(f"{name}: cannot inline {parts[0]} as {parts[-1]} from {m.group(1)}")
    return out


def _module_body(name: str) -> str:
    src = inspect.getsource(importlib.import_module(name))
    lines = _resolve_harness_imports([ln for ln in src.splitlines() if not ln.startswith("from __future__")], name)
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
        segment = ast.get_source_segment(src, node)
        if segment is not None and any(d in names for d in defined):
            out.append(segment)
    missing = set(names) - {n for seg in out for n in names if n in seg}
    if missing:
        raise ValueError(f"{name}: no top-level {sorted(missing)}")
    return f"# ---- {name}: {', '.join(names)} (copied from gkd-harness) ----\n" + "\n\n\n".join(out)


def _suite_source() -> str:
    """analysis/certify/suite.py's text, read as a file: importing it would need pytest, which the export does not
    (pytest is needed only where the exported module runs)."""
    spec = importlib.util.find_spec("gkd_harness.analysis.certify.suite")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("gkd_harness.analysis.certify.suite")
    return Path(spec.origin).read_text()


def render(target: str = DEFAULT_TARGET, beta_form: str = PAPER) -> str:
    """The suite's text for ``target``, judged in ``beta_form`` (``paper`` or ``continuous``)."""
    if beta_form not in BETA_FORMS:
        raise ValueError(f"beta_form: {beta_form!r}")
    lines = _suite_source().splitlines()
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
        elif mark == "form":
            out.append(f"FORM = {beta_form!r}")
        elif mark.startswith("inline "):
            spec = mark[len("inline ") :]
            mod, _, names = spec.partition(":")
            out.append(_definitions(mod, names.split(",")) if names else _module_body(mod))
            skip = True
        else:
            raise ValueError(f"unknown export marker {mark!r}")
    return "\n".join(out) + "\n"


def export_pytest(path: Path, target: str = DEFAULT_TARGET, beta_form: str = PAPER) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(target, beta_form))
    return path
