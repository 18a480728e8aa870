"""gkd-certify's verdicts on candidates a pull request could contain (issue 30): no false pass (a candidate that
writes into its inputs, one that ignores the injected primitives), and every fail says why and how bad
(severity, the recognised cause)."""

import json

import pytest
import torch

from gkd_harness.analysis.certify.certificate import certify, load
from gkd_harness.analysis.certify.cli import main
from gkd_harness.analysis.certify.families import REQUIRED_FAMILIES
from tests.analysis.certify.defects import write
from tests.analysis.test_certify import EXAMPLES


def _certify(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main([*map(str, args)])
    return e.value.code, capsys.readouterr().out


def _family(cert, name):
    return next(f for f in cert["families"] if f["name"].startswith(name))


def test_a_candidate_that_writes_into_its_inputs_fails_naming_the_input(capsys, tmp_path):
    code, out = _certify(capsys, write("in_place_teacher_shift", tmp_path), "--quick", "--out", tmp_path / "c")
    assert code == 1, out
    assert "writes into its input teacher_output.full_logits" in out
    cert = json.loads((tmp_path / "c" / "certificate.json").read_text())
    mixed = _family(cert, "mixed FP32/BF16")
    assert mixed["severity"] == "defect" and "teacher_output.full_logits" in mixed["cause"]


def test_the_reference_reads_the_callers_inputs_not_the_candidates_copy(tmp_path):
    """The case's tensors are the same after the in-place candidate ran on them (it got copies)."""
    fam = next(f for f in REQUIRED_FAMILIES if f.name.startswith("mixed"))
    from gkd_harness.analysis.certify.evaluate import evaluate

    cand = load(str(write("in_place_teacher_shift", tmp_path)), None, "paper", ())
    case = fam.build("paper", True)[0]
    before = case.teacher.full_logits.clone()
    res = evaluate(cand.gkd_loss, case)
    assert res.failed and torch.equal(case.teacher.full_logits, before)


def test_a_candidate_that_ignores_the_injected_primitives_fails_naming_them(capsys, tmp_path):
    code, out = _certify(capsys, write("ignores_primitives", tmp_path), "--quick")
    assert code == 1, out
    assert "verdict: FAIL (failed: injected primitives (2 vocab-parallel ranks))" in out
    assert "ignores the injected log_softmax_fn, kl_div_fn (0 calls" in out


@pytest.mark.parametrize("candidate", [EXAMPLES / "good_promote_first.py", "fp32"])
def test_the_shard_primitives_are_called_and_give_the_full_vocabulary_result(capsys, candidate):
    code, out = _certify(capsys, candidate, "--family", "injected primitives")
    assert code == 0, out


def test_the_first_reports_wording_of_the_fix_is_near_with_the_alignment_hint(tmp_path):
    cert = certify(load(str(write("report_wording", tmp_path)), None, "paper", ()), quick=True)
    assert cert["verdict"] == "FAIL" and cert["failed_families"] == ["vocab mismatch"]
    fam = _family(cert, "vocab mismatch")
    assert fam["severity"] == "near" and 1 < fam["worst_ratio"] <= 10
    assert fam["cause"].startswith("promotion after alignment")


def test_a_broken_fix_is_a_defect(tmp_path):
    cert = certify(load(str(EXAMPLES / "broken_cast_back.py"), None, "paper", ()), quick=True, only=["mixed"])
    assert _family(cert, "mixed")["severity"] == "defect" and _family(cert, "mixed")["worst_ratio"] > 100


@pytest.mark.parametrize(
    "name,family,cause",
    [
        ("beta_bf16", "beta 0, 0.5, 1", "β rounded to BF16"),
        ("mean_not_sum", "mixed", "a mean instead of a sum"),
        ("wrong_num_valid", "mixed", "a wrong num_valid"),
        (EXAMPLES / "broken_promote_after_temperature.py", "temperature", "promotion after temperature"),
        (EXAMPLES / "broken_clamp.py", "mixed", "a clamp (line"),
    ],
)
def test_recognised_causes(tmp_path, name, family, cause):
    path = name if not isinstance(name, str) else write(name, tmp_path)
    cert = certify(load(str(path), None, "paper", ()), quick=True, only=[family.split(" ")[0]])
    fam = _family(cert, family)
    assert not fam["passed"] and fam["cause"].startswith(cause), fam


def test_a_correct_promote_first_fix_passes_strict():
    """--strict: the hard regimes gate, each case against upstream's formula computed in FP32 on the same inputs
    (partially -inf top-k rows: NaN there too, reported, not held against the candidate)."""
    cert = certify(load(str(EXAMPLES / "good_promote_first.py"), None, "paper", ()), strict=True)
    assert cert["verdict"] == "PASS", [f["name"] for f in cert["families"] if not f["passed"]]
    part = _family(cert, "partially -inf")
    assert part["nonfinite"] > 0 and part["bar"] == "upstream"


def test_strict_still_fails_a_candidate_worse_than_upstream_in_fp32():
    cert = certify(
        load(str(EXAMPLES / "broken_student_only.py"), None, "paper", ()),
        quick=True,
        strict=True,
        only=["vocab-parallel primitives", "BF16 gradient"],
    )
    assert cert["verdict"] == "FAIL"
    assert all("upstream in FP32" in f["failing"][0]["note"] for f in cert["families"] if f["failing"])


def test_a_bf16_gradient_of_total_over_num_valid_is_rounded_once():
    """fp32's fused path (int8 residual of the BF16-rounded ∂JSD/∂z) reaches the one-rounding bound; upstream's
    formula in FP32 does too."""
    for spec in ("fp32", str(EXAMPLES / "good_promote_first.py")):
        cert = certify(load(spec, None, "paper", ()), strict=True, bar="tolerance", only=["BF16 gradient"])
        assert cert["verdict"] == "PASS", cert["families"][0]["failing"]
