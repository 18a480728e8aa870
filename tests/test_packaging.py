"""Packaging: a built wheel runs outside the repository (cluster users install wheels into images).

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
    """pyproject lists its packages (one is mapped from configs/); a new package folder must be added there."""
    found = {".".join(p.parent.relative_to(REPO).parts) for p in REPO.glob("*/**/__init__.py")
             if p.parent.relative_to(REPO).parts[0] in ("harness", "launch", "analysis", "bench")}
    assert found <= _listed_packages(), sorted(found - _listed_packages())
    assert "gkd_harness_configs" in _listed_packages()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(REPO)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("gkd_harness-*.whl")
    return whl


def test_wheel_holds_the_config_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("gkd_harness_configs/train.yaml", "gkd_harness_configs/experiment/smoke.yaml",
                     "gkd_harness_configs/signoff/default.yaml", "gkd_harness_configs/hydra/launcher/submitit_slurm.yaml",
                     "harness/config/schema.py", "launch/slurm.py", "analysis/cli.py", "bench/cli.py"):
        assert required in names, required


def test_installed_wheel_runs_outside_the_repository(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site_dir = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                            text=True).strip())
    # the dependencies of this environment, but not its editable gkd-harness
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (site_dir / "_deps.pth").write_text("\n".join(deps) + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                              "-q", str(wheel)], capture_output=True, text=True, timeout=600)
    if install.returncode != 0 and "no such option: --python" in install.stderr:  # pragma: no cover - old pip
        install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                                  str(site_dir), str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}:/usr/bin:/bin"
    where = subprocess.run([str(py), "-c", "import harness, gkd_harness_configs; print(harness.__file__); "
                            "print(gkd_harness_configs.__file__)"], cwd=elsewhere, env=env, capture_output=True,
                           text=True)
    assert where.returncode == 0, where.stderr
    assert str(REPO) not in where.stdout, f"the harness came from the repository, not the wheel: {where.stdout}"

    gkd_train = env_dir / "bin" / "gkd-train"
    dry = subprocess.run([str(gkd_train), "run.dry_run=true", f"run.output_dir={tmp_path / 'r'}"], cwd=elsewhere,
                         env=env, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-3000:]
    assert "swift rlhf" in dry.stdout and "--external_plugins" in dry.stdout
    plugin = dry.stdout.split("--external_plugins")[1].split()[0]
    assert str(REPO) not in plugin and plugin.endswith("harness/rank/plugin.py")

    analyze = subprocess.run([str(env_dir / "bin" / "gkd-analyze"), "--help"], cwd=elsewhere, env=env,
                             capture_output=True, text=True, timeout=300)
    assert analyze.returncode == 0, analyze.stderr[-3000:]
    assert "gkd-analyze" in analyze.stdout
