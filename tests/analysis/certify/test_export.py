"""gkd-certify --export-pytest: one self-contained pytest module (torch, pytest, the standard library and the module
under test only; the FP64 reference inside), which passes on a correct fix and fails on upstream's loss."""

import ast
import subprocess
import sys

import pytest

from gkd_harness.analysis.certify.cli import main
from tests.analysis.test_certify import EXAMPLES


def _export(capsys, path, *extra):
    with pytest.raises(SystemExit) as e:
        main(["--export-pytest", str(path), *extra])
    assert e.value.code == 0
    return capsys.readouterr().out


def test_the_module_imports_only_torch_pytest_and_the_standard_library(capsys, tmp_path):
    out = _export(capsys, tmp_path / "test_gkd.py")
    assert "target swift.rlhf_trainers.gkd_loss" in out
    text = (tmp_path / "test_gkd.py").read_text()
    tree = ast.parse(text)
    top = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert top - set(sys.stdlib_module_names) == {"torch", "pytest", "megatron"}, top  # megatron: only where importable
    assert "def reference_gkd(" in text and "TARGET = 'swift.rlhf_trainers.gkd_loss'" in text
    assert not {"gkd_harness", "harness", "analysis"} & top


@pytest.mark.parametrize(
    "target,passes", [(EXAMPLES / "good_promote_first.py", True), ("swift.rlhf_trainers.gkd_loss", False)]
)
def test_it_passes_a_correct_fix_and_fails_upstream(capsys, tmp_path, target, passes):
    """A subset (the mixed FP32/BF16 family), run by pytest in a subprocess from an empty folder."""
    _export(capsys, tmp_path / "test_gkd.py", "--target", str(target))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_gkd.py", "-k", "mixed"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (proc.returncode == 0) == passes, proc.stdout[-2000:]
    assert ("12 passed" in proc.stdout) == passes, proc.stdout[-2000:]


def test_target_without_export_is_refused_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gkd_harness.analysis.certify.cli", "fp32", "--target", "x"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == "gkd-certify: --target: only with --export-pytest"
