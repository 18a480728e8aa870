"""ms-swift's command-line flags as a table, so that ``run.extra_args`` is checked in milliseconds by the flags of
ms-swift's own argument classes (torch-free: this module never imports ms-swift).

The table is extracted once from the argparse parser ms-swift builds from its argument dataclass
(:func:`gkd_harness.harness.launcher.extra_args.extract_table`: ``RLHFArguments`` for ``swift rlhf``,
``MegatronRLHFArguments`` for ``megatron rlhf``), one JSON file per backend and per installed version of the
packages those classes come from (:data:`VERSIONED`), in the harness's cache folder (:func:`cache_dir`).
``launch/setup_env.sh`` builds it; otherwise the first check that needs it does (about 20 s, importing ms-swift).

Each row is one argparse action: its flags, ``dest``, ``nargs``, ``const``, ``type`` (``int``, ``float``,
``str``, ``bool`` for transformers' ``string_to_bool``, ``dict``) and ``choices`` (``Literal`` and ``Enum``
fields, as strings). :func:`refusal` rebuilds a plain argparse parser from it and parses the flags as ms-swift's
parser does, except that an abbreviation of a flag is refused (a flag must be a field's own name, so ``--bet``
cannot set ``--beta`` behind the harness's back) and a flag that sets a field the harness sets (``--no_bf16``) is
refused naming the config key.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from gkd_harness.harness.contract import CACHE_ENV, cache_dir

#: the table's format; a change makes every cached table stale
TABLE_FORMAT = 1
#: per backend, the distributions whose argument dataclasses make up its flags (a cached table is per version)
VERSIONED: Dict[str, tuple] = {
    "swift": ("ms-swift", "transformers", "trl", "peft"),
    "megatron": ("ms-swift", "transformers", "trl", "peft", "megatron-core", "mcore-bridge"),
}


def backend_name(megatron: bool) -> str:
    return "megatron" if megatron else "swift"


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "none"


def table_path(megatron: bool, env: Optional[Mapping[str, str]] = None) -> Path:
    """Where the table of this backend and these installed versions lives, e.g.
    ``swift-flags-ms-swift4.6.0-transformers5.19.0-1a2b3c4d.json`` (the hash covers every versioned package)."""
    backend = backend_name(megatron)
    versions = [(d, _version(d)) for d in VERSIONED[backend]]
    digest = hashlib.sha256(json.dumps([TABLE_FORMAT, versions]).encode()).hexdigest()[:8]
    return cache_dir(env) / f"{backend}-flags-ms-swift{versions[0][1]}-transformers{versions[1][1]}-{digest}.json"


def load_table(megatron: bool, env: Optional[Mapping[str, str]] = None) -> Optional[List[Dict[str, Any]]]:
    """The cached table (None when there is none for the installed versions, or it is unreadable)."""
    try:
        data = json.loads(table_path(megatron, env).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT or not isinstance(data.get("actions"), list):
        return None
    return data["actions"]


def save_table(actions: List[Dict[str, Any]], megatron: bool, env: Optional[Mapping[str, str]] = None) -> Path:
    """Writes the table atomically (ranks and sweep points may build it at the same time)."""
    path = table_path(megatron, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": TABLE_FORMAT, "backend": backend_name(megatron), "actions": actions}))
    os.replace(tmp, path)
    return path


def string_to_bool(v: str) -> bool:
    """transformers' ``hf_argparser.string_to_bool``, the type of every bool field."""
    if isinstance(v, bool):
        return v
    if v.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if v.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {v} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


TYPES: Dict[str, Callable[..., Any]] = {"int": int, "float": float, "str": str, "bool": string_to_bool, "dict": dict}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # never print usage or exit: the caller words the refusal
        raise argparse.ArgumentError(None, message)


def parser_from_table(actions: Sequence[Mapping[str, Any]]) -> argparse.ArgumentParser:
    """A plain argparse parser with ms-swift's flags, types, choices and nargs; only the flags given end up in the
    namespace (``argument_default=SUPPRESS``)."""
    parser = _Parser(
        prog="ms-swift", add_help=False, allow_abbrev=False, exit_on_error=False, argument_default=argparse.SUPPRESS
    )
    for a in actions:
        if a.get("action") == "store_false":
            parser.add_argument(*a["flags"], dest=a["dest"], action="store_false")
            continue
        kwargs: Dict[str, Any] = {"dest": a["dest"], "type": TYPES.get(a.get("type") or "str", str)}
        if a.get("nargs") is not None:
            kwargs["nargs"] = a["nargs"]
        if a.get("nargs") == "?":
            kwargs["const"] = a.get("const")
        if a.get("choices") is not None:
            kwargs["type"] = str  # ms-swift maps each choice's string back to the choice (make_choice_type_function)
            kwargs["choices"] = a["choices"]
        parser.add_argument(*a["flags"], **kwargs)
    return parser


def refusal(
    extra_args: Sequence[str], actions: Sequence[Mapping[str, Any]], harness_key: Callable[[str], Any]
) -> Optional[str]:
    """Why ms-swift's flags refuse ``extra_args`` (None: they accept them). ``harness_key(dest)`` is the config
    key that sets a field (``None``: the harness owns it; ``False``: free), as in
    :func:`gkd_harness.harness.config.extra_args_rules.harness_key`."""
    parser = parser_from_table(actions)
    try:
        namespace, unknown = parser.parse_known_args(list(extra_args))
    except argparse.ArgumentError as e:
        return f"ms-swift refuses it: {e}"
    if unknown:
        flags = [t for t in unknown if t.startswith("-")]
        if flags:
            return f"ms-swift has no flag {' '.join(flags)}"
        return f"no ms-swift flag takes the value {' '.join(unknown)}"
    for dest in vars(namespace):
        key = harness_key(dest)
        if key is None:
            return f"it sets {dest}, which the harness sets and cannot be overridden"
        if key:
            return f"it sets {dest}, which the harness sets: use the config key {key} instead"
    return None


__all__ = [
    "CACHE_ENV",
    "cache_dir",
    "table_path",
    "load_table",
    "save_table",
    "parser_from_table",
    "refusal",
    "string_to_bool",
]
