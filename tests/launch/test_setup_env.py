"""setup_env.sh's torch decision (launch/torch_choice.py) against both kinds of torch, without a download: the
check runs in a real interpreter that imports a stand-in ``torch`` package (the version string is all it reads),
and the install order is driven through its pip and probe seams."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gkd_harness.launch import torch_choice as tc

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "version,build",
    [
        ("2.13.0+cpu", "cpu"),
        ("2.13.0+cu130", "cuda"),
        ("2.13.0+cu126", "cuda"),
        ("2.13.0", "registry"),
        ("2.13.0+rocm6.4", "rocm"),
    ],
)
def test_build_of_names_both_kinds_of_version_string(version, build):
    assert tc.build_of(version) == build


def _check_with_stub_torch(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    pkg = tmp_path / "stub" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "torch_choice.py"), "check"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )


def test_a_cuda_build_is_accepted_with_one_line_and_its_size(tmp_path):
    """The old setup_env asserted ``+cpu`` and exited 1 on the registry's 2.13.0+cu130 (issue 24, item 1)."""
    p = _check_with_stub_torch(tmp_path, "__version__ = '2.13.0+cu130'\nclass version:\n    cuda = '13.0'\n")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and p.stderr == ""
    assert "2.13.0+cu130" in lines[0] and "CUDA 13.0" in lines[0] and "registry's build" in lines[0]
    assert " GB " in lines[0]


def test_the_cpu_build_passes_silently(tmp_path):
    p = _check_with_stub_torch(tmp_path, "__version__ = '2.13.0+cpu'\n")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")


def test_a_torch_that_does_not_import_fails_with_a_fix(tmp_path):
    p = _check_with_stub_torch(tmp_path, "raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
    assert p.returncode == 1
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "torch cannot be imported" in err[0] and "libtorch_cpu.so" in err[0]
    assert "fix: rm -rf .venv && bash launch/setup_env.sh" in err[0]


class _Pip:
    def __init__(self, fails: int):
        self.fails, self.calls = fails, []

    def __call__(self, args, quiet):
        self.calls.append(list(args))
        self.quiet = getattr(self, "quiet", []) + [quiet]
        return 1 if len(self.calls) <= self.fails else 0


def test_a_working_torch_of_the_pin_is_kept_whatever_its_build():
    pip = _Pip(0)
    assert tc.install(pip=pip, probe=lambda: (f"{tc.PIN}+cu130", "")) == 0
    assert pip.calls == []


def test_the_cpu_build_is_tried_first_then_the_registry_build():
    pip = _Pip(2)  # no local CPU wheel, no reachable CPU index
    assert tc.install(pip=pip, probe=lambda: (None, "No module named 'torch'"), installed=lambda: False) == 0
    assert [c[0] for c in pip.calls] == [f"torch=={tc.PIN}+cpu", f"torch=={tc.PIN}+cpu", f"torch=={tc.PIN}"]
    assert tc.CPU_INDEX in pip.calls[1]
    assert pip.quiet == [True, True, False]  # a missing CPU build prints nothing; the registry's errors show


def test_no_installable_torch_is_an_error():
    pip = _Pip(99)
    assert tc.install(pip=pip, probe=lambda: (None, "No module named 'torch'"), installed=lambda: False) == 1
    assert len(pip.calls) == len(tc.attempts())


def test_setup_env_leaves_the_torch_decision_to_torch_choice():
    """The script no longer refuses a non-CPU build itself; it installs and checks through torch_choice."""
    script = (ROOT / "launch" / "setup_env.sh").read_text()
    assert 'endswith("+cpu")' not in script
    assert "torch_choice.py install" in script and "torch_choice.py check" in script
    assert "venv --clear" in script  # a venv whose python no longer runs is rebuilt on the rerun


def test_a_broken_torch_is_reinstalled_on_the_rerun():
    """The old rerun kept whatever torch was there; one that no longer imports is now force-reinstalled."""
    pip = _Pip(0)
    assert tc.install(pip=pip, probe=lambda: (None, "OSError: libtorch_cpu.so"), installed=lambda: True) == 0
    assert pip.calls[0] == [f"torch=={tc.PIN}+cpu", "--force-reinstall", "--no-deps"]
    assert pip.calls[1] == [f"torch=={tc.PIN}+cpu"]


def test_setup_env_builds_the_table_of_ms_swifts_flags():
    """run.extra_args is checked against it in milliseconds (issue 24; before, each check imported
    swift.arguments, 20 to 40 s); Megatron's only where Transformer Engine is there, a failure is one line."""
    script = (ROOT / "launch" / "setup_env.sh").read_text()
    assert "python -W ignore -m gkd_harness.harness.launcher.extra_args >/dev/null 2>&1" in script
    assert (
        "find_spec('transformer_engine')" in script
        and "-m gkd_harness.harness.launcher.extra_args --megatron" in script
    )
