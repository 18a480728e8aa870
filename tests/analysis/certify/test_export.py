"""gkd-certify --export-pytest: the certificate as one self-contained pytest module (torch, numpy, pytest, the
standard library and the module under test only), run here by pytest in a subprocess from an empty folder with
``gkd_harness`` unimportable and no PYTHONPATH: it must fail what the certificate fails (issue 44)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import pytest

from gkd_harness.analysis.certify.certificate import families_for
from gkd_harness.analysis.certify.cli import main
from gkd_harness.analysis.certify.export import LEFT_OUT, export_pytest, render
from gkd_harness.analysis.certify.process import certify_in_child
from gkd_harness.analysis.certify.search import DRAWS
from tests.analysis.certify import defects, export_panel
from tests.analysis.test_certify import EXAMPLES

UPSTREAM = "swift.rlhf_trainers.gkd_loss"
_RUNNER = (
    "import sys; sys.modules['gkd_harness'] = None\n"
    "import pytest\n"
    "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', *sys.argv[1:]]))\n"
)


def _export(capsys, path, *extra):
    with pytest.raises(SystemExit) as e:
        main(["--export-pytest", str(path), *extra])
    assert e.value.code == 0
    return capsys.readouterr().out


def run_exported(folder: Path, *args: str, env: Dict[str, str] | None = None) -> Tuple[int, str, Dict[str, List[str]]]:
    """pytest over the exported modules in ``folder`` (harness unimportable, no PYTHONPATH) -> (rc, output,
    {module: the ids of its failing tests})."""
    junit = folder / "junit.xml"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, f"--junitxml={junit}", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**clean, **(env or {})},
    )
    failing: Dict[str, List[str]] = {}
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            module = case.get("classname", "")
            failing.setdefault(module, [])
            if case.find("failure") is not None or case.find("error") is not None:
                failing[module].append(case.get("name", ""))
    return proc.returncode, proc.stdout + proc.stderr, failing


def _family(test_name: str) -> str:
    """The family of a failing exported test: ``test_case[FAMILY | CASE]``; the gloo test and the import check by
    their own names."""
    if test_name.startswith("test_case["):
        return test_name[len("test_case[") :].split(" | ")[0]
    return test_name


# ------------------------------------------------------------------------------------------------ the module itself
def test_the_module_imports_only_torch_numpy_pytest_and_the_standard_library(capsys, tmp_path):
    out = _export(capsys, tmp_path / "test_gkd.py")
    assert "target swift.rlhf_trainers.gkd_loss" in out and "left out: upstream identity (declared)" in out
    text = (tmp_path / "test_gkd.py").read_text()
    tree = ast.parse(text)
    top = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert top - set(sys.stdlib_module_names) == {"torch", "pytest"}, top
    assert "TARGET = 'swift.rlhf_trainers.gkd_loss'" in text
    # the embedded modules: the certificate's own files; at their top, nothing outside torch, numpy, the standard
    # library and the harness modules embedded beside them
    sources = ast.literal_eval(
        next(n for n in tree.body if isinstance(n, ast.AnnAssign) and n.target.id == "_SOURCES").value
    )  # type: ignore[union-attr]
    assert {"analysis.certify.families", "analysis.certify.search", "analysis.certify.evaluate"} <= set(sources)
    assert {"harness.loss.reference", "harness.loss.tolerances", "harness.contract"} <= set(sources)
    for rel, src in sources.items():
        for n in ast.parse(src).body:
            names = (
                [a.name for a in n.names]
                if isinstance(n, ast.Import)
                else [n.module or ""]
                if isinstance(n, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.startswith("gkd_harness."):
                    assert name[len("gkd_harness.") :] in sources, (rel, name)
                else:
                    assert name.split(".")[0] in set(sys.stdlib_module_names) | {"torch", "numpy"}, (rel, name)


@pytest.mark.slow
def test_its_cases_are_the_certificates(tmp_path):
    """Every case of every family the certificate's verdict counts (the required families and the search's draws)
    is one exported test, by id, in the same order; what is left out is LEFT_OUT's."""
    export_pytest(tmp_path / "test_gkd.py", str(EXAMPLES / "good_promote_first.py"))
    rc, out, _ = run_exported(tmp_path, "--collect-only", "test_gkd.py")
    assert rc == 0, out[-2000:]
    got = [ln.split("::", 1)[1] for ln in out.splitlines() if ln.startswith("test_gkd.py::test_case[")]
    fams = families_for(type("C", (), {"unchanged": ()})(), False, (), (0, DRAWS, None))
    want = [
        f"test_case[{f.name} | {c.id}]"
        for f in fams
        if f.required and f.name not in LEFT_OUT
        for c in f.build("paper", False)
    ]
    assert len(want) > 300
    # pytest escapes non-ASCII ids and numbers repeated ones (a family may name two cases alike)
    want = [w.encode("ascii", "backslashreplace").decode() for w in want]
    assert len(got) == len(want) and all(g == w or re.sub(r"_\d+\]$", "]", g) == w for g, w in zip(got, want))
    assert (
        any("V=151,936" in g for g in got)
        and any("fp32/fp16" in g for g in got)
        and any("chunk_size" in g for g in got)
    )
    assert any("random search | draw 47 (seed 0)" in g for g in got)


