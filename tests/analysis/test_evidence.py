"""Issue 29: the sign-off judges a declared experiment. One evidence model (gkd_harness.analysis.sweep.evidence): each run's
identity (role, precision, β form, loss sha256, candidate, harness tree, ms-swift version, dtypes at the loss) and
completeness; criteria judge that evidence. Synthetic run folders (gkd_harness.bench.synthetic.write_run), no training.

Reproductions of the issue: 1 (fp32 punished for being closer to FP64), 2 (original,continuous has no β-form
pair), 4 (a candidate pooled with the harness's own patched runs), 5 (mixed versions), 6 (one variant, two
sources), 7 (no low-precision original beside a low-precision fix), 8 (the banner hides turned-off criteria).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.signoff.criteria import evaluate
from gkd_harness.analysis.signoff.criteria_file import load_criteria
from gkd_harness.analysis.sweep.evidence import annotate, judged_runs, mixed_evidence
from gkd_harness.analysis.sweep.runs import load_sweep
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import (
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    SPOT_SIGN_MISMATCH,
    TRAIN_LOSS,
)

STEPS = 6
SHA_UPSTREAM, SHA_HARNESS = "a" * 64, "b" * 64


def _run(
    root: Path,
    name: str,
    *,
    precision: str,
    form: str = "paper",
    seed: int = 1,
    teacher: str = "bfloat16",
    ms_swift: str = "4.6.0",
    commit: str = "c0ffee" * 6 + "ab",
    dirty: bool = False,
    sha: str | None = None,
    loss_name: str | None = None,
    group: str = "g",
    rank: str = "c" * 64,
) -> Path:
    run = write_run(
        root / name,
        beta=0.5,
        beta_form=form,
        precision=precision,
        seed=seed,
        steps=STEPS,
        spot_every=2,
        teacher_dtype=teacher,
        group=group,
    )
    s = json.loads((run / "summary.json").read_text())
    s["versions"]["ms-swift"] = ms_swift
    s["provenance"] = {
        "harness_commit": commit,
        "harness_dirty": dirty,
        "loss_sha256": sha or (SHA_UPSTREAM if precision == "native" else SHA_HARNESS),
        "rank_sha256": rank,
    }
    if loss_name is not None:
        s["config"]["loss.name"] = loss_name
    (run / "summary.json").write_text(json.dumps(s))
    return run


def _rows(run: Path) -> list:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _write_rows(run: Path, rows: list) -> None:
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _status(sweep_dir: Path, criteria=None) -> dict:
    verdict, results = evaluate(load_sweep(sweep_dir), load_criteria(criteria))
    return {"verdict": verdict, **{r.name: r for r in results}}


# ---------------------------------------------------------------------------------------------------------------
# the evidence model
# ---------------------------------------------------------------------------------------------------------------


def test_identity_role_variant_and_completeness(tmp_path):
    _run(tmp_path, "n1", precision="native", seed=1)
    _run(tmp_path, "n2", precision="native", seed=2)
    _run(tmp_path, "f1", precision="fp32", seed=1)
    _run(tmp_path, "r1", precision="fp64", seed=1)
    r = annotate(load_sweep(tmp_path)).runs.set_index("run")
    assert r.loc["n1", "role"] == "original" and r.loc["f1", "role"] == "patched" and r.loc["r1", "role"] == "reference"
    assert r.loc["n1", "variant_key"] == r.loc["n2", "variant_key"] != r.loc["f1", "variant_key"]
    assert r.loc["n1", "loss_sha256"] == SHA_UPSTREAM and r.loc["f1", "ms_swift"] == "4.6.0"
    assert r.loc["f1", "harness_dirty"] is False or r.loc["f1", "harness_dirty"] == False  # noqa: E712
    assert (r["planned_steps"] == STEPS).all() and (r["train_steps"] == STEPS).all() and (r["eval_records"] == 0).all()
    assert "β=0.5" in r.loc["f1", "variant_label"] and "float32/bfloat16" in r.loc["f1", "variant_label"]


def test_patched_precisions_is_gone_from_the_criteria_file():
    # The role of a precision has one definition: gkd_harness.harness.contract.role_of.
    assert not hasattr(load_criteria(), "patched_precisions")
    assert not hasattr(load_criteria(), "original_precision")


# ---------------------------------------------------------------------------------------------------------------
# reproduction 1: each side judged against FP64
# ---------------------------------------------------------------------------------------------------------------


def _fp32_pair(root: Path, native_rel: float, fp32_rel: float, apart: float) -> Path:
    """`-m loss=original,fp32 model.teacher_dtype=float32`: FP32/FP32 at the loss; native's spot checks are
    ``native_rel`` from FP64, fp32's ``fp32_rel``; the two train/loss curves are ``apart`` (relative)."""
    n = _run(root, "loss=original", precision="native", teacher="float32")
    f = _run(root, "loss=fp32", precision="fp32", teacher="float32")
    base = _rows(n)
    for run, rel, scale in ((n, native_rel, 1.0), (f, fp32_rel, 1.0 + apart)):
        rows = []
        for r in base:
            r = dict(r, **{TRAIN_LOSS: r[TRAIN_LOSS] * scale})
            if SPOT_LOSS_FP64 in r:
                fp64 = r[SPOT_LOSS_FP64]
                r.update(
                    {
                        SPOT_LOSS: fp64 * (1 + rel),
                        SPOT_LOSS_ABS_ERR: abs(fp64 * rel),
                        SPOT_LOSS_REL_ERR: rel,
                        SPOT_SIGN_MISMATCH: 0,
                    }
                )
            rows.append(r)
        _write_rows(run, rows)
    return root


