"""gkd-harness's one import namespace: ``gkd_harness.harness``, ``gkd_harness.analysis``, ``gkd_harness.launch``,
``gkd_harness.bench`` and ``gkd_harness.configs``.

They are ordinary subpackages, in this folder, in a checkout as in the wheel, so Python and every static tool
(mypy, pyright, jedi, an import-graph reader) resolve ``gkd_harness.harness.contract`` to the same file. The
repository's top-level ``harness/``, ``analysis/``, ``launch/``, ``bench/`` and ``configs/`` are links into this
folder (the layout the design card names), and a user's own ``analysis/`` package never collides with ours.
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__", "train", "analyze", "certify"]

#: the notebook API (gkd_harness.api) and ``__version__``, resolved on first use: ``import gkd_harness`` stays light
_API = ("train", "analyze", "certify")


def _distribution_version() -> str:  # not `_version`: that name is the submodule store.provenance reads
    """The installed distribution's version (setuptools-scm: ``0.1.devN+g<commit>`` between tags)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gkd-harness")
    except PackageNotFoundError:  # a source tree that was never installed
        try:
            from gkd_harness._version import version as built
        except ImportError:
            return "0.1.dev0"
        return str(built)


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read on first use: importlib.metadata is the slow part of a light import
        globals()["__version__"] = _distribution_version()
        return globals()["__version__"]
    if name in _API:
        from gkd_harness import api

        return getattr(api, name)
    raise AttributeError(f"module 'gkd_harness' has no attribute {name!r}")
