"""Local datasets checked before any model loads (torch-free; called from
:func:`gkd_harness.harness.config.validate.validate_config`).

ms-swift found these problems only after the models had loaded (a minute on a CPU, longer on a cluster), and
then without naming the file or the line: an empty jsonl (``StopIteration``), a malformed line
(``DatasetGenerationError``, the row only in swift.log), and rows without an assistant turn, which trained to
"completed" with loss 0.0 and grad_norm 0.0 at every step. Here, for a local ``.jsonl`` file:

* it exists and holds at least one row;
* its first :data:`SAMPLED_ROWS` rows are JSON objects (the line number is named when one is not);
* each sampled row has an assistant turn, unless generation is fully on-policy (``gkd.lmbda=1``: the student
  writes every response) - in the ``messages`` / ``conversations`` formats or the ``query``/``response`` style.

A hub dataset id (``owner/name``, with ms-swift's ``HF::`` prefix, ``:subset`` and ``#N`` suffixes) is checked
where the cache allows: when the hub cannot be reached (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, or the
embedded models, whose runs are launched with ``HF_HUB_OFFLINE=1``), it must be in the Hugging Face hub cache or
the ``datasets`` cache, else ms-swift fails after the models have loaded. As for hub model ids, a dry run only
names it (it may plan for nodes whose cache this machine does not see). Online, a hub id is left to ms-swift, as
is a folder or another file type.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.user_files import MAX_LINE, bounded_lines

#: how many leading rows are parsed and checked (the check reads no more of a large file)
SAMPLED_ROWS = 50
_ASSISTANT_ROLES = ("assistant", "gpt", "bot", "model")
_RESPONSE_KEYS = ("response", "output", "answer", "completion", "chosen")
_PROMPT_KEYS = ("query", "instruction", "prompt", "input", "question")


def dataset_file(value: str) -> Optional[Path]:
    """The local jsonl file ``value`` names (ms-swift's ``#N`` sample suffix dropped), or None when it is not one."""
    path = Path(re.sub(r"#\d+$", "", value)).expanduser()
    return path if path.suffix == ".jsonl" and path.is_file() else None


def row_problem(row: Any, on_policy: bool) -> Optional[str]:
    """Why one dataset row cannot train GKD (None: it can)."""
    if not isinstance(row, dict):
        return f"is not a JSON object (got {type(row).__name__})"
    turns = row.get("messages", row.get("conversations"))
    if turns is not None:
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            return "has 'messages' that are not a list of {role, content} objects"
        roles = [str(t.get("role", t.get("from", ""))).lower() for t in turns]
        if not on_policy and not any(r in _ASSISTANT_ROLES for r in roles):
            return (
                f"has no assistant turn (roles {roles}); GKD needs one unless generation is fully on-policy "
                "(gkd.lmbda=1)"
            )
        return None
    if any(k in row for k in _RESPONSE_KEYS):
        return None
    if any(k in row for k in _PROMPT_KEYS):
        return (
            None
            if on_policy
            else (
                f"has a prompt but no response ({'/'.join(_RESPONSE_KEYS)}); GKD needs one "
                "unless generation is fully on-policy (gkd.lmbda=1)"
            )
        )
    return (
        f"has none of the fields ms-swift reads (messages, conversations, {'/'.join(_PROMPT_KEYS)}); "
        f"keys: {sorted(row)[:8]}"
    )


def check_dataset(key: str, value: Optional[str], on_policy: bool) -> None:
    """Raises :class:`ConfigError` naming ``key``, the file and the line for the first problem of a local jsonl."""
    if not value:
        return
    path = dataset_file(value)
    if path is None:
        return
    seen = 0
    with path.open("rb") as f:
        for lineno, raw in bounded_lines(f):  # a row past the bound is never read whole
            if raw is None:
                raise ConfigError(key, f"{path} line {lineno} is longer than {MAX_LINE:,} bytes")
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ConfigError(key, f"{path} line {lineno} is not valid JSON ({e})") from None
            why = row_problem(row, on_policy)
            if why:
                raise ConfigError(key, f"{path} line {lineno} {why}")
            seen += 1
            if seen >= SAMPLED_ROWS:
                break
    if not seen:
        raise ConfigError(key, f"{path} is empty (no rows)")


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def hub_dataset_id(value: str) -> Optional[str]:
    """The hub repo id ``value`` names (``HF::owner/name:subset#500`` -> ``owner/name``), or None when it is a
    local path or not an ``owner/name`` id."""
    if value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists():
        return None
    bare = re.sub(r"#\d+$", "", value)
    bare = re.sub(r"^(HF|MS)::", "", bare).split(":", 1)[0]
    return bare if _HUB_ID.fullmatch(bare) and not Path(bare).expanduser().exists() else None


def hub_offline(env: Optional[Mapping[str, str]] = None) -> bool:
    values = os.environ if env is None else env
    return any(str(values.get(k, "")).lower() in ("1", "true", "yes", "on") for k in _OFFLINE_VARS)


def _cache_dirs() -> tuple:
    """(the hub cache, the ``datasets`` cache), as huggingface_hub and datasets resolve them."""
    from huggingface_hub import constants  # torch-free; a dependency of transformers and datasets

    hub = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()
    home = Path(os.environ.get("HF_HOME") or constants.HF_HOME).expanduser()
    return hub, Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()


def in_dataset_cache(repo_id: str) -> bool:
    """Whether hub dataset ``repo_id`` has a snapshot in the hub cache or a prepared copy in the datasets cache."""
    hub, datasets_cache = _cache_dirs()
    snapshots = hub / f"datasets--{repo_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    return (datasets_cache / repo_id.replace("/", "___")).is_dir()


def check_hub_dataset(key: str, value: Optional[str], offline: bool) -> None:
    """Raises :class:`ConfigError` naming ``key`` for a hub dataset id that is not cached while the hub is out of
    reach (``offline``)."""
    repo_id = hub_dataset_id(value) if value and offline else None
    if repo_id and not in_dataset_cache(repo_id):
        raise ConfigError(
            key,
            f"{value!r} is not a local file and hub dataset {repo_id} is not in the Hugging Face "
            "cache, and the hub is offline (HF_HUB_OFFLINE, or the embedded models): download it "
            "first (huggingface-cli download --repo-type dataset ...) or point the key at a local jsonl",
        )


def validate_datasets(cfg) -> None:
    """``run.dataset`` and ``monitor.eval.dataset`` (the held-out split always needs responses to score)."""
    from gkd_harness.harness.config.schema import EMBEDDED

    # the embedded models' runs get HF_HUB_OFFLINE=1; a dry run may plan for other nodes' caches
    offline = (hub_offline() or cfg.model.student == EMBEDDED) and not cfg.run.dry_run
    for key, value in (("run.dataset", cfg.run.dataset), ("monitor.eval.dataset", cfg.monitor.eval.dataset)):
        check_hub_dataset(key, value, offline)
    check_dataset("run.dataset", cfg.run.dataset, on_policy=cfg.gkd.lmbda >= 1.0)
    check_dataset("monitor.eval.dataset", cfg.monitor.eval.dataset, on_policy=False)


__all__ = [
    "validate_datasets",
    "check_dataset",
    "check_hub_dataset",
    "hub_dataset_id",
    "in_dataset_cache",
    "row_problem",
    "SAMPLED_ROWS",
]