def test_repro1_fp32_closer_to_fp64_than_native_passes(tmp_path):
    # Before: native and fp32 were compared with each other (2.98e-5 apart > 1e-5): FAIL.
    st = _status(_fp32_pair(tmp_path, native_rel=3.1e-5, fp32_rel=2.1e-7, apart=2.98e-5))
    res = st["precisions_unchanged_in_fp32"]
    assert res.status == "pass", res.measured
    assert "FP64" in res.measured
    assert st["verdict"] == "pass"


def test_repro1_fp32_further_from_fp64_than_native_fails(tmp_path):
    st = _status(_fp32_pair(tmp_path, native_rel=2.1e-7, fp32_rel=3.1e-5, apart=2.98e-5))
    assert st["precisions_unchanged_in_fp32"].status == "fail"
    assert any("loss=fp32" in d for d in st["precisions_unchanged_in_fp32"].details)


# ---------------------------------------------------------------------------------------------------------------
# reproduction 2: no paper/continuous pair at one precision
# ---------------------------------------------------------------------------------------------------------------


def test_repro2_original_and_continuous_is_not_applicable_for_beta_forms(tmp_path, capsys):
    # `-m loss=original,continuous`: native paper and fp32 continuous; before: not_measured, FAIL.
    _run(tmp_path / "s", "loss=original", precision="native")
    _run(tmp_path / "s", "loss=continuous", precision="fp32", form="continuous")
    st = _status(tmp_path / "s")
    assert st["beta_forms_unchanged"].status == "not_applicable", st["beta_forms_unchanged"].measured
    assert "one precision" in st["beta_forms_unchanged"].measured
    assert st["verdict"] == "pass"


# ---------------------------------------------------------------------------------------------------------------
# reproduction 4 (report side): the candidate against upstream alone
# ---------------------------------------------------------------------------------------------------------------


def test_repro4_candidate_is_judged_alone_not_pooled_with_the_harness_runs(tmp_path):
    root = tmp_path / "s"
    _run(root, "loss=original", precision="native")
    fp32 = _run(root, "loss=fp32", precision="fp32")
    _run(root, "loss=continuous", precision="fp32", form="continuous")
    _run(root, "loss=candidate", precision="candidate", sha="c" * 64, loss_name="mypr")
    # A negative loss call in the harness's own fp32 run: not the candidate's evidence.
    _write_rows(
        fp32, [dict(r, **{NEG_LOSS_CALLS: 1, NEG_LOSS_CALLS_TOTAL: 1}) if r["step"] == 2 else r for r in _rows(fp32)]
    )
    crit = tmp_path / "c.yaml"
    crit.write_text("candidate_certified: {enabled: false}\n")
    st = _status(root, crit)
    res = st["no_negative_patched"]
    assert res.status == "pass", res.measured
    assert "in 1 candidate runs" in res.measured
    assert "candidate" in res.applies and "not judged" in res.applies
    judged, originals, _ = judged_runs(annotate(load_sweep(root)).runs)
    assert list(judged["run"]) == ["loss=candidate"] and list(originals["run"]) == ["loss=original"]


