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

``--help`` and ``--version`` answer before Hydra, OmegaConf or the launcher are imported (every other import is
inside the function that needs it): ``--help`` is read from the config files (:func:`help_text`).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from gkd_harness.harness.contract import HYDRA_DIR
from gkd_harness.harness.launcher.job_result import EXIT_CONFIG, EXIT_FAILED, PointFailed

__all__ = ["main", "help_text", "hydra_command_line", "is_multirun", "PointFailed", "EXIT_CONFIG", "EXIT_FAILED"]

log = logging.getLogger("gkd_harness.train")
#: config groups that are not a choice: git-ignored site settings (``local``), Hydra's own (``hydra``)
_NOT_A_CHOICE = ("local", "hydra")


def _verbose(cfg: Any) -> bool:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return True
    try:
        return bool(cfg.run.verbose)
    except Exception:  # noqa: BLE001
        return False


def is_multirun() -> bool:
    """Is this process a sweep's job (``-m``)? Read from Hydra's public ``HydraConfig``; False outside a Hydra app."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        return False


def _exit_code(e: BaseException) -> tuple[int, str]:
    """Exit code and label: 2 for what the user must change (the config, a busy or mismatched folder, a path that
    is read-only or not allowed), 1 where the run itself failed (ms-swift, a full disk)."""
    from gkd_harness.harness.config.schema import ConfigError
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
    if not is_multirun():
        return
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from gkd_harness.harness.config.secrets import secret_values
    from gkd_harness.harness.store.files import RunFolderError
    from gkd_harness.harness.store.hydra_files import scrub_hydra_dir

    values = secret_values(OmegaConf.to_container(cfg, resolve=False))
    sweep_dir = Path(str(HydraConfig.get().sweep.dir))
    for folder in (sweep_dir, sweep_dir / HYDRA_DIR):
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

    setattr(redacting, "gkd_redacting", True)  # noqa: B010 - a mark on a function, for the check above
    logging.setLogRecordFactory(redacting)


def _job(cfg) -> Optional[float] | PointFailed:
    """The Hydra job: :func:`train`, with one-line errors. A single run exits 2 (config error, busy or mismatched
    folder) or 1 (failed run); in a sweep the error is re-raised so Hydra records the point as failed and the
    other points go on."""
    from gkd_harness.harness.config.schema import ConfigError
    from gkd_harness.harness.launcher.objective import check_optimized_metric, optimized_value
    from gkd_harness.harness.launcher.process import Interrupted, TrainingFailed
    from gkd_harness.harness.launcher.run import train
    from gkd_harness.harness.launcher.wandb_env import experiment_name
    from gkd_harness.harness.store.files import RunFolderError

    multirun = is_multirun()
    try:
        _scrub_sweep_files(cfg)
        check_optimized_metric(cfg.run.optimized_metric)
        train(cfg, experiment=experiment_name(), hydra_task_cfg=cfg, multirun=multirun)
    except (ConfigError, TrainingFailed, RunFolderError, OSError) as e:
        from gkd_harness.harness.store.files import os_error_line

        code, what = _exit_code(e)
        from gkd_harness.harness.config.text import console_safe

        line = console_safe(os_error_line(e) if isinstance(e, OSError) else str(e), multiline=True)
        print(f"gkd-train: {what}: {line}", file=sys.stderr)
        if _verbose(cfg):
            raise
        if multirun:
            return PointFailed(code, f"{type(e).__name__}: {line}", refused=what == "refused")
        sys.exit(code)
    except Interrupted as e:  # preemption, time-out, Ctrl-C: the run is recorded as interrupted; the sweep ends
        print(
            f"gkd-train: {e} (summary.json says interrupted; rerun the same command to restart, or add "
            "run.resume=true)",
            file=sys.stderr,
        )
        sys.exit(e.exit_code)
    # a sweeper plugin optimises what the job returns: run.optimized_metric's value, or nothing
    try:
        return optimized_value(cfg.run.optimized_metric, Path(str(cfg.run.output_dir)), dry_run=bool(cfg.run.dry_run))
    except ConfigError as e:  # the run completed, but never logged the metric: the point has no score
        print(f"gkd-train: no score: {e}", file=sys.stderr)
        return math.nan


def _one_line_config_errors(run_and_report, job_started: list):
    """Hydra's ``run_and_report`` with its own config errors (unknown key, unknown group option, bad override
    syntax), raised before any job starts, turned into one line and exit 2 instead of its multi-line message and
    exit 1; an ``OSError`` of Hydra's own folders and files (read-only: exit 2; full disk: exit 1) likewise.
    Errors from inside a job (``job_started`` not empty), and everything under ``HYDRA_FULL_ERROR=1``, go to
    Hydra unchanged."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from gkd_harness.harness.launcher.compose import composition_error, print_full_error

    def guarded_run_and_report(func):
        def composed():
            try:
                return func()
            except (HydraException, OmegaConfBaseException, ValueError) as e:  # ValueError: `loss=null`
                if job_started:
                    raise
                error = composition_error(e, sys.argv[1:])
                if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the traceback, with the same message and exit code
                    print_full_error(e, error)
                print(f"gkd-train: invalid config: {error}", file=sys.stderr)
                sys.exit(EXIT_CONFIG)
            except OSError as e:  # Hydra's own run folder or log file (a read-only or full disk): one line
                if os.environ.get("HYDRA_FULL_ERROR") == "1":
                    raise
                from gkd_harness.harness.config.text import console_safe
                from gkd_harness.harness.store.files import os_error_line

                code, what = _exit_code(e)
                print(f"gkd-train: {what}: {console_safe(os_error_line(e), limit=480)}", file=sys.stderr)
                sys.exit(code)

        return run_and_report(composed)

    return guarded_run_and_report


