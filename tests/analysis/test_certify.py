"""gkd-certify: the good worked example and the harness's own fp32 pass; upstream and each broken example fail,
naming the family; unusable input exits 2. Quick mode (and, for the failing ones, the family that must fail)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gkd_harness.analysis.certify.cli import main
from tests.conftest import entry_point

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "candidates"


def _certify(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main([*map(str, args)])
    return e.value.code, capsys.readouterr().out


@pytest.mark.parametrize("candidate", [EXAMPLES / "good_promote_first.py", "fp32"])
def test_passes_every_required_family(capsys, tmp_path, candidate):
    code, out = _certify(capsys, candidate, "--quick", "--out", tmp_path)
    assert code == 0, out
    assert "verdict: PASS" in out
    cert = json.loads((tmp_path / "certificate.json").read_text())
    required = [f for f in cert["families"] if f["required"]]
    assert len(required) >= 12 and all(f["failures"] == 0 and f["cases"] > 0 for f in required)
    assert all(f["negatives"] == 0 and f["nonfinite"] == 0 for f in required)
    names = {f["name"] for f in cert["families"]}
    assert {"extreme logits", "FP16 under loss scaling", "vocab-parallel primitives"} <= names  # hard: reported
    md = (tmp_path / "certificate.md").read_text()
    assert cert["candidate"]["sha256"] in md and "| family | required | cases |" in md


def test_good_example_is_bit_identical_to_upstream_where_it_declares_so(capsys):
    code, out = _certify(capsys, EXAMPLES / "good_promote_first.py", "--quick", "--family", "upstream identity")
    assert code == 0 and "upstream identity (declared)" in out


def test_declared_identity_is_checked(capsys):
    """harness fp32 (the cancellation-free form) is accurate but not upstream's bits: declaring it unchanged fails."""
    code, out = _certify(capsys, "fp32", "--quick", "--family", "upstream identity", "--unchanged", "float32/float32")
    assert code == 1 and "vs upstream" in out


@pytest.mark.parametrize(
    "candidate,family",
    [
        ("swift.rlhf_trainers.gkd_loss", "mixed FP32/BF16 (the defect)"),
        (EXAMPLES / "broken_student_only.py", "mixed FP32/BF16 (the defect)"),
        (EXAMPLES / "broken_cast_back.py", "mixed FP32/BF16 (the defect)"),
        (EXAMPLES / "broken_clamp.py", "mixed FP32/BF16 (the defect)"),
        (EXAMPLES / "broken_promote_after_temperature.py", "temperature T != 1"),
    ],
)
def test_fails_naming_the_family(capsys, candidate, family):
    code, out = _certify(capsys, candidate, "--quick", "--family", family.split(" (")[0])
    assert code == 1, out
    assert f"verdict: FAIL (failed: {family})" in out


def test_promotion_after_temperature_passes_at_t_1_and_clamp_hides_negatives(capsys, tmp_path):
    """The broken examples fail for their own reason: dividing by T in BF16 is harmless at T = 1 (the mixed family
    runs at T = 1); the clamp leaves no negative loss while upstream's arithmetic shows them."""
    code, out = _certify(capsys, EXAMPLES / "broken_promote_after_temperature.py", "--quick", "--family", "mixed")
    assert code == 0, out
    _certify(capsys, EXAMPLES / "broken_clamp.py", "--quick", "--family", "mixed", "--out", tmp_path / "c")
    _certify(capsys, "swift.rlhf_trainers.gkd_loss", "--quick", "--family", "mixed", "--out", tmp_path / "u")
    clamp, up = (json.loads((tmp_path / d / "certificate.json").read_text())["families"][0] for d in ("c", "u"))
    assert clamp["negatives"] == 0 and clamp["failures"] == clamp["cases"]
    assert up["negatives"] > 0


