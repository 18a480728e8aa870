"""Issue 40, item 8: one certificate per sha256. gkd-analyze's ``candidate_certified`` reuses the certificate that
``gkd-certify --out`` kept for the same file (sha256), β form, mode and harness version, instead of recomputing it."""

import json

import pytest

from gkd_harness.analysis.certify.certificate import recall
from gkd_harness.analysis.certify.cli import main
from gkd_harness.harness.loss.candidate import loss_source_sha256
from tests.analysis.test_certify import EXAMPLES, _runs


def _gkd_certify(capsys, *args):
    with pytest.raises(SystemExit) as e:
        main([*map(str, args)])
    return e.value.code, capsys.readouterr().out


def test_gkd_analyze_reuses_the_certificate_gkd_certify_kept(capsys, tmp_path, monkeypatch):
    from gkd_harness.analysis.signoff.certificates import certificate_rows

    monkeypatch.setenv("GKD_HARNESS_CACHE", str(tmp_path / "cache"))
    cand = EXAMPLES / "broken_cast_back.py"
    sha = loss_source_sha256("candidate", str(cand))
    assert sha is not None
    # a search other than the default is not what gkd-analyze computes: not kept
    code, out = _gkd_certify(capsys, cand, "--quick", "--family", "mixed", "--out", tmp_path / "part")
    assert code == 1 and "kept for gkd-analyze" not in out and recall(sha, "paper", True, False) is None

    code, out = _gkd_certify(capsys, cand, "--quick", "--out", tmp_path / "cert")
    assert code == 1 and "kept for gkd-analyze" in out, out
    written = json.loads((tmp_path / "cert" / "certificate.json").read_text())
    assert recall(sha, "paper", False, False) is None and recall(sha, "continuous", True, False) is None

    runs = _runs(tmp_path, cand)
    status, _, measured, details, _ = certificate_rows(runs, str(tmp_path / "sweep"), quick=True)
    assert status == "fail" and any("mixed FP32/BF16 (the defect)" in d for d in details), details
    swept = json.loads((tmp_path / "sweep" / "certificates" / f"{sha}-paper-quick" / "certificate.json").read_text())
    assert swept["reused"].startswith(str(tmp_path / "cache"))  # not recomputed: gkd-certify's, timing included
    assert swept["wall_s"] == written["wall_s"] and swept["families"] == written["families"]

    kept = next((tmp_path / "cache" / "certificates").rglob("certificate.json"))
    kept.write_text(kept.read_text().replace(written["harness_version"], "0.0.other"))
    assert recall(sha, "paper", True, False) is None  # another harness version: recomputed
