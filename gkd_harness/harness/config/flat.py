"""Config trees as flat dotted keys: the harness's one flattener (run folders, wandb config, analysis)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional


def _as_mapping(obj: Any) -> Optional[Mapping]:
    if isinstance(obj, Mapping):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return None


def flatten(tree: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested mapping (or dataclass tree) -> flat dict with dotted keys.

    ``{"loss": {"precision": "fp32"}, "run": {"extra_args": []}, "e": {}}`` ->
    ``{"loss.precision": "fp32", "run.extra_args": [], "e": {}}``: lists stay values, and so does an empty
    mapping (so a key that holds ``{}`` is not lost). The harness's one flattener.
    """
    out: Dict[str, Any] = {}
    for k, v in (_as_mapping(tree) or {}).items():
        key = f"{prefix}{k}"
        sub = _as_mapping(v)
        if sub is not None and len(sub):
            out.update(flatten(sub, key + "."))
        else:
            out[key] = {} if sub is not None else v
    return out
