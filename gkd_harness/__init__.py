"""gkd-harness's one import namespace: ``gkd_harness.harness``, ``gkd_harness.analysis``, ``gkd_harness.launch``,
``gkd_harness.bench`` and ``gkd_harness.configs``.

An installed wheel holds them as subpackages of this package, so a project with its own ``analysis/`` or
``launch/`` package can import both (``from gkd_harness.analysis.load import load_sweep``). A source checkout keeps
them as the repository's top-level folders: this package's search path then also holds the repository root, so
``gkd_harness.analysis`` is ``<repository>/analysis`` with or without an install.
"""
from pathlib import Path as _Path

_ROOT = _Path(__file__).resolve().parent.parent
if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "harness" / "__init__.py").is_file():  # a source checkout
    __path__.append(str(_ROOT))  # noqa: F821 - a package's __path__
