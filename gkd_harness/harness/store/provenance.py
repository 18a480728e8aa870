"""Provenance of a run: which harness tree and which loss code produced it (summary.json ``provenance``).

* ``harness_commit`` / ``harness_dirty``: ``git rev-parse HEAD`` and whether ``git status --porcelain`` lists
  anything, in the tree this package was imported from; for an installed wheel (no git tree), the short commit and
  dirty flag its build recorded (``gkd_harness/_version.py``, setuptools-scm), None where there is none;
* ``loss_sha256``: sha256 of the loss implementation the run used. ``native``: upstream's installed
  ``swift/rlhf_trainers/gkd_loss.py`` (found through the ms-swift distribution, without importing swift); every
  other precision: the harness's own ``harness/loss/*.py`` (names and contents, in name order); ``candidate``: the
  file ``loss.source`` names (a ``.py`` path, or a module's file found without importing it; the same hash as
  ``gkd_harness.harness.loss.candidate.loss_source_sha256``); ``loss_code``: the file or folder hashed;
* ``rank_sha256``: sha256 of the rank-side code (``harness/rank/*.py``), which ms-swift loads into every rank;
  ``hashed`` says what each hash covers (the sign-off's identity of a run: loss code, rank-side code, ms-swift and
  the resolved config's training keys, not the tree's commit);
* ``ms_swift``: the installed ms-swift version.

Also the versions every entry point and summary.json report: :func:`harness_version` (this package) and
:func:`package_versions` (the packages whose arithmetic the results depend on).

Torch-free and import-free of the other layers (the store layer imports only config).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from gkd_harness.harness.config.source_files import source_file
from gkd_harness.harness.contract import CANDIDATE, DATA_KEYS, NATIVE

__all__ = [
    "harness_code_sha256",
    "provenance",
    "git_state",
    "loss_code_path",
    "sha256_path",
    "harness_version",
    "version_line",
    "package_versions",
]

PACKAGE = "gkd-harness"

_HARNESS_DIR = Path(__file__).resolve().parents[1]  # gkd_harness/harness/
_CHECKOUT = _HARNESS_DIR.parents[1]  # the folder holding gkd_harness/: a git checkout, or site-packages
_UPSTREAM_LOSS = "swift/rlhf_trainers/gkd_loss.py"


def _built_version() -> Dict[str, Any]:
    """What the build wrote into ``gkd_harness/_version.py`` (setuptools-scm): ``version``, ``commit``
    (``"g<short sha>"``) and ``dirty``; empty where it is absent (a checkout never installed)."""
    try:
        from gkd_harness import _version  # written at build or install time, git-ignored
    except ImportError:
        return {}
    return {k: getattr(_version, k, None) for k in ("version", "commit", "dirty")}


def _installed_version() -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return _built_version().get("version")


def harness_version() -> str:
    """This harness's version (summary.json, the resume fingerprint, every ``--version``).

    From a git checkout: the installed version's public part and the tree as it is now, ``0.1.dev5+g1a2b3c4d5``
    (``.dirty`` with uncommitted changes), since an editable install's metadata keeps the version of the commit it
    was installed at. From an installed wheel: the version it was built with (setuptools-scm,
    ``0.1.devN+g<commit>`` between tags). ``"unknown"`` when neither is known.
    """
    installed = _installed_version()
    state = git_state()
    if state["harness_commit"] is None:
        return installed or "unknown"
    public = (installed or "0").split("+")[0]
    return f"{public}+g{state['harness_commit'][:9]}{'.dirty' if state['harness_dirty'] else ''}"


def version_line(prog: str) -> str:
    """What every entry point's ``--version`` prints: ``gkd-train 0.1.0 (gkd-harness)``."""
    return f"{prog} {harness_version()} ({PACKAGE})"


