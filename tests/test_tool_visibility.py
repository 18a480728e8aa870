"""The code is visible to the standard tools (issue 39): ``gkd_harness.*`` resolves, for Python, mypy and jedi, to
this checkout's files under ``gkd_harness/``, from any working folder (the editable install is a static ``.pth`` of
the repository, no import hook), with one module object per file; and the package is marked typed.

Each check runs in a fresh interpreter started outside the repository, as an editor or a type checker would.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULES = {
    "gkd_harness.harness.contract": REPO / "gkd_harness" / "harness" / "contract.py",
    "gkd_harness.analysis.sweep.evidence": REPO / "gkd_harness" / "analysis" / "sweep" / "evidence.py",
}


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_mypy_resolves_the_namespace_to_this_checkout(tmp_path):
    proc = _run(
        """
        import sys
        from mypy.build import default_data_dir
        from mypy.modulefinder import FindModuleCache, compute_search_paths
        from mypy.options import Options
        opts = Options()
        opts.python_executable = sys.executable
        finder = FindModuleCache(compute_search_paths([], opts, default_data_dir()), None, opts)
        for name in sys.argv[1:] or %r:
            print(name, finder.find_module(name))
        """
        % (list(MODULES),),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    found = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    for name, path in MODULES.items():
        assert Path(found[name]) == path, (name, found[name])


def test_jedi_goes_to_the_checkout_file(tmp_path):
    jedi = pytest.importorskip("jedi")
    for name, path in MODULES.items():
        code = f"import {name}"
        (definition,) = jedi.Script(code=code, path=str(tmp_path / "notebook.py")).goto(1, len(code) - 1)
        assert Path(definition.module_path) == path, (name, definition.module_path)


def test_one_module_object_per_file(tmp_path):
    """The repository's top-level folders are links into gkd_harness/: importing one under its bare name would make
    a second module object for the same file, so it is refused with a line that says what to import."""
    proc = _run(
        """
        import sys
        sys.path.insert(0, %r)
        import gkd_harness.harness.contract as a
        import importlib
        assert a.__file__.endswith("gkd_harness/harness/contract.py"), a.__file__
        for bare in ("harness", "analysis", "launch", "bench"):
            try:
                importlib.import_module(bare)
            except ImportError as e:
                print(bare, "refused:", e)
            else:
                print(bare, "IMPORTED")
        """
        % str(REPO),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all("refused: import gkd_harness." in line for line in lines), lines


def test_the_layout_folders_are_links_into_the_package():
    for folder in ("harness", "analysis", "launch", "bench", "configs"):
        link = REPO / folder
        assert link.is_symlink() and link.resolve() == REPO / "gkd_harness" / folder, folder
    assert (REPO / "gkd_harness" / "py.typed").is_file()
    init = (REPO / "gkd_harness" / "__init__.py").read_text()
    assert "__path__" not in init  # no search-path extension that static tools cannot follow