def test_target_without_export_is_refused_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gkd_harness.analysis.certify.cli", "fp32", "--target", "x"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == "gkd-certify: --target: only with --export-pytest"


def test_export_works_where_pytest_is_not_installed(tmp_path):
    """Issue 40, item 5: exporting reads the template as a file; pytest is needed only where the module runs."""
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "from gkd_harness.analysis.certify.cli import main\n"
        f"main(['--export-pytest', {str(tmp_path / 'test_gkd.py')!r}])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ast.parse((tmp_path / "test_gkd.py").read_text())


def test_beta_form_is_honoured():
    """Issue 37, item 12: --beta-form continuous writes the form the module judges."""
    paper, continuous = render(beta_form="paper"), render(beta_form="continuous")
    assert "FORM = 'paper'" in paper and "FORM = 'continuous'" in continuous
    assert paper.replace("FORM = 'paper'", "FORM = 'continuous'") == continuous


#: module -> (candidate, --beta-form, families among mixed / interior β / contract that must fail it; none: passes).
EXPORTED = {
    "test_good": ("good", "paper", set()),
    "test_upstream": ("upstream", "paper", {"mixed FP32/BF16 (the defect)"}),
    "test_beta_bf16": ("beta_bf16", "paper", {"beta 0, 0.5, 1 and interior"}),
    "test_silent_continuous": ("silent_continuous", "paper", {"beta 0, 0.5, 1 and interior"}),
    "test_silent_continuous_as_continuous": ("silent_continuous", "continuous", set()),
    "test_num_valid_int": ("num_valid_int", "paper", {"the contract"}),
    "test_reseeds_rng": ("reseeds_rng", "paper", {"mixed FP32/BF16 (the defect)", "the contract"}),
}


@pytest.mark.slow
def test_the_exported_module_fails_wrong_fixes_and_passes_correct_ones(tmp_path):
    """Issue 37: the mixed pair, interior β in the requested form and the contract travel with the exported module;
    the worked example and the continuous form exported as continuous pass. One pytest run over the modules."""
    for module, (name, form, _) in EXPORTED.items():
        if name == "good":
            target = str(EXAMPLES / "good_promote_first.py")
        else:
            target = UPSTREAM if name == "upstream" else str(defects.write(name, tmp_path))
        export_pytest(tmp_path / f"{module}.py", target, form)
    rc, out, failing = run_exported(tmp_path, "-k", "mixed or interior or contract")
    assert rc == 1 and "no tests ran" not in out, out[-3000:]
    got = {
        m: {_family(t) for t in failing[m]} - {"test_importing_the_target_leaves_global_torch_state"} for m in EXPORTED
    }
    for m, (_, _, want) in EXPORTED.items():
        assert (want <= got[m]) and (bool(got[m]) == bool(want)), (m, got[m])