# ---------------------------------------------------------------------------------------------------------------
# reproductions 5 and 6: mixed versions and sources are refused unless --allow-mixed
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "second, named",
    [
        (dict(ms_swift="4.7.0"), "two ms-swift versions: 4.6.0"),
        (dict(rank="d" * 64), "two rank-side codes (harness/rank): sha256 cccccccc"),
    ],
)
def test_repro5_mixed_versions_or_rank_code_exit_2_naming_them(tmp_path, capsys, second, named):
    _run(tmp_path / "s", "loss=original", precision="native")
    _run(tmp_path / "s", "loss=fp32", precision="fp32", **second)
    assert main([str(tmp_path / "s"), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert named in err and "--allow-mixed" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("second", [dict(commit="deadbeef" * 5), dict(dirty=True)])
def test_issue38_a_commit_during_a_sweep_does_not_split_it(tmp_path, capsys, second):
    """Issue 38 item 9: a docs-only commit (or a dirty tree) between two points changed the tree's commit and the
    sweep was refused as "two harness trees" (exit 2). What decides a result is the loss code, the rank-side code,
    ms-swift and the resolved config, which are equal here: one comparison, PASS."""
    _run(tmp_path / "s", "loss=original", precision="native")
    _run(tmp_path / "s", "loss=fp32", precision="fp32", **second)
    assert main([str(tmp_path / "s"), "--report", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    assert "harness trees" not in capsys.readouterr().out


def test_repro6_one_variant_with_two_sources_exits_2(tmp_path, capsys):
    _run(tmp_path / "s", "loss=original", precision="native")
    _run(tmp_path / "s", "cand_s1", precision="candidate", seed=1, sha="1729" + "0" * 60, loss_name="mypr")
    _run(tmp_path / "s", "cand_s2", precision="candidate", seed=2, sha="9e17" + "0" * 60, loss_name="mypr")
    assert mixed_evidence(load_sweep(tmp_path / "s"))
    assert main([str(tmp_path / "s"), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "two loss sources" in err and "sha256 1729" in err and "sha256 9e17" in err and "cand_s1" in err


def test_allow_mixed_is_recorded_in_verdict_json_and_the_banner(tmp_path):
    _run(tmp_path / "s", "loss=original", precision="native")
    _run(tmp_path / "s", "loss=fp32", precision="fp32", ms_swift="4.7.0")
    code = main([str(tmp_path / "s"), "--report", str(tmp_path / "r"), "--allow-mixed"])
    assert code in (0, 1)
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["allow_mixed"] is True and any("ms-swift" in m for m in v["mixed"])
    banner = (tmp_path / "r" / "report.md").read_text().split("**Contents**")[0]
    assert "--allow-mixed" in banner and "two ms-swift versions" in banner


# ---------------------------------------------------------------------------------------------------------------
# reproduction 7: a precision fix needs an original with a low-precision side
# ---------------------------------------------------------------------------------------------------------------


def test_repro7_fp32_originals_beside_a_bf16_fix_are_not_measured(tmp_path):
    # Before: not_applicable, PASS: nothing showed the harness can see the defect.
    _run(tmp_path / "s", "loss=original", precision="native", teacher="float32")
    _run(tmp_path / "s", "loss=fp32", precision="fp32", teacher="bfloat16")
    st = _status(tmp_path / "s")
    res = st["original_shows_defect"]
    assert res.status == "not_measured", res.measured
    assert "BF16/FP16" in res.measured and "loss=fp32" in res.measured
    assert st["verdict"] == "fail"


# ---------------------------------------------------------------------------------------------------------------
# reproduction 8: the banner counts turned-off criteria
# ---------------------------------------------------------------------------------------------------------------


def test_repro8_banner_counts_passed_failed_not_applicable_and_turned_off(tmp_path):
    _run(tmp_path / "s", "loss=original", precision="native")
    _run(tmp_path / "s", "loss=fp32", precision="fp32")
    crit = tmp_path / "c.yaml"
    crit.write_text("spot_tolerance: {enabled: false}\nno_negative_patched: {enabled: false}\n")
    assert main([str(tmp_path / "s"), "--report", str(tmp_path / "r"), "--criteria", str(crit)]) == 0
    banner = (tmp_path / "r" / "report.md").read_text().split("**Contents**")[0]
    assert "2 turned off by the criteria file (no_negative_patched, spot_tolerance)" in banner, banner
    assert " passed, 0 failed, " in banner and "not applicable" in banner
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["allow_mixed"] is False
    assert v["counts"]["disabled"] == 2 and v["counts"]["failed"] == 0
