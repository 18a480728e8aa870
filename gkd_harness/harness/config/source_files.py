"""Where a config value's code lives on disk, found without importing it (so validation and provenance never run
a candidate's code, and never import ms-swift or torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional


def find_module_file(module: str) -> Optional[Path]:
    """The source file of ``module`` (``package.sub.mod``), found without importing it or its packages' code beyond
    the top package's spec; None if it cannot be found that way (a namespace, an extension, a missing module)."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if len(parts) == 1:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    for root in spec.submodule_search_locations or []:
        base = Path(root, *parts[1:])
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
    return None


def source_file(source: Optional[str]) -> Optional[Path]:
    """The file of a ``loss.source`` value: ``PATH.py`` (resolved, if it is a file) or ``package.module[:attr]``."""
    if not source:
        return None
    p = Path(source).expanduser()
    if source.endswith(".py") or "/" in source or p.exists():
        return p.resolve() if p.is_file() else None
    return find_module_file(source.partition(":")[0])