def test_strict_gates_the_hard_regimes(capsys):
    """--strict: upstream-style arithmetic gives NaN on partially -inf top-k rows, as upstream's formula in FP32
    does: reported (NaN column), not held against the candidate. --strict-bar tolerance holds it to the suite's
    tolerance (the harness's own bar), which the harness's fp32 meets."""
    code, out = _certify(capsys, EXAMPLES / "good_promote_first.py", "--quick", "--strict", "--family", "partially")
    assert code == 0 and "partially -inf top-k rows" in out, out
    code, out = _certify(
        capsys,
        EXAMPLES / "good_promote_first.py",
        "--quick",
        "--strict",
        "--strict-bar",
        "tolerance",
        "--family",
        "partially",
    )
    assert code == 1, out
    code, _ = _certify(capsys, "fp32", "--quick", "--strict", "--strict-bar", "tolerance", "--family", "partially")
    assert code == 0


def test_unusable_input_exits_2_in_one_line(tmp_path):
    proc = subprocess.run(
        [entry_point("gkd-certify"), str(tmp_path / "missing.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"gkd-certify: {tmp_path / 'missing.py'}: no such file (loss.source)"
    (tmp_path / "bad.py").write_text("def gkd_loss(student_logits):\n    return 0, 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gkd_harness.analysis.certify.cli", str(tmp_path / "bad.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "gkd_loss signature differs" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------ the sign-off
def _runs(tmp_path, source, name="cand"):
    import pandas as pd

    from gkd_harness.harness.loss.candidate import copy_into_run_folder

    run = tmp_path / "sweep" / "0_loss=candidate"
    run.mkdir(parents=True)
    copy_into_run_folder(str(source), str(run))
    return pd.DataFrame(
        [
            {
                "run": "0",
                "loss.precision": "candidate",
                "loss.source": str(source),
                "loss.name": name,
                "loss.beta_form": "paper",
                "path": str(run),
            },
            {
                "run": "1",
                "loss.precision": "native",
                "loss.source": None,
                "loss.name": None,
                "loss.beta_form": "paper",
                "path": str(tmp_path / "sweep" / "1"),
            },
        ]
    )


def test_signoff_certificate_passes_and_is_cached_per_hash(tmp_path):
    from gkd_harness.analysis.signoff.certificates import certificate_rows
    from gkd_harness.harness.loss.candidate import loss_source_sha256

    runs = _runs(tmp_path, EXAMPLES / "good_promote_first.py", "pr-1")
    status, _, measured, details, applies = certificate_rows(runs, str(tmp_path / "sweep"), quick=True)
    sha = loss_source_sha256("candidate", str(EXAMPLES / "good_promote_first.py"))
    assert status == "pass" and measured == f"pr-1 (sha256 {sha[:12]}): PASS", (measured, details)
    cache = tmp_path / "sweep" / "certificates" / f"{sha}-paper-quick"
    assert json.loads((cache / "certificate.json").read_text())["candidate"]["sha256"] == sha
    (cache / "certificate.json").write_text((cache / "certificate.json").read_text().replace('"PASS"', '"FAIL"'))
    assert certificate_rows(runs, str(tmp_path / "sweep"), quick=True)[0] == "fail"  # read from the cache
    assert certificate_rows(runs, f"local:{tmp_path / 'sweep'}", quick=True)[0] == "fail"  # gkd-analyze's name


def test_signoff_certificate_fails_a_broken_candidate_naming_the_family(tmp_path):
    from gkd_harness.analysis.signoff.certificates import certificate_rows

    runs = _runs(tmp_path, EXAMPLES / "broken_cast_back.py")
    status, _, measured, details, _ = certificate_rows(runs, str(tmp_path / "sweep"), quick=True)
    assert status == "fail" and ": FAIL" in measured
    assert any("mixed FP32/BF16 (the defect)" in d for d in details), details
    assert certificate_rows(runs[runs["run"] == "1"], None)[0] == "not_applicable"
