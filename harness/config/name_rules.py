"""Names from the config that become folder names or wandb names (torch-free; called from
:func:`harness.config.validate.validate_config`).

``tracking.wandb.group`` is a folder of the output root (``runs/<group>/``, ``multirun/<group>/``) and the wandb
group; ``run.name`` and ``tracking.wandb.tags`` become wandb names and tags. None of them may be empty, ``.`` or
``..``, hold a path separator or a control character: ``group=../../../x`` wrote the run outside the output root,
an empty group or ``.`` made ``outputs/runs`` itself the run folder, a newline was accepted.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from harness.config.schema import ConfigError

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME_LENGTH = 128


def name_problem(value: Any) -> Optional[str]:
    """Why ``value`` cannot be a folder or run name (None: it can)."""
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty name, got {value!r}"
    if value.strip() in (".", ".."):
        return f"must not be {value!r} (it would name the parent folder, not a run folder)"
    if "/" in value or "\\" in value:
        return f"must not contain a path separator, got {value!r}"
    if ".." in value:
        return f"must not contain '..', got {value!r}"
    if _CONTROL_RE.search(value):
        return f"must not contain control characters (newline, tab, ...), got {value!r}"
    if len(value) > MAX_NAME_LENGTH:
        return f"must be at most {MAX_NAME_LENGTH} characters, got {len(value)}"
    return None


def check_name(key: str, value: Any) -> None:
    why = name_problem(value)
    if why:
        raise ConfigError(key, why)


def validate_names(cfg) -> None:
    """``tracking.wandb.group``, ``run.name`` (when set) and every ``tracking.wandb.tags`` entry."""
    check_name("tracking.wandb.group", cfg.tracking.wandb.group)
    if cfg.run.name is not None:
        check_name("run.name", cfg.run.name)
    for i, tag in enumerate(cfg.tracking.wandb.tags or ()):
        check_name(f"tracking.wandb.tags[{i}]", tag)


#: the folder name Hydra gets instead of an unsafe ``tracking.wandb.group`` (validation then refuses the group with
#: its own message, and the empty folder is removed): the run folder never lands outside the output root
UNSAFE_NAME_STANDIN = "invalid-name"


def folder_name(value: Any) -> str:
    """``value`` when it is a safe folder name, else :data:`UNSAFE_NAME_STANDIN` (the ``gkd_folder_name``
    resolver of ``configs/hydra/default.yaml``)."""
    return str(value) if name_problem(value) is None else UNSAFE_NAME_STANDIN


def check_inside(key: str, path: Path, root: Path) -> None:
    """Raises :class:`ConfigError` when ``path`` (resolved) lies outside ``root`` (resolved)."""
    p, r = Path(path).expanduser().resolve(), Path(root).expanduser().resolve()
    if p != r and r not in p.parents:
        raise ConfigError(key, f"{path} lies outside the output root {root}")


__all__ = ["validate_names", "name_problem", "check_name", "check_inside", "folder_name", "UNSAFE_NAME_STANDIN"]