def package_versions() -> Dict[str, Optional[str]]:
    """Versions of the packages whose arithmetic the results depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out: Dict[str, Optional[str]] = {}
    for name in ("ms-swift", "torch", "transformers", "trl", "wandb"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def git_state(root: Path = _CHECKOUT) -> Dict[str, Any]:
    """``{"harness_commit": sha or None, "harness_dirty": bool or None}`` of the git tree at ``root``."""

    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD") if (root / ".git").exists() else None
    if not commit:  # an installed wheel: the commit it was built from, as its build recorded it
        built = _built_version() if root == _CHECKOUT else {}
        node = built.get("commit")
        return {
            "harness_commit": node[1:] if node and node.startswith("g") else node,
            "harness_dirty": built.get("dirty"),
        }
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"harness_commit": commit.strip(), "harness_dirty": None if status is None else bool(status.strip())}


def loss_code_path(precision: Optional[str], source: Optional[str] = None) -> Optional[Path]:
    """The file (``native``: upstream's installed gkd_loss.py; ``candidate``: the ``loss.source`` file) or folder
    (the harness's ``harness/loss``) whose code computes a run's loss."""
    if precision == CANDIDATE:
        return source_file(source)
    if precision == NATIVE:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            path = Path(str(distribution("ms-swift").locate_file(_UPSTREAM_LOSS)))
        except PackageNotFoundError:
            return None
        return path if path.exists() else None
    return _HARNESS_DIR / "loss"


@functools.lru_cache(maxsize=1)
def harness_code_sha256() -> str:
    """sha256 of the code that runs a training and launches it: every ``*.py`` under ``gkd_harness/harness/``
    and ``gkd_harness/launch/`` (relative path and contents, in path order). The resume fingerprint's code
    identity: a commit that touches only docs, tests, analysis or benchmarks leaves it unchanged, and so does
    package metadata (a stale ``egg-info``). Cached for one point: ``launcher.run.train`` clears the cache when a
    point starts, so a mid-sweep edit (``git pull`` while point 1 trains) is what point 2 records (issue 48, 10)."""
    h = hashlib.sha256()
    for root in (_HARNESS_DIR, _HARNESS_DIR.parent / "launch"):
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root.parent).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def sha256_path(path: Path) -> str:
    """sha256 of a file, or of a folder's ``*.py`` files (each name and content, in name order)."""
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(path.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def data_sha256(paths: Mapping[str, Any]) -> Dict[str, Optional[str]]:
    """sha256 of each data file a run reads, by its config key (:data:`gkd_harness.harness.contract.DATA_KEYS`:
    the training set, the held-out set): ``paths`` maps a key to the file (a flat config, or the launch plan's
    resolved inputs). A key that names no local file (null: embedded, whose held-out split derives from the
    training file; a hub id) is left out. Read in 1 MiB blocks: a large dataset is never held whole."""
    out: Dict[str, Optional[str]] = {}
    for key in DATA_KEYS:
        value = paths.get(key)
        if not isinstance(value, (str, Path)) or not value or not Path(value).is_file():
            continue
        h = hashlib.sha256()
        with open(value, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[key] = h.hexdigest()
    return out


def provenance(precision: Optional[str], source: Optional[str] = None) -> Dict[str, Any]:
    """The ``provenance`` block of summary.json for a run of ``loss.precision = precision`` (``source``: the
    candidate's ``loss.source``)."""
    from importlib.metadata import PackageNotFoundError, version

    out = git_state()
    code = loss_code_path(precision, source)
    out["loss_code"] = str(code) if code is not None else None
    out["loss_sha256"] = sha256_path(code) if code is not None and code.exists() else None
    rank = _HARNESS_DIR / "rank"
    out["rank_sha256"] = sha256_path(rank) if rank.is_dir() else None
    out["hashed"] = {  # what decides a run's result, and so its identity in the sign-off (docs/signoff.md)
        "loss_sha256": f"{code} (*.py names and contents, in name order)" if code is not None else None,
        "rank_sha256": f"{rank} (*.py names and contents, in name order): the code ms-swift loads into each rank",
        "not_hashed": "harness_commit / harness_dirty: the whole tree's state (docs, tests, analysis included), "
        "recorded for reference only",
    }
    try:
        out["ms_swift"] = version("ms-swift")
    except PackageNotFoundError:
        out["ms_swift"] = None
    return out
