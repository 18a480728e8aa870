"""The run folder: its layout, and every write of its contract files (config.yaml, summary.json, the other JSON
files, the archive of an earlier attempt).

Run folder (one per run, ``run.output_dir``)::

    .lock              the owner (:mod:`gkd_harness.harness.store.lock`); present while a run lives
    config.yaml        resolved harness config (secrets redacted)
    metrics.jsonl      one JSON object per logging step (:mod:`gkd_harness.harness.store.metrics_io`), "step" an integer
    summary.json       status running|completed|failed|interrupted (then "signal"), error, run_name, group, flat config,
                       fingerprint (:mod:`gkd_harness.harness.store.fingerprint`), harness_version, dtypes_seen, versions,
                       last_step, started_at, ended_at, wall_s
    captures/          step{S}_rank{R}.safetensors where capture is enabled
    wandb/             WANDB_DIR
    swift/             ms-swift's own output_dir (logging.jsonl, args.json)
    previous_attempts/<n>/   earlier attempts, moved here only by the lock's owner

What a rerun does with an earlier attempt is decided in one place, ``gkd_harness.harness.launcher.resume.decide_attempt``.
Hydra's own files: :mod:`gkd_harness.harness.store.hydra_files`.

Errors: every failed write raises :class:`~gkd_harness.harness.store.files.RunFolderError`, one line naming the file and
``run.output_dir``; temporary files are removed on every path; :meth:`RunFolder.record_failure` records ``failed``
where the disk allows (rewriting summary.json in place when there is no room for a new file). ``last_step`` is
always the step of the last line in metrics.jsonl.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from gkd_harness.harness.config.secrets import redact, redact_name
from gkd_harness.harness.contract import (
    ARCHIVE_DIR,
    CAPTURES_DIR,
    COMMAND_FILE,
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    PLUGIN_SETTINGS_FILE,
    SUMMARY_FILE,
    SWIFT_DIR,
    SWIFT_LOG,
    WANDB_DIR,
)
from gkd_harness.harness.store.files import RunFolderError, now_iso
from gkd_harness.harness.store.files import dump_json as _json
from gkd_harness.harness.store.files import os_error as _os_error
from gkd_harness.harness.store.files import write_atomic as _write_atomic
from gkd_harness.harness.store.files import write_in_place as _write_in_place
from gkd_harness.harness.store.fingerprint import canonical_config, config_fingerprint
from gkd_harness.harness.store.lock import RunLock, describe_owner, owned_by_this_process, read_lock
from gkd_harness.harness.store.metrics_io import last_metrics_step, read_metrics, record_step
from gkd_harness.harness.store.provenance import data_sha256, harness_code_sha256, harness_version, package_versions
from gkd_harness.harness.store.records import Command, RecordError, write_command, write_metrics_rows, write_summary
from gkd_harness.harness.store.records import read_summary as _read_summary_record
from gkd_harness.harness.store.records import write_config as _write_config_record

log = logging.getLogger("gkd_harness.run_folder")

#: What an attempt leaves in its folder (moved together by :meth:`RunFolder.archive_previous_attempt`).
ATTEMPT_FILES = (
    METRICS_FILE,
    SUMMARY_FILE,
    CONFIG_FILE,
    CAPTURES_DIR,
    WANDB_DIR,
    SWIFT_DIR,
    SWIFT_LOG,
    COMMAND_FILE,
    PLUGIN_SETTINGS_FILE,
)


class RunFolder:
    """The run folder of one run; every writer of the contract files goes through here.

    Writes raise :class:`RunFolderError` (one line naming the file and run.output_dir); moving files
    (:meth:`archive_previous_attempt`) needs the folder's lock (:meth:`lock`) held by this process.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # layout -------------------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def wandb_dir(self) -> Path:
        return self.path / WANDB_DIR

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_FILE

    # ownership ----------------------------------------------------------------------------------------
    def lock(self) -> RunLock:
        """This folder's :class:`RunLock` (not yet acquired): ``with folder.lock() as lock: ...``."""
        return RunLock(self.path)

    def owner(self) -> Optional[Dict[str, Any]]:
        return read_lock(self.path)

    # files --------------------------------------------------------------------------------------------
    def create(self) -> "RunFolder":
        for d in (self.path, self.wandb_dir):
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _os_error(e, "create", d, self.path) from None
        return self

    def write_config(self, yaml_text: str) -> None:
        """config.yaml (atomic). The caller passes redacted text; credentials are redacted again here."""
        _write_config_record(self.path, yaml_text)

    def write_command(self, command: Command) -> Path:
        """command.json (:class:`~gkd_harness.harness.store.records.Command`), atomic and redacted."""
        return write_command(self.path, command)

    def write_json(self, name: str, data: Any) -> Path:
        """Any other JSON file of the folder (plugin_settings.json), atomic and redacted."""
        path = self.path / name
        _write_atomic(path, _json(redact(data)), self.path)
        return path

    def archive_previous_attempt(self, reason: Optional[str] = None) -> Optional[Path]:
        """Move an earlier attempt's files to ``previous_attempts/<n>/`` so a restart starts clean.

        Only the lock's owner may do this (:class:`RunFolderError` otherwise): a live run's files never move.
        ``reason`` is written to ``previous_attempts/<n>/archived.json``. Returns the archive folder, or None when
        there was nothing to move.
        """
        present = [n for n in ATTEMPT_FILES if (self.path / n).exists()]
        if not present:
            return None
        if not owned_by_this_process(self.path):
            owner = read_lock(self.path)
            who = describe_owner(owner) if owner is not None else "nobody"
            raise RunFolderError(
                f"refusing to move files of run.output_dir {self.path}: this process does not hold "
                f"its lock (held by {who}); acquire RunFolder.lock() first",
                self.lock_path,
                self.path,
            )
        root = self.path / ARCHIVE_DIR
        n = 1
        while (root / str(n)).exists():
            n += 1
        target = root / str(n)
        try:
            target.mkdir(parents=True)
            for name in present:
                os.replace(self.path / name, target / name)
        except OSError as e:
            raise _os_error(e, "archive the earlier attempt of", self.path, self.path) from None
        _write_atomic(
            target / "archived.json", _json({"archived_at": now_iso(), "reason": reason, "files": present}), self.path
        )
        return target

    def truncate_metrics(self, last_step: int) -> int:
        """Keep only the metrics lines up to ``last_step`` (a run resumed from that checkpoint); returns lines kept."""
        rows = [
            r for r in read_metrics(self.metrics_path) if (step := record_step(r)) is not None and step <= last_step
        ]
        write_metrics_rows(self.path, rows)
        return len(rows)

    def read_summary(self) -> Optional[Dict[str, Any]]:
        try:
            summary = _read_summary_record(self.path, check=False)
        except RecordError as e:
            if e.os_error is not None:
                raise _os_error(e.os_error, "read", self.summary_path, self.path) from None
            return None
        return dict(summary) if summary is not None else None

    def is_completed(self) -> bool:
        summary = self.read_summary()
        return summary is not None and summary.get("status") == "completed"

    def has_attempt(self) -> bool:
        """Does the folder hold any file of an earlier attempt?"""
        return any((self.path / n).exists() for n in ATTEMPT_FILES)

    # summary.json -------------------------------------------------------------------------------------
    def _write_summary(self, summary: Mapping[str, Any]) -> None:
        write_summary(self.path, summary)

    def start_summary(self, run_name: str, group: Optional[str], flat_config: Mapping[str, Any]) -> Dict[str, Any]:
        """summary.json of a new attempt: status running, the flat config (redacted), its fingerprint, the
        harness version and the provenance (git commit and dirty flag, sha256 of the loss code, ms-swift version:
        :mod:`gkd_harness.harness.store.provenance`)."""
        from gkd_harness.harness.store.provenance import provenance

        version = harness_version()
        summary = {
            "status": "running",
            "error": None,
            "run_name": redact_name(str(run_name)),
            "group": group,
            "config": canonical_config(flat_config, exclude=()),
            "fingerprint": config_fingerprint(flat_config),
            "harness_version": version,
            "harness_code_sha256": harness_code_sha256(),
            "dtypes_seen": {},
            "versions": package_versions(),
            "data_sha256": data_sha256(flat_config),
            "last_step": 0,
            "started_at": now_iso(),
            "ended_at": None,
            "wall_s": None,
            "provenance": provenance(flat_config.get("loss.precision"), flat_config.get("loss.source")),
        }
        self._write_summary(summary)
        return summary

    def update_summary(self, **fields: Any) -> Dict[str, Any]:
        """Merge ``fields`` into summary.json (nested dicts merged one level deep)."""
        summary = self.read_summary() or {}
        for k, v in fields.items():
            if isinstance(v, Mapping) and isinstance(summary.get(k), Mapping):
                summary[k] = {**summary[k], **v}
            else:
                summary[k] = v
        self._write_summary(summary)
        return summary

    def finish_summary(self, status: str, error: Optional[str] = None) -> Dict[str, Any]:
        """Final status (completed | failed | interrupted) with ended_at, wall_s and last_step; raises :class:`RunFolderError`."""
        summary = self.read_summary() or {}
        return self.update_summary(**self._final_fields(summary, status, error))

    def _final_fields(self, summary: Mapping[str, Any], status: str, error: Optional[str]) -> Dict[str, Any]:
        """status, error, ended_at, wall_s and last_step (the step of metrics.jsonl's last line) of a final summary."""
        started, wall = summary.get("started_at"), None
        if started:
            try:
                wall = (_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(started)).total_seconds()
            except (TypeError, ValueError):
                wall = None
        return {
            "status": status,
            "error": error,
            "ended_at": now_iso(),
            "wall_s": wall,
            "last_step": last_metrics_step(self.metrics_path),
        }

    def record_failure(self, error: str) -> bool:
        """Best effort, never raises: summary.json says ``failed`` with ``error``. When there is no room for a new
        file (full disk) the existing summary.json is rewritten in place. Returns whether it was recorded."""
        try:
            self.finish_summary("failed", error)
            return True
        except RunFolderError as first:
            log.debug(f"summary.json: atomic write failed ({first}); trying in place")
        except Exception as e:  # noqa: BLE001 - reading a broken folder must not hide the run's own error
            log.warning(f"could not record the failure in {self.summary_path}: {e}")
            return False
        summary = self.read_summary_quietly() or {}
        summary.update(self._final_fields(summary, "failed", error))
        text = _json(redact(summary))
        try:
            _write_in_place(self.summary_path, text, self.path)
            return True
        except RunFolderError:
            pass
        # not even the old size fits: the shortest record that still says failed
        try:
            _write_in_place(
                self.summary_path,
                _json(
                    {"status": "failed", "error": str(error)[:200], "last_step": last_metrics_step(self.metrics_path)}
                ),
                self.path,
            )
            return True
        except RunFolderError as e:
            log.warning(f"could not record the failure: {e}")
            return False

    def record_interrupt(self, signal_name: str) -> bool:
        """Best effort, never raises: summary.json says ``interrupted`` (a stop signal: preemption, time-out,
        Ctrl-C) with ``signal`` and ``last_step``, the metrics' last step. Returns whether it was recorded."""
        error = f"interrupted by {signal_name}"
        try:
            self.finish_summary("interrupted", error)
            self.update_summary(signal=signal_name)
            return True
        except Exception as e:  # noqa: BLE001 - a stop must never end in a traceback
            log.warning(f"could not record the interruption in {self.summary_path}: {e}")
        try:  # a full disk: the existing file's blocks
            summary = self.read_summary_quietly() or {}
            summary.update(self._final_fields(summary, "interrupted", error), signal=signal_name)
            _write_in_place(self.summary_path, _json(redact(summary)), self.path)
            return True
        except Exception:  # noqa: BLE001
            return False

    def read_summary_quietly(self) -> Optional[Dict[str, Any]]:
        try:
            return self.read_summary()
        except RunFolderError:
            return None
