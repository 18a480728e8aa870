"""``gkd-certify --export-pytest PATH``: the certificate as one self-contained pytest module (analysis/certify/suite.py
is its template), importing only torch, numpy, pytest, the standard library and the module under test.

The export is the certificate, minus what it cannot run. The certificate's own modules (``EMBEDDED_ROOTS`` and
every harness module they import at the top, or anywhere inside the certify package) are copied into the module as
source text and imported there under a package name of its own, so its cases are the certificate's families and
search draws (whatever they are when it is exported: a new family flows in), judged by the certificate's own
``evaluate``. ``LEFT_OUT`` (the one place) names what it leaves out, and why.

The template's ``# EXPORT:`` markers are replaced: ``target`` (``TARGET``: a module name,
``swift.rlhf_trainers.gkd_loss`` by default, or a ``.py`` file), ``form`` (``FORM``, the β form judged), ``search-seed``,
``left-out``, ``sources`` (the embedded modules) and ``target-names`` (names a module imports from ms-swift's loss
file, bound to the target's). The template is read as a file (not imported: pytest is not needed to export).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from typing import Dict, List, Tuple

from gkd_harness.analysis.certify.families import IDENTITY_FAMILY
from gkd_harness.harness.contract import BETA_FORMS, PAPER

DEFAULT_TARGET = "swift.rlhf_trainers.gkd_loss"
MARK = "# EXPORT:"
HARNESS = __name__.split(".")[0]  # the installed namespace (gkd_harness)
#: ms-swift's loss file: names the embedded modules import from it are the target's (its ``TeacherOutput``).
UPSTREAM_MODULE = "swift.rlhf_trainers.gkd_loss"
#: The certificate's family list (``certificate.families_for``), its families, its search and its judge.
EMBEDDED_ROOTS = (
    "gkd_harness.analysis.certify.certificate",
    "gkd_harness.analysis.certify.families",
    "gkd_harness.analysis.certify.search",
    "gkd_harness.analysis.certify.evaluate",
)
#: Imports inside functions are followed only within this package (the rest of the harness is never run there).
FOLLOW_INSIDE = "gkd_harness.analysis.certify"
#: What the certificate runs and the exported module does not, and why (printed by the export, written into the
#: module). Besides these, by rule: the hard regimes (families that gate only under ``--strict``) and the speed
#: note (a timing, never gating).
LEFT_OUT: Dict[str, str] = {
    IDENTITY_FAMILY: "bit-identity with the installed ms-swift on the pairs a candidate declares: the exported "
    "module has only the module under test, nothing to compare it with",
}
LEFT_OUT_BY_RULE = (
    "the hard regimes (they gate only under --strict)",
    "the speed note (a timing, never gating)",
)


def left_out_line() -> str:
    """One line: what the exported module leaves out."""
    return "left out: " + "; ".join([f"{k} ({v})" for k, v in LEFT_OUT.items()] + list(LEFT_OUT_BY_RULE))


# ------------------------------------------------------------------------------------------------ the modules
def _source(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(name)
    return Path(spec.origin).read_text()


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _imports(name: str, src: str) -> List[str]:
    """The harness modules ``name`` imports: at its top level, and inside functions when within FOLLOW_INSIDE."""
    tree = ast.parse(src)
    top = {id(n) for n in tree.body}
    out: List[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(HARNESS + ".")):
            continue
        if id(node) not in top and not node.module.startswith(FOLLOW_INSIDE):
            continue
        out.append(node.module)
        out += [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
    return out


def embedded_modules() -> Dict[str, str]:
    """``{harness module name: its source}``: ``EMBEDDED_ROOTS`` and what they import (:func:`_imports`)."""
    todo, seen = list(EMBEDDED_ROOTS), {}
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen[name] = _source(name)
        todo += [m for m in _imports(name, seen[name]) if m not in seen]
    return seen


_UPSTREAM_IMPORT = re.compile(rf"^from {re.escape(UPSTREAM_MODULE)} import ([\w, ]+)$")


def rewrite(src: str) -> Tuple[str, List[str]]:
    """``src`` without its top-level imports from ms-swift's loss file; -> (source, the names they bound). (The
    exported module renames its imports of the harness to a package of its own when it runs them.)"""
    lines, names = [], []
    for ln in src.splitlines():
        m = _UPSTREAM_IMPORT.match(ln)
        if m:
            got = [x.strip().split(" as ")[0] for x in m.group(1).split(",") if x.strip()]
            names += got
            lines.append(f"# {', '.join(got)}: the target's (bound by the exported module)")
            continue
        lines.append(ln)
    return "\n".join(lines) + "\n", names


def _literal(text: str) -> str:
    """``text`` as a Python string literal, readable where it can be (a raw triple-quoted string)."""
    if "'''" not in text and not text.endswith("\\") and "\r" not in text:
        return "r'''" + text + "'''"
    return repr(text)


def _template() -> str:
    """analysis/certify/suite.py's text, read as a file: importing it would need pytest, which the export does not
    (pytest is needed only where the exported module runs)."""
    return _source("gkd_harness.analysis.certify.suite")


def render(target: str = DEFAULT_TARGET, beta_form: str = PAPER, search_seed: int = 0) -> str:
    """The exported module's text for ``target``, judged in ``beta_form`` (``paper`` or ``continuous``), the search's
    draws of ``search_seed`` as fixed cases."""
    if beta_form not in BETA_FORMS:
        raise ValueError(f"beta_form: {beta_form!r}")
    sources, target_names = {}, {}
    for name, src in embedded_modules().items():
        rel = name[len(HARNESS) + 1 :]
        sources[rel], bound = rewrite(src)
        if bound:
            target_names[rel] = bound
    values = {
        "target": f"TARGET = {target!r}",
        "form": f"FORM = {beta_form!r}",
        "search-seed": f"SEARCH_SEED = {int(search_seed)}",
        "left-out": "LEFT_OUT: Dict[str, str] = {\n"
        + "".join(f"    {k!r}: {v!r},\n" for k, v in LEFT_OUT.items())
        + "}\n"
        + "".join(f"# left out by rule: {x}\n" for x in LEFT_OUT_BY_RULE),
        "sources": "_SOURCES: Dict[str, str] = {\n"
        + "".join(f"    {rel!r}: {_literal(text)},\n" for rel, text in sources.items())
        + "}",
        "target-names": f"_TARGET_NAMES: Dict[str, List[str]] = {target_names!r}",
    }
    out = []
    for ln in _template().splitlines():
        code, _, mark = ln.partition(MARK)
        mark = mark.strip()
        if not mark:
            out.append(ln)
        elif mark in values:
            out.append(values[mark])
        else:
            raise ValueError(f"unknown export marker {mark!r}")
    return "\n".join(out) + "\n"


def export_pytest(path: Path, target: str = DEFAULT_TARGET, beta_form: str = PAPER, search_seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(target, beta_form, search_seed))
    return path


__all__ = ["render", "export_pytest", "left_out_line", "LEFT_OUT", "EMBEDDED_ROOTS"]
