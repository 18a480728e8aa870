"""A run's identity: the fingerprint of its resolved config, and the keys that differ from an earlier attempt.

:func:`config_fingerprint` hashes every key of the resolved (flat, redacted) config plus the code that runs a
training (:func:`gkd_harness.harness.store.provenance.harness_code_sha256`: every ``*.py`` of ``gkd_harness/harness/``
and ``gkd_harness/launch/``, hashed per point), :func:`code_change_line` says when a point ran other code than the
points of its sweep before it,
not the commit: a docs-, tests- or analysis-only commit between two points of a sweep changes no run's identity, and
neither does the dev distance of the version, which a stale ``gkd_harness.egg-info`` can change;
:func:`summary_diff` lists what differs from a folder's summary.json, and :func:`mismatch_message` says it in one
line (:class:`ConfigMismatch`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional

from gkd_harness.harness.config.secrets import redact
from gkd_harness.harness.contract import ARCHIVE_DIR, SUMMARY_FILE
from gkd_harness.harness.store.files import RunFolderError
from gkd_harness.harness.store.provenance import harness_code_sha256, harness_version

#: Keys that say where and how to run a config, not what it trains: left out of the fingerprint and the diff.
FINGERPRINT_EXCLUDE = frozenset(
    {"run.output_dir", "run.overwrite", "run.resume", "run.dry_run", "run.verbose", "run.allow_untested_swift"}
)


class ConfigMismatch(RunFolderError):
    """The folder holds an attempt of a different config (``differing``: the keys that differ)."""

    def __init__(self, message: str, run_dir: Path, differing: List[str]):
        super().__init__(message, run_dir / SUMMARY_FILE, run_dir)
        self.differing = list(differing)


def canonical_config(flat_config: Mapping[str, Any], exclude: Iterable[str] = FINGERPRINT_EXCLUDE) -> Dict[str, Any]:
    """The comparable form of a flat config: secrets redacted, ``exclude`` keys dropped, values as they read back
    from summary.json (a JSON round trip: tuples -> lists, unknown types -> str), keys sorted."""
    skip = set(exclude)
    data = {str(k): v for k, v in redact(dict(flat_config)).items() if str(k) not in skip}
    return json.loads(json.dumps(dict(sorted(data.items())), default=str))


def config_fingerprint(
    flat_config: Mapping[str, Any], code: Optional[str] = None, exclude: Iterable[str] = FINGERPRINT_EXCLUDE
) -> str:
    """sha256 (hex, 64 characters) over every key and value of the flat resolved config (paths included; the
    ``exclude`` keys that only say where/how to run left out) plus ``code``, the sha256 of the code that runs a
    training (default :func:`harness_code_sha256`)."""
    payload = {
        "config": canonical_config(flat_config, exclude),
        "harness_code_sha256": harness_code_sha256() if code is None else code,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_diff(
    old_flat: Mapping[str, Any], new_flat: Mapping[str, Any], exclude: Iterable[str] = FINGERPRINT_EXCLUDE
) -> List[str]:
    """Sorted keys whose value differs between two flat configs, or that only one of them has."""
    old, new = canonical_config(old_flat, exclude), canonical_config(new_flat, exclude)
    return sorted(k for k in set(old) | set(new) if old.get(k, ...) != new.get(k, ...))


def summary_diff(summary: Mapping[str, Any], flat_config: Mapping[str, Any], code: Optional[str] = None) -> List[str]:
    """Keys that differ between a folder's summary.json and a new flat config; ``"harness_code"`` when the code
    that runs a training differs (``summary["harness_code_sha256"]``; absent in a folder of an older harness),
    ``"fingerprint"`` when the stored fingerprint does not match although nothing else differs. Empty: same run."""
    code = harness_code_sha256() if code is None else code
    keys = config_diff(summary.get("config") or {}, flat_config)
    if summary.get("harness_code_sha256") != code:
        keys.append("harness_code")
    if not keys and summary.get("fingerprint") != config_fingerprint(flat_config, code):
        keys.append("fingerprint")
    return keys


def _summary_of(run_dir: Path) -> Mapping[str, Any]:
    try:
        with (run_dir / SUMMARY_FILE).open("rb") as f:
            data = json.loads(f.read(1 << 22))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def code_change_line(run_dir: Path, sweep_dir: Path) -> Optional[str]:
    """One line when the run in ``run_dir`` ran other code (``harness_code_sha256``: the harness's and the
    launcher's ``*.py``) than the points of ``sweep_dir`` that started before it (a ``git pull`` mid-sweep), else
    None. Read from the run folders' summary.json, so it holds whichever process ran each point."""
    mine = _summary_of(run_dir)
    code, started = mine.get("harness_code_sha256"), mine.get("started_at")
    if not isinstance(code, str) or not isinstance(started, str):
        return None
    earlier: Dict[str, List[str]] = {}
    for other in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p != run_dir):
        summary = _summary_of(other)
        theirs, when = summary.get("harness_code_sha256"), summary.get("started_at")
        if isinstance(theirs, str) and isinstance(when, str) and when < started and theirs != code:
            earlier.setdefault(theirs, []).append(other.name)
    if not earlier:
        return None
    names = [n for group in earlier.values() for n in group]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"{run_dir.name} ran other code than {len(names)} earlier point{'s' * (len(names) != 1)} of this sweep "
        f"({shown}): harness_code_sha256 {code[:12]} against {', '.join(c[:12] for c in earlier)} (the harness or "
        "launcher code changed mid-sweep; gkd_harness/harness/ and gkd_harness/launch/ *.py)"
    )


def _show(value: Any, width: int = 40) -> str:
    text = json.dumps(value, default=str) if value is not ... else "(absent)"
    return text if len(text) <= width else text[: width - 3] + "..."


def mismatch_message(
    run_dir: Path,
    summary: Mapping[str, Any],
    flat_config: Mapping[str, Any],
    differing: List[str],
    what: str = "a completed run",
) -> str:
    """One line: which keys differ (old -> new) and the two ways on: a new group / folder, or run.overwrite=true."""
    old, new = canonical_config(summary.get("config") or {}), canonical_config(flat_config)
    shown = []
    for k in differing[:8]:
        if k == "harness_code":
            shown.append(
                f"the harness code (gkd_harness/harness/*.py) {_show(summary.get('harness_version'))} -> "
                f"{_show(harness_version())}"
            )
        elif k == "fingerprint":
            shown.append("fingerprint (absent or different)")
        else:
            shown.append(f"{k} {_show(old.get(k, ...))} -> {_show(new.get(k, ...))}")
    more = f" and {len(differing) - 8} more" if len(differing) > 8 else ""
    return (
        f"run.output_dir {run_dir} holds {what} of a different config ({len(differing)} keys differ: "
        f"{'; '.join(shown)}{more}); to keep both, use a new group (tracking.wandb.group=...) or another "
        f"run.output_dir; to replace it, add run.overwrite=true (the old attempt moves to "
        f"{run_dir / ARCHIVE_DIR}/<n>)"
    )


__all__ = [
    "FINGERPRINT_EXCLUDE",
    "ConfigMismatch",
    "canonical_config",
    "config_fingerprint",
    "config_diff",
    "summary_diff",
    "mismatch_message",
    "code_change_line",
]