@pytest.mark.slow
def test_the_export_fails_issue_44s_wrong_fixes(tmp_path):
    """Issue 44: the old export passed these 4 wrong fixes and report 000's literal fix (75 passed, 6 skipped each)
    while gkd-certify failed them. Each module runs the family the certificate fails it on (one pytest run)."""
    select = []
    for name, (_, family) in export_panel.EXPORT_PANEL.items():
        export_pytest(tmp_path / f"test_{name}.py", str(export_panel.write(name, tmp_path)))
        select.append(f"(test_{name} and {family.split()[0]})")
    rc, out, failing = run_exported(tmp_path, "-k", " or ".join(select))
    assert rc == 1, out[-3000:]
    for name, (_, family) in export_panel.EXPORT_PANEL.items():
        fams = {_family(t) for t in failing[f"test_{name}"]}
        assert any(f.startswith(family) for f in fams) or (
            family == "injected primitives" and "test_injected_primitives_on_2_gloo_ranks" in fams
        ), (name, failing[f"test_{name}"][:3])


# ------------------------------------------------------------------------------------------------ the same verdicts
def candidates(folder: Path) -> List[Tuple[str, Path]]:
    """Every candidate of examples/candidates and of the tests' panels, as files."""
    folder.mkdir(parents=True, exist_ok=True)
    out = [(p.stem, p) for p in sorted(EXAMPLES.glob("*.py"))]
    out += [(n, defects.write(n, folder)) for n in sorted(defects.EDITS)]
    out += [(n, export_panel.write(n, folder)) for n in sorted(export_panel.EXPORT_PANEL)]
    return out


def _certificate_failures(path: Path, quick: bool) -> List[str]:
    # in the candidate's own child, as gkd-certify runs it: an in-process certificate let a candidate's global torch
    # state (default dtype, flush-denormal, ...) leak into this pytest worker and into the tests after it
    cert = certify_in_child(str(path), None, "paper", (), quick=quick, speed=False)
    return sorted(set(cert["failed_families"]) - set(LEFT_OUT))


def _agree(paths: Sequence[Tuple[str, Path]], folder: Path, quick: bool) -> List[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in paths:
        export_pytest(folder / f"test_{name}.py", str(path))
    rc, out, failing = run_exported(folder, env={"GKD_EXPORT_QUICK": "1"} if quick else {})
    assert set(failing) == {f"test_{n}" for n, _ in paths}, out[-3000:]
    wrong = []
    for name, path in paths:
        cert = _certificate_failures(path, quick)
        exported = sorted({_family(t) for t in failing[f"test_{name}"]})
        if bool(cert) != bool(exported):
            wrong.append(f"{name}: certificate fails {cert or 'nothing'}, export fails {exported or 'nothing'}")
    return wrong


@pytest.mark.slow
def test_the_certificate_and_its_export_agree_on_every_candidate(tmp_path):
    """Issue 44: every candidate of examples/candidates and of the tests' panels, through gkd-certify (in process)
    and through its export (pytest, the harness unimportable): the same pass/fail for each. In --quick
    (GKD_EXPORT_QUICK=1 for the export; GKD_TEST_EXPORT_FULL=1: the default, full certificate), in batches of 8
    modules per pytest run."""
    quick = os.environ.get("GKD_TEST_EXPORT_FULL") != "1"
    paths = candidates(tmp_path / "candidates")
    wrong: List[str] = []
    for i in range(0, len(paths), 8):
        wrong += _agree(paths[i : i + 8], tmp_path / f"batch{i}", quick)
    assert not wrong, wrong
