"""Packaging: a built wheel runs outside the repository (cluster users install wheels into images), and lives
with other code: every module it installs sits under ``gkd_harness`` (a notebook folder with its own ``analysis/``
package still loads a sweep), its version comes from git, and its declared requirements hold (``pip check``).

The wheel is built from this checkout, installed without ``-e`` into a fresh venv that reuses this environment's
site-packages for the heavy dependencies (``--system-site-packages`` over a venv made by this interpreter would not
see them, so the new venv gets a ``.pth`` file pointing at them instead; the harness packages themselves come only
from the wheel). Then ``gkd-train run.dry_run=true`` and ``gkd-analyze --help`` run from a folder outside the
repository.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _listed_packages() -> set[str]:
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r"^packages = \[(.*?)\]", text, flags=re.M | re.S)
    return set(re.findall(r'"([\w.]+)"', m.group(1)))


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists its packages (each folder mapped under ``gkd_harness``); a new package folder must be added."""
    found = {
        "gkd_harness." + ".".join(p.parent.relative_to(REPO).parts)
        for p in REPO.glob("*/**/__init__.py")
        if p.parent.relative_to(REPO).parts[0] in ("harness", "launch", "analysis", "bench")
    }
    assert found <= _listed_packages(), sorted(found - _listed_packages())
    assert {"gkd_harness", "gkd_harness.configs"} <= _listed_packages()
    assert all(name.split(".")[0] == "gkd_harness" for name in _listed_packages())  # one import namespace


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("gkd_harness-*.whl")
    return whl


def _head() -> str:
    return subprocess.check_output(["git", "-C", str(REPO), "rev-parse", "HEAD"], text=True).strip()


def test_wheel_holds_the_config_tree_under_one_namespace(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "gkd_harness/configs/train.yaml",
        "gkd_harness/configs/experiment/smoke.yaml",
        "gkd_harness/configs/signoff/default.yaml",
        "gkd_harness/configs/hydra/launcher/submitit_slurm.yaml",
        "gkd_harness/harness/config/schema.py",
        "gkd_harness/launch/slurm.py",
        "gkd_harness/analysis/cli.py",
        "gkd_harness/bench/cli.py",
        "gkd_harness/_version.py",
    ):
        assert required in names, required
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"gkd_harness"}, tops  # no top-level harness/, analysis/, launch/, bench/
    # the version is git's, not a static number, and the wheel records its commit
    assert not wheel.name.startswith("gkd_harness-0.1.0-"), wheel.name
    stamp = zipfile.ZipFile(wheel).read("gkd_harness/_version.py").decode()
    assert f"commit = 'g{_head()[:7]}" in stamp, stamp


def _venv_with_wheel(wheel: Path, env_dir: Path, deps: bool) -> Path:
    """A fresh venv holding the wheel; this environment's site-packages reach it through a ``.pth`` file (the heavy
    dependencies, not downloaded again). ``deps``: pip resolves the wheel's requirements against them (no index),
    so a requirement they do not satisfy fails the install."""
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site_dir = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # the dependencies of this environment, but not its editable gkd-harness (its finder and .pth are left out)
    deps_dirs = [
        p
        for p in dict.fromkeys([*site.getsitepackages(), *sys.path])
        if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()
    ]
    (site_dir / "_deps.pth").write_text("\n".join(deps_dirs) + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-index",
            "-q",
            *([] if deps else ["--no-deps"]),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    return py


def _clean_env(env_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}:/usr/bin:/bin"
    return env


def test_wheel_metadata_carries_the_license_and_classifiers(wheel):
    """Issue 47, item 9: before, the wheel had no license field, no LICENSE file and no classifiers."""
    z = zipfile.ZipFile(wheel)
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "Classifier: Programming Language :: Python :: 3.11" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    requires = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Requires-Dist: ")]
    torch = next(r for r in requires if r.startswith("torch"))
    assert "<" in torch, torch  # an upper bound: a fresh venv never pulls an untested torch


def test_wheel_installs_with_its_declared_requirements_and_pip_check_is_clean(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    py = _venv_with_wheel(wheel, env_dir, deps=True)
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "check"], capture_output=True, text=True, timeout=300
    )
    assert check.returncode == 0, check.stdout + check.stderr
    got = subprocess.run(
        [str(py), "-c", "from importlib.metadata import version; print(version('gkd-harness'))"],
        cwd=tmp_path,
        env=_clean_env(env_dir),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0 and got.stdout.strip() != "0.1.0" and f"+g{_head()[:7]}" in got.stdout, got


def test_a_notebook_with_its_own_analysis_package_loads_a_sweep(wheel, tmp_path):
    """The README's notebook import, from a folder whose own ``analysis/`` and ``launch/`` packages shadow any
    top-level module of those names (the folder comes first on ``sys.path``)."""
    from gkd_harness.bench.synthetic import write_sweep

    env_dir = tmp_path / "venv"
    py = _venv_with_wheel(wheel, env_dir, deps=False)
    notebook = tmp_path / "my-ml-project"
    for own in ("analysis", "launch"):
        (notebook / own).mkdir(parents=True)
        (notebook / own / "__init__.py").write_text(f"WHOSE = 'the notebook project: {own}'\n")
    write_sweep(notebook / "smoke")
    readme = (REPO / "README.md").read_text()
    block = re.search(r"In a notebook.*?```python\n(.*?)```", readme, flags=re.S).group(1)
    code = block.replace('"outputs/multirun/smoke"', '"smoke"') + (
        "\nimport analysis, launch, gkd_harness\nprint(analysis.WHOSE, '|', launch.WHOSE, '|', gkd_harness.__file__)\n"
    )
    proc = subprocess.run(
        [str(py), "-c", code], cwd=notebook, env=_clean_env(env_dir), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert "the notebook project: analysis | the notebook project: launch" in last and str(REPO) not in last, last


def test_installed_wheel_runs_outside_the_repository(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    py = _venv_with_wheel(wheel, env_dir, deps=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env(env_dir)
    where = subprocess.run(
        [
            str(py),
            "-c",
            "import gkd_harness.harness, gkd_harness.configs; "
            "print(gkd_harness.harness.__file__); print(gkd_harness.configs.__file__); "
            "from gkd_harness.harness.store.provenance import git_state; print(git_state())",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr
    assert str(REPO) not in where.stdout, f"the harness came from the repository, not the wheel: {where.stdout}"
    assert f"'harness_commit': '{_head()[:7]}" in where.stdout  # a wheel install records the commit it was built from

    gkd_train = env_dir / "bin" / "gkd-train"
    dry = subprocess.run(
        [str(gkd_train), "run.dry_run=true", f"run.output_dir={tmp_path / 'r'}"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-3000:]
    assert "swift rlhf" in dry.stdout and "--external_plugins" in dry.stdout
    plugin = dry.stdout.split("--external_plugins")[1].split()[0]
    assert str(REPO) not in plugin and plugin.endswith("gkd_harness/harness/rank/plugin.py")

    analyze = subprocess.run(
        [str(env_dir / "bin" / "gkd-analyze"), "--help"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert analyze.returncode == 0, analyze.stderr[-3000:]
    assert "gkd-analyze" in analyze.stdout
