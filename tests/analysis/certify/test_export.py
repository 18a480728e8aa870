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


# ------------------------------------------------------------------------------------------------ issue 37 / 40
def test_export_works_where_pytest_is_not_installed(tmp_path):
    """Issue 40, item 5: exporting reads the suite as a file; pytest is needed only where the module runs."""
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "from gkd_harness.analysis.certify.cli import main\n"
        f"main(['--export-pytest', {str(tmp_path / 'test_gkd.py')!r}])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ast.parse((tmp_path / "test_gkd.py").read_text())


def test_beta_form_is_honoured(capsys, tmp_path):
    """Issue 37, item 12: --beta-form continuous writes the form the module judges (it was byte-identical)."""
    _export(capsys, tmp_path / "paper.py")
    out = _export(capsys, tmp_path / "continuous.py", "--beta-form", "continuous")
    assert "beta form continuous" in out
    paper, continuous = ((tmp_path / f).read_text() for f in ("paper.py", "continuous.py"))
    assert "FORM = 'paper'" in paper and "FORM = 'continuous'" in continuous
    assert paper.replace("FORM = 'paper'", "FORM = 'continuous'") == continuous
    assert "def test_interior_beta(" in paper and "[0.1, 0.25, 0.75, 0.9]" in paper
    assert "def test_contract_return_types_and_graph(" in paper


#: (candidate, --beta-form, -k, passes): the exported module run by pytest with the harness not importable.
EXPORTED = [
    ("good", "paper", "interior", True),
    ("beta_bf16", "paper", "interior", False),
    ("silent_continuous", "paper", "interior", False),
    ("silent_continuous", "continuous", "interior", True),
    ("num_valid_int", "paper", "contract", False),
    ("reseeds_rng", "paper", "contract", False),
]


@pytest.mark.parametrize("name,form,select,passes", EXPORTED)
def test_the_exported_module_fails_wrong_fixes_and_passes_a_correct_one(capsys, tmp_path, name, form, select, passes):
    """Issue 37: interior β in the requested form and the contract checks travel with the exported module. Run by
    pytest in a subprocess from an empty folder, with ``gkd_harness`` made unimportable."""
    from tests.analysis.certify.defects import write

    target = EXAMPLES / "good_promote_first.py" if name == "good" else write(name, tmp_path)
    _export(capsys, tmp_path / "run" / "test_gkd.py", "--target", str(target), "--beta-form", form)
    code = (
        "import sys; sys.modules['gkd_harness'] = None\n"
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_gkd.py', '-k', sys.argv[1]]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, select], cwd=tmp_path / "run", capture_output=True, text=True, timeout=600
    )
    assert (proc.returncode == 0) == passes, proc.stdout[-3000:]
    assert "no tests ran" not in proc.stdout
