"""``run.extra_args`` checked by ms-swift's own argument classes, before anything is launched (the dry run and
every real launch call :func:`check_with_swift` through :func:`gkd_harness.harness.launcher.plan.build_plan`; validation
checks them too where the table below is cached).

The harness's own rules (flags it sets, credential-looking flags) run at validation
(:mod:`gkd_harness.harness.config.extra_args_rules`, torch-free). The flags ms-swift knows come from the argparse parser it
builds from its argument dataclass (``RLHFArguments`` for ``swift rlhf``, ``MegatronRLHFArguments`` for
``megatron rlhf``), extracted once into a table per installed version (:mod:`gkd_harness.harness.config.swift_flags`):
importing ``swift.arguments`` takes 15 to 40 s, parsing against the table milliseconds. An unknown flag, a value
of the wrong type or outside a flag's choices is refused here instead of in ms-swift's ``remaining_argv`` error
after the models have loaded. Only the parser is built, never the dataclass (whose ``__post_init__`` would
resolve models and datasets). Costs nothing when the list is empty.

    python -m gkd_harness.harness.launcher.extra_args [--megatron]   # builds the table (launch/setup_env.sh runs it)
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence

from gkd_harness.harness.config.extra_args_rules import KEY, harness_key
from gkd_harness.harness.config.schema import ConfigError, MegatronBackendConfig, TrainConfig
from gkd_harness.harness.config.swift_flags import load_table, refusal, save_table, table_path
from gkd_harness.harness.fixtures import building
from gkd_harness.harness.fixtures.building import clock, exclusive, say

log = logging.getLogger("gkd_harness.train")
_TYPE_NAMES: Dict[Any, str] = {int: "int", float: "float", str: "str", dict: "dict"}


def _swift_parser(megatron: bool) -> argparse.ArgumentParser:
    """The parser ms-swift's ``parse_args`` builds (``swift.utils.utils.parse_args``)."""
    from swift.utils.utils import _patch_get_type_hints  # the type-hint patch ms-swift's own parse_args uses
    from transformers import HfArgumentParser

    if megatron:
        from swift.megatron.arguments import MegatronRLHFArguments as args_class
    else:
        from swift.arguments import RLHFArguments as args_class
    with _patch_get_type_hints():
        return HfArgumentParser([args_class], exit_on_error=False)


def _row(action: argparse.Action) -> Optional[Dict[str, Any]]:
    if isinstance(action, argparse._HelpAction) or not action.option_strings:
        return None
    row: Dict[str, Any] = {"flags": list(action.option_strings), "dest": action.dest}
    if isinstance(action, argparse._StoreFalseAction):
        return {**row, "action": "store_false"}
    typ = action.type
    choices = action.choices
    if isinstance(typ, type) and issubclass(typ, Enum) and choices is None:
        choices = [m.value for m in typ]
    if getattr(typ, "__name__", "") == "string_to_bool":
        name = "bool"
    else:
        name = _TYPE_NAMES.get(typ, "str")  # Path, accelerate's ParallelismConfig...: any string
    row.update(
        action="store",
        nargs=action.nargs,
        type=name,
        const=action.const if isinstance(action.const, (bool, int, float, str)) else None,
        choices=None if choices is None else [str(c) for c in choices],
    )
    return row


def extract_table(megatron: bool = False) -> List[Dict[str, Any]]:
    """The flag table of ms-swift's parser for ``swift rlhf`` (or ``megatron rlhf``); imports ms-swift."""
    return [r for r in map(_row, _swift_parser(megatron)._actions) if r is not None]


def flag_table(megatron: bool = False) -> Optional[List[Dict[str, Any]]]:
    """The cached table, built in a subprocess when missing (ms-swift's import stays out of this process: its
    log lines and logging set-up too). None, with a warning, when ms-swift's classes cannot be imported here
    (``megatron rlhf`` needs Transformer Engine). A build is never silent: one line when it starts, one every
    :data:`~gkd_harness.harness.fixtures.building.PROGRESS_EVERY_S` seconds, one when it is done; a second process that needs
    the table meanwhile waits on the build's lock and names its owner (:func:`gkd_harness.harness.fixtures.building.exclusive`)."""
    table = load_table(megatron)
    if table is not None:
        return table
    if megatron and importlib.util.find_spec("transformer_engine") is None:  # mcore-bridge imports it first thing
        log.warning(
            "run.extra_args not checked against ms-swift's flags: its Megatron argument classes need "
            "Transformer Engine, which is not installed here"
        )
        return None
    path = table_path(megatron)
    doing = f"building the table of ms-swift's flags once, for run.extra_args ({path.name}: imports ms-swift)"
    with exclusive(path.with_name(f".{path.name}.lock"), doing) as build:  # one build; a second process waits
        table = load_table(megatron)
        if table is not None:  # the process we waited for built it
            return table
        say(doing)
        proc = subprocess.Popen(_table_command(megatron), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while True:
            try:
                out, err = proc.communicate(timeout=building.PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                build.progress(f"still importing ms-swift's argument classes ({clock(build.elapsed())})", force=True)
        table = load_table(megatron)
        if table is not None:
            say(f"built the table of ms-swift's flags in {clock(build.elapsed())}")
    if table is None:
        lines = (err or out).strip().splitlines()
        log.warning(
            "run.extra_args not checked against ms-swift's flags: its argument classes do not import here (%s)",
            lines[-1] if lines else f"exit {proc.returncode}",
        )
    return table


def _table_command(megatron: bool) -> List[str]:
    """The process that builds the table (:func:`main`): ms-swift's import stays out of this one."""
    return [sys.executable, "-m", "gkd_harness.harness.launcher.extra_args", *(["--megatron"] if megatron else [])]


def swift_refusal(extra_args: Sequence[str], megatron: bool = False) -> str | None:
    """Why ms-swift's flags refuse ``extra_args`` (None: they accept them, or the table cannot be built here)."""
    table = flag_table(megatron)
    return None if table is None else refusal(extra_args, table, harness_key)


def check_with_swift(cfg: TrainConfig) -> None:
    """Raises :class:`ConfigError` naming ``run.extra_args`` when ms-swift's flags refuse them."""
    extra = list(cfg.run.extra_args)
    if not extra:
        return
    why = swift_refusal(extra, megatron=isinstance(cfg.backend, MegatronBackendConfig))
    if why:
        raise ConfigError(KEY, why)


def main(argv: Sequence[str]) -> int:
    megatron = "--megatron" in argv
    path = save_table(extract_table(megatron), megatron)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["check_with_swift", "swift_refusal", "flag_table", "extract_table"]
