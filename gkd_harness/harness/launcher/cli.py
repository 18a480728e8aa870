"""``gkd-train``: the thin entry point (the only Hydra reader). ``main`` hands the composed config to
:func:`gkd_harness.harness.launcher.run.train`, which does the work:

typed config (once) -> validation (before any model loads) -> the launch plan (``gkd_harness.harness.launcher.plan``) ->
with ``run.dry_run=true``: print the plan and stop -> skip if the run folder already completed with the same
config -> run folder (config.yaml, summary.json "running") -> plugin settings (the typed config serialised) ->
``swift rlhf`` / ``megatron rlhf`` as a subprocess (output to ``swift.log``) -> summary.json "completed", or
"failed" with the error.

Exit codes: 0 completed (or skipped), 1 the run failed (a full disk included), 2 a config or input error (a run
folder or output root that is read-only or not allowed included), 128 + the signal's number
when stopped by SIGTERM (143), SIGHUP (129) or SIGINT (130): the run is then recorded as "interrupted".
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.launcher import run as run_mod
from gkd_harness.harness.launcher.process import Interrupted, TrainingFailed
from gkd_harness.harness.launcher.run import _is_multirun, train
from gkd_harness.harness.store.provenance import version_line

log = logging.getLogger("gkd_harness.train")
EXIT_FAILED, EXIT_CONFIG = 1, 2


def _verbose(cfg: Any) -> bool:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return True
    try:
        return bool(cfg.run.verbose)
    except Exception:  # noqa: BLE001
        return False


@dataclass(frozen=True)
class PointFailed:
    """What a sweep point's job returns when it failed: Hydra then goes on with the other points, and the sweep
    callback records the failure and makes the sweep exit 1, without a traceback per point."""

    code: int
    error: str
    #: the point was refused (its folder is busy or holds another config): the folder is not this job's, so
    #: nothing may be written into it (gkd_harness.launch.sweep reports the refusal on the sweep's console and log instead)
    refused: bool = False


def _exit_code(e: BaseException) -> tuple[int, str]:
    """Exit code and label: 2 for what the user must change (the config, a busy or mismatched folder, a path that
    is read-only or not allowed), 1 where the run itself failed (ms-swift, a full disk)."""
    from gkd_harness.harness.store.files import RunFolderError, os_exit_code
    from gkd_harness.harness.store.fingerprint import ConfigMismatch
    from gkd_harness.harness.store.lock import RunFolderBusy

    if isinstance(e, ConfigError):
        return EXIT_CONFIG, "invalid config"
    if isinstance(e, (RunFolderBusy, ConfigMismatch)):
        return EXIT_CONFIG, "refused"
    if isinstance(e, RunFolderError) and e.path_error:
        return EXIT_CONFIG, "unusable run folder"
    if isinstance(e, OSError) and os_exit_code(e) == EXIT_CONFIG:
        return EXIT_CONFIG, "unusable path"
    return EXIT_FAILED, "run failed"


def _scrub_sweep_files(cfg) -> None:
    """Credentials out of the sweep's own files (Hydra's multirun.yaml, written before any job starts) and
    ``.hydra/``: values under credential keys and credential-looking values of this job's config, before anything
    else is written (a credential on the command line never gets this far: :func:`main` refuses it)."""
    if not _is_multirun():
        return
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from gkd_harness.harness.config.secrets import secret_values
    from gkd_harness.harness.store.files import RunFolderError
    from gkd_harness.harness.store.hydra_files import scrub_hydra_dir

    values = secret_values(OmegaConf.to_container(cfg, resolve=False))
    sweep_dir = Path(str(HydraConfig.get().sweep.dir))
    for folder in (sweep_dir, sweep_dir / ".hydra"):
        try:
            scrub_hydra_dir(folder, values)
        except RunFolderError as e:
            log.warning(f"could not scrub {folder}: {e}")


def _redact_log_records() -> None:
    """Every log record's text with credentials redacted (:func:`gkd_harness.harness.config.secrets.redact_text`): Hydra's
    launch line ("#0 : key=value ...") and its job log never show one; a log write that fails (a full disk) is
    dropped instead of printing a traceback."""
    from gkd_harness.harness.config.secrets import redact_text

    logging.raiseExceptions = False
    make = logging.getLogRecordFactory()
    if getattr(make, "gkd_redacting", False):
        return

    def redacting(*args, **kwargs):
        record = make(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's business
            return record
        clean = redact_text(text)
        if clean != text:
            record.msg, record.args = clean, ()
        return record

    redacting.gkd_redacting = True
    logging.setLogRecordFactory(redacting)


def _job(cfg) -> Optional[int]:
    """The Hydra job: :func:`train`, with one-line errors. A single run exits 2 (config error, busy or mismatched
    folder) or 1 (failed run); in a sweep the error is re-raised so Hydra records the point as failed and the
    other points go on."""
    from gkd_harness.harness.launcher.wandb_env import experiment_name
    from gkd_harness.harness.store.files import RunFolderError

    run_mod._TASK_CFG[:] = [cfg]
    try:
        _scrub_sweep_files(cfg)
        summary = train(cfg, experiment=experiment_name())
    except (ConfigError, TrainingFailed, RunFolderError, OSError) as e:
        from gkd_harness.harness.store.files import os_error_line

        code, what = _exit_code(e)
        line = os_error_line(e) if isinstance(e, OSError) else str(e)
        print(f"gkd-train: {what}: {line}", file=sys.stderr)
        if _verbose(cfg):
            raise
        if _is_multirun():
            return PointFailed(code, f"{type(e).__name__}: {line}", refused=what == "refused")
        sys.exit(code)
    except Interrupted as e:  # preemption, time-out, Ctrl-C: the run is recorded as interrupted; the sweep ends
        print(
            f"gkd-train: {e} (summary.json says interrupted; rerun the same command to restart, or add "
            "run.resume=true)",
            file=sys.stderr,
        )
        sys.exit(e.exit_code)
    return summary.get("last_step") if summary else None


def _one_line_config_errors(run_and_report):
    """Hydra's ``run_and_report`` with its own config errors (unknown key, unknown group option, bad override
    syntax), raised before any job starts, turned into one line and exit 2 instead of its multi-line message and
    exit 1; an ``OSError`` of Hydra's own folders and files (read-only: exit 2; full disk: exit 1) likewise. Errors from inside a job, and everything under ``HYDRA_FULL_ERROR=1``, go to Hydra unchanged."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gkd_harness.harness.launcher.compose import composition_error

    def guarded_run_and_report(func):
        def composed():
            try:
                return func()
            except (HydraException, OmegaConfBaseException) as e:
                if run_mod._TASK_CFG or os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                print(f"gkd-train: invalid config: {composition_error(e)}", file=sys.stderr)
                sys.exit(EXIT_CONFIG)
            except OSError as e:  # Hydra's own run folder or log file (a read-only or full disk): one line
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                from gkd_harness.harness.store.files import os_error_line

                code, what = _exit_code(e)
                print(f"gkd-train: {what}: {os_error_line(e)}", file=sys.stderr)
                sys.exit(code)

        return run_and_report(composed)

    return guarded_run_and_report


