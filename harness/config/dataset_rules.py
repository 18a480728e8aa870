"""Local datasets checked before any model loads (torch-free; called from
:func:`harness.config.validate.validate_config`).

ms-swift found these problems only after the models had loaded (a minute on a CPU, longer on a cluster), and
then without naming the file or the line: an empty jsonl (``StopIteration``), a malformed line
(``DatasetGenerationError``, the row only in swift.log), and rows without an assistant turn, which trained to
"completed" with loss 0.0 and grad_norm 0.0 at every step. Here, for a local ``.jsonl`` file:

* it exists and holds at least one row;
* its first :data:`SAMPLED_ROWS` rows are JSON objects (the line number is named when one is not);
* each sampled row has an assistant turn, unless generation is fully on-policy (``gkd.lmbda=1``: the student
  writes every response) - in the ``messages`` / ``conversations`` formats or the ``query``/``response`` style.

A folder, another file type or a hub id is left to ms-swift (hub ids are checked against the cache when offline,
:mod:`harness.config.validate`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from harness.config.schema import ConfigError

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
            return (f"has no assistant turn (roles {roles}); GKD needs one unless generation is fully on-policy "
                    "(gkd.lmbda=1)")
        return None
    if any(k in row for k in _RESPONSE_KEYS):
        return None
    if any(k in row for k in _PROMPT_KEYS):
        return None if on_policy else (f"has a prompt but no response ({'/'.join(_RESPONSE_KEYS)}); GKD needs one "
                                       "unless generation is fully on-policy (gkd.lmbda=1)")
    return (f"has none of the fields ms-swift reads (messages, conversations, {'/'.join(_PROMPT_KEYS)}); "
            f"keys: {sorted(row)[:8]}")


def check_dataset(key: str, value: Optional[str], on_policy: bool) -> None:
    """Raises :class:`ConfigError` naming ``key``, the file and the line for the first problem of a local jsonl."""
    if not value:
        return
    path = dataset_file(value)
    if path is None:
        return
    seen = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
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


def validate_datasets(cfg) -> None:
    """``run.dataset`` and ``monitor.eval.dataset`` (the held-out split always needs responses to score)."""
    check_dataset("run.dataset", cfg.run.dataset, on_policy=cfg.gkd.lmbda >= 1.0)
    check_dataset("monitor.eval.dataset", cfg.monitor.eval.dataset, on_policy=False)


__all__ = ["validate_datasets", "check_dataset", "row_problem", "SAMPLED_ROWS"]