def _job_leaving_no_empty_folder(cfg) -> Optional[float] | PointFailed:
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

    # Hydra has no public hook for the errors it raises while composing the config, before any job starts: its
    # private run_and_report is wrapped for the length of this call (everything else here is public API).
    import hydra._internal.utils as hydra_utils

    from gkd_harness.harness.launcher.compose import CONFIG_NAME, CONFIG_PATH, register

    register()
    _redact_log_records()
    job_started: list = []

    def job(cfg) -> Optional[float] | PointFailed:
        job_started.append(True)
        return _job_leaving_no_empty_folder(cfg)

    original = hydra_utils.run_and_report
    hydra_utils.run_and_report = _one_line_config_errors(original, job_started)
    try:
        hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=CONFIG_NAME)(job)()
    finally:
        hydra_utils.run_and_report = original


def _config_files():
    from importlib.resources import files

    return files("gkd_harness.configs")


def _train_defaults() -> dict[str, Optional[str]]:
    """``train.yaml``'s defaults list as ``{group: default option}``, in its order (``optional local`` as
    ``local``)."""
    import yaml

    chosen: dict[str, Optional[str]] = {}
    for entry in yaml.safe_load(_config_files().joinpath("train.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            for group, option in entry.items():
                chosen[str(group).split()[-1]] = option
    return chosen


def _group_choices() -> list[tuple[str, list[str], Optional[str]]]:
    """``(group, options, default)`` of every config group a user chooses from, read from the config files (no
    Hydra): groups with more than one preset (not ``gkd: default``, ``signoff: default``), not the git-ignored
    ``local/`` nor Hydra's own; the typed schemas are not files, so they are no choice either; plus
    ``hydra/launcher``. The default is ``train.yaml``'s defaults list's."""
    root, chosen = _config_files(), _train_defaults()
    groups = []
    for folder in sorted((f for f in root.iterdir() if f.is_dir()), key=lambda f: f.name):
        options = sorted(f.name[: -len(".yaml")] for f in folder.iterdir() if f.name.endswith(".yaml"))
        if folder.name not in _NOT_A_CHOICE and len(options) > 1:
            groups.append((folder.name, options, chosen.get(folder.name)))
    launchers = root.joinpath("hydra", "launcher")
    options = sorted(["basic", *(f.name[: -len(".yaml")] for f in launchers.iterdir() if f.name.endswith(".yaml"))])
    groups.append(("hydra/launcher", options, "basic"))
    return groups


def help_text() -> str:
    """``gkd-train --help``, from the config files alone (no Hydra, no composing: Hydra's own help formats every
    config group by deep-copying its config store once per group, seconds on a loaded machine). The header and
    footer are ``hydra.help``'s in ``configs/hydra/default.yaml``."""
    import textwrap

    import yaml

    text = yaml.safe_load(_config_files().joinpath("hydra", "default.yaml").read_text())["help"]
    lines = ["Config groups (group=option; * the default):"]
    for group, options, default in _group_choices():
        shown = ", ".join(f"{o}*" if o == default else o for o in options)
        line = f"{group}: {shown}{'' if default in options else ' (none by default)'}"
        lines += textwrap.wrap(line, width=116, initial_indent="  ", subsequent_indent="      ")
    keys = ["run", *(g for g in _train_defaults() if g not in ("experiment", *_NOT_A_CHOICE))]
    lines += [
        "",
        "Site settings (partition, paths, wandb entity): configs/local/default.yaml, git-ignored; start from",
        "configs/local/slurm.example.yaml.",
        "",
        f"Any key can be overridden (key=value): {', '.join(f'{k}.*' for k in keys)}.",
        "gkd-train --cfg job [overrides] prints the composed config with every default.",
        "",
    ]
    return f"{text['header'].rstrip()}\n\n" + "\n".join(lines) + "\n" + text["footer"].rstrip() + "\n"


def hydra_command_line(args: Sequence[str]):
    """The command line as Hydra itself reads it (``argparse.Namespace``: ``overrides``, ``multirun``, ``cfg``,
    ``config_dir``, ...): a flag's value (``-cd myconf``, ``-c job``, ``-cn train``) is never taken for an
    override. Exits 2 with argparse's usage line on a flag Hydra does not know, as Hydra would."""
    # Hydra has no public parser for its command line: its own (the one hydra.main uses) is private
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(list(args))


def _only_overrides(parsed) -> bool:
    """True when the command line holds overrides and no Hydra flag: the packaged config, one run."""
    flags = {k: v for k, v in vars(parsed).items() if k != "overrides"}
    return not any(flags.values())


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
        from gkd_harness.harness.store.provenance import version_line

        print(version_line("gkd-train"))
        return
    if "--help" in args or "-h" in args:
        sys.stdout.write(help_text())
        return
    from gkd_harness.harness.config.schema import ConfigError
    from gkd_harness.harness.config.secrets import secret_overrides, secret_refusal

    parsed = hydra_command_line(args)
    overrides = list(parsed.overrides)
    try:
        for key in secret_overrides(overrides):
            raise ConfigError(key, secret_refusal(key))
        dry = (_flag_value(overrides, "run.dry_run") or "").lower() in ("true", "1", "yes")
        # the fast dry run composes the packaged config itself; any Hydra flag (-m, -cd, -cn, -c, ...) goes to
        # Hydra, whose job prints the same plan
        if dry and _only_overrides(parsed):
            from gkd_harness.harness.launcher.compose import compose_point
            from gkd_harness.harness.launcher.objective import check_optimized_metric
            from gkd_harness.harness.launcher.run import train

            point = compose_point(overrides)
            check_optimized_metric(point.cfg.run.optimized_metric)
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
    # `python -m gkd_harness.harness.launcher.cli`: run the importable module's main (one module object per file)
    from gkd_harness.harness.launcher.cli import main as _module_main

    _module_main()
