"""``loss.precision=candidate``: refuse a candidate that cannot run, before any model loads.

Two steps, both before anything is written or loaded:

1. in this process, torch-free: ``loss.source`` is set, names an existing ``.py`` file (or a module whose file can
   be found without importing it), the file parses, and it defines ``gkd_loss`` at top level;
2. unless ``run.dry_run``: the real import in a fresh process (``python -m gkd_harness.harness.loss.candidate SOURCE``), which
   checks importability, the interface and the signatures against the installed ms-swift's. The answer is cached
   per source and content, so a sweep checks each candidate once.

Every refusal is a :class:`~gkd_harness.harness.config.schema.ConfigError` on ``loss.source`` whose message names the file and
what is missing. ``loss.source`` and ``loss.name`` are the candidate's keys: a sweep
``loss=original,candidate loss.source=X loss.name=N`` sets them on every point, and another precision never carries
them (:class:`~gkd_harness.harness.config.schema.LossConfig` drops them, and neither names a run folder:
``configs/hydra/default.yaml``), so the original point keeps its folder, its config and its completed run.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

from gkd_harness.harness.config.schema import ConfigError, TrainConfig
from gkd_harness.harness.config.source_files import find_module_file
from gkd_harness.harness.contract import CANDIDATE

KEY = "loss.source"
_CHECKED: Dict[Tuple[str, str], Optional[str]] = {}  # (source, sha256) -> refusal or None


def _static_check(source: str) -> Optional[Path]:
    """The candidate's file after the torch-free checks (None for a module found only by importing)."""
    p = Path(source).expanduser()
    if source.endswith(".py") or "/" in source or p.exists():
        if not p.exists():
            raise ConfigError(KEY, f"{p}: no such file")
        if not p.is_file():
            raise ConfigError(KEY, f"{p}: not a file")
        path, attr = p.resolve(), None
    else:
        module, _, attr = source.partition(":")
        if importlib.util.find_spec(module.split(".")[0]) is None:
            raise ConfigError(KEY, f"{source}: no module named {module.split('.')[0]!r}")
        found = find_module_file(module)
        if found is None:
            return None
        path = found
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(KEY, f"{path}: does not parse: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if not attr:
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        names |= {a.asname or a.name for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        if "gkd_loss" not in names:
            raise ConfigError(KEY, f"{path}: no gkd_loss (a candidate implements ms-swift's gkd_loss.py interface)")
    return path


def _import_check(source: str, name: Optional[str], path: Optional[Path]) -> Optional[str]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path else ""
    key = (source, digest)
    if key not in _CHECKED:
        cmd = [sys.executable, "-m", "gkd_harness.harness.loss.candidate", source] + ([name] if name else [])
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the folder holding gkd_harness/
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        _CHECKED[key] = None if proc.returncode == 0 else (lines[-1] if lines else f"check exited {proc.returncode}")
    return _CHECKED[key]


def validate_candidate(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` on ``loss.source`` for a candidate that cannot run (see the module docstring)."""
    source = cfg.loss.source
    if cfg.loss.precision != CANDIDATE:
        return  # not the candidate's point: LossConfig dropped the source a sweep sets on every point
    if not source or not str(source).strip():
        raise ConfigError(KEY, "must be set with loss=candidate: PATH.py or package.module[:attr]")
    source = str(source).strip()
    path = _static_check(source)
    if cfg.run.dry_run:
        return
    refusal = _import_check(source, cfg.loss.name, path)
    if refusal:
        raise ConfigError(KEY, refusal)


__all__ = ["validate_candidate"]
