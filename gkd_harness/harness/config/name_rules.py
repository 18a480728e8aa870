"""Names from the config that become folder names or wandb names (torch-free; called from
:func:`gkd_harness.harness.config.validate.validate_config`).

``tracking.wandb.group`` is a folder of the output root (``runs/<group>/``, ``multirun/<group>/``) and the wandb
group; ``run.name`` and ``tracking.wandb.tags`` become wandb names and tags. None of them may be empty, ``.`` or
``..``, hold a path separator or a control character: ``group=../../../x`` wrote the run outside the output root,
an empty group or ``.`` made ``outputs/runs`` itself the run folder, a newline was accepted.

Every other string key reaches a folder name too: Hydra's ``override_dirname`` (``key=value,...``) names each run
folder, so ``loss.name=../../../../ESC`` put the run outside the output root. One rule covers them all
(:func:`validate_names`): a string value (or list entry) of any key but :data:`NOT_NAME_KEYS` must be one path
segment (no separator, not ``.`` / ``..``, no control character); the keys in :data:`NOT_NAME_KEYS` hold paths,
URLs or raw flags and are left out of folder names (``configs/hydra/default.yaml``'s ``exclude_keys``). The
``gkd_run_folder`` resolver gives Hydra a stand-in folder name for an unsafe ``override_dirname``, so nothing is
created outside the output root before validation refuses the key.

Tags the harness sets itself (:data:`OWNED_TAGS`, :data:`OWNED_TAG_PREFIXES`: what the dashboards filter on)
cannot be given by hand in ``tracking.wandb.tags``.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.contract import ROLES

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME_LENGTH = 128
#: the longest folder name most file systems take (bytes)
MAX_SEGMENT_BYTES = 255

#: keys whose values are paths, hub ids, URLs or raw ms-swift flags (what the user points at, checked where it is
#: read), not names: each is left out of Hydra's ``override_dirname`` (``configs/hydra/default.yaml``), so none
#: reaches a folder name. Every other string key is one path segment (:func:`segment_problem`).
NOT_NAME_KEYS = frozenset(
    {
        "model.student",
        "model.teacher",
        "run.dataset",
        "run.output_dir",
        "loss.source",
        "backend.deepspeed",
        "monitor.eval.dataset",
        "run.extra_args",
        "rollout.vllm.server.base_url",
        "run.optimized_metric",  # a metric name (eval/jsd), left out of folder names
    }
)
#: wandb tags the harness sets itself (the loss variant, the candidate's name and hash): a hand-given one would
#: count a run as another variant in the dashboards' filters
OWNED_TAGS = frozenset(ROLES)
OWNED_TAG_PREFIXES = ("candidate:", "sha256:")


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


def segment_problem(value: str) -> Optional[str]:
    """Why the string ``value`` cannot be (part of) one folder name (None: it can)."""
    if value.strip() in (".", ".."):
        return f"must not be {value!r} (part of a run folder's name: it would name a parent folder)"
    if "/" in value or "\\" in value:
        return (
            f"must not contain a path separator (part of a run folder's name, it would leave the output root), "
            f"got {value!r}"
        )
    if _CONTROL_RE.search(value):
        return f"must not contain control characters (newline, tab, ...), got {value!r}"
    return None


def check_name(key: str, value: Any) -> None:
    why = name_problem(value)
    if why:
        raise ConfigError(key, why)


def tag_problem(tag: str) -> Optional[str]:
    """Why ``tag`` cannot be given by hand (None: it can): the harness sets it itself."""
    if tag in OWNED_TAGS or tag.startswith(OWNED_TAG_PREFIXES):
        owned = ", ".join([*sorted(OWNED_TAGS), *(p + "*" for p in OWNED_TAG_PREFIXES)])
        return (
            f"{tag!r} is a tag the harness sets itself ({owned}: the loss variant and the candidate, what the "
            "dashboards filter on); choose another tag"
        )
    return None


def _strings(key: str, value: Any) -> Iterable[tuple]:
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(f"{key}[{i}]", v)


def validate_names(cfg) -> None:
    """``tracking.wandb.group``, ``run.name`` (when set) and every ``tracking.wandb.tags`` entry are names
    (:func:`name_problem`; no tag the harness owns); every other string value of a key outside
    :data:`NOT_NAME_KEYS` is one path segment (:func:`segment_problem`). Raises :class:`ConfigError` naming the key."""
    from gkd_harness.harness.config.flat import flatten

    check_name("tracking.wandb.group", cfg.tracking.wandb.group)
    if cfg.run.name is not None:
        check_name("run.name", cfg.run.name)
    for i, tag in enumerate(cfg.tracking.wandb.tags or ()):
        check_name(f"tracking.wandb.tags[{i}]", tag)
        why = tag_problem(tag)
        if why:
            raise ConfigError(f"tracking.wandb.tags[{i}]", why)
    for key, value in flatten(cfg).items():
        if key in NOT_NAME_KEYS:
            continue
        for name, text in _strings(key, value):
            why = segment_problem(text)
            if why:
                raise ConfigError(name, why)


#: the folder name Hydra gets instead of an unsafe ``tracking.wandb.group`` (validation then refuses the group with
#: its own message, and the empty folder is removed): the run folder never lands outside the output root
UNSAFE_NAME_STANDIN = "invalid-name"


def folder_name(value: Any) -> str:
    """``value`` when it is a safe folder name, else :data:`UNSAFE_NAME_STANDIN` (the ``gkd_folder_name``
    resolver of ``configs/hydra/default.yaml``)."""
    return str(value) if name_problem(value) is None else UNSAFE_NAME_STANDIN


def run_folder_name(value: Any) -> str:
    """Hydra's ``override_dirname`` when it is one safe folder name ("" included: a run without overrides), else
    :data:`UNSAFE_NAME_STANDIN` (the ``gkd_run_folder`` resolver of ``configs/hydra/default.yaml``): the folder
    Hydra creates before the job starts never lands outside the output root; validation then refuses the key."""
    text = "" if value is None else str(value)
    if not text:
        return text
    if segment_problem(text) or len(text.encode()) > MAX_SEGMENT_BYTES:
        return UNSAFE_NAME_STANDIN
    return text


__all__ = [
    "validate_names",
    "name_problem",
    "segment_problem",
    "tag_problem",
    "check_name",
    "folder_name",
    "run_folder_name",
    "UNSAFE_NAME_STANDIN",
    "NOT_NAME_KEYS",
    "OWNED_TAGS",
    "OWNED_TAG_PREFIXES",
]