def _job_leaving_no_empty_folder(cfg) -> Optional[int]:
    """:func:`_job`, then the run folder Hydra made for it removed again if the job left nothing in it (a dry
    run, a config error, a refused point; ``gkd_harness.harness.launcher.leftovers``)."""
    from gkd_harness.harness.launcher.leftovers import remove_if_empty

    result = None
    try:
        result = _job(cfg)
        return result
    finally:
        # a failed sweep point keeps its folder: the sweep callback records the failure there (job_return.json)
        if not isinstance(result, PointFailed):
            try:
                from hydra.core.hydra_config import HydraConfig

                remove_if_empty(Path(HydraConfig.get().runtime.output_dir))
            except Exception:  # noqa: BLE001 - tidying up must never change the job's outcome
                pass


def _hydra_main() -> None:
    import hydra
    import hydra._internal.utils as hydra_utils  # Hydra offers no public hook for its composition errors

    from gkd_harness.harness.launcher.compose import CONFIG_NAME, CONFIG_PATH, register

    register()
    _redact_log_records()
    original = hydra_utils.run_and_report
    hydra_utils.run_and_report = _one_line_config_errors(original)
    try:
        hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(_job_leaving_no_empty_folder)()
    finally:
        hydra_utils.run_and_report = original


def _flag_value(args: Sequence[str], key: str) -> Optional[str]:
    for a in args:
        k, sep, v = a.partition("=")
        if sep and k.lstrip("+~") == key:
            return v
    return None


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``gkd-train [overrides]``: ``--version``; credential overrides refused before Hydra writes anything;
    ``run.dry_run=true`` composes the config and prints the plan without creating a run folder."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args:
        print(version_line("gkd-train"))
        return
    from gkd_harness.harness.config.secrets import secret_overrides, secret_refusal

    overrides = [a for a in args if not a.startswith("-")]
    try:
        for key in secret_overrides(overrides):
            raise ConfigError(key, secret_refusal(key))
        dry = (_flag_value(overrides, "run.dry_run") or "").lower() in ("true", "1", "yes")
        if dry and not any(a in ("-m", "--multirun") or a.startswith("--") for a in args):
            from gkd_harness.harness.launcher.compose import compose_point

            point = compose_point(overrides)
            train(point.cfg, experiment=point.experiment)
            return
    except ConfigError as e:
        print(f"gkd-train: invalid config: {e}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    if argv is not None:
        sys.argv = [sys.argv[0], *args]
    try:
        _hydra_main()
    except KeyboardInterrupt:  # Ctrl-C before a run started (composing the config): one line, 128 + SIGINT
        print("gkd-train: interrupted by SIGINT", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    # `python -m gkd_harness.harness.launcher.cli`: run the importable module's main, so that what a job returns (PointFailed) is the
    # class gkd_harness.launch.sweep imports, not a __main__ copy of it
    from gkd_harness.harness.launcher.cli import main as _module_main

    _module_main()
