"""gkd-analyze on a real tiny sweep: gkd-train through Hydra multirun and the real ms-swift CLI (3 runs x 3 steps
on the embedded CPU default: FP32 student, BF16 near-copy teacher, β=0.5, T=0.9, captures on).

Points: loss=original (native/paper), fp32 (fp32/paper), continuous (fp32/continuous): enough for every
criterion: patched runs for the no-negative and FP64 checks, an original run with mixed dtypes for the defect,
and a paper/continuous pair at β=0.5.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def real_sweep(smoke_sweep) -> Path:
    """The session-wide smoke sweep (tests/conftest.py: original, fp32, continuous; 3 steps; captures on),
    trained once for every test that needs a real sweep."""
    return smoke_sweep


def _analyze(*args, timeout=600):
    exe = shutil.which("gkd-analyze") or "gkd-analyze"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _copy(sweep: Path, dst: Path) -> Path:
    shutil.copytree(sweep, dst, ignore=shutil.ignore_patterns("wandb", "swift", "*.log"))
    return dst


def test_real_sweep_passes(real_sweep, tmp_path):
    report = tmp_path / "report"
    proc = _analyze(real_sweep, "--report", report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    v = json.loads((report / "verdict.json").read_text())
    status = {c["name"]: c["status"] for c in v["criteria"]}
    expected = {
        "no_negative_patched": "pass",
        "no_nonfinite": "pass",
        "spot_tolerance": "pass",
        "original_shows_defect": "pass",
        "beta_forms_unchanged": "pass",
        "precisions_unchanged_in_fp32": "not_applicable",  # no FP32/FP32 pair in the smoke sweep
        "no_failed_runs": "pass",
        "patched_not_worse": "not_applicable",
    }  # the plan configures no held-out evaluation (monitor.eval off): the criterion's subject is absent
    assert {k: status.get(k) for k in expected} == expected
    # criteria added since (e.g. a candidate's certificate) must not fail a sweep they have no subject in
    assert all(st in ("pass", "not_applicable", "skipped") for st in status.values()), status
    assert v["failed_criteria"] == []
    assert v["n_runs"] == 3 and v["runs_by_outcome"] == {"completed": 3}
    # paper and continuous at β=0.5: bit-identical training, step for step
    assert v["largest_divergence"]["beta_forms"]["max_abs_diff"] == 0.0
    # replay of the captures: native negative, fp32 within 1e-5 relative of fp64, per capture
    replay = v["replay"]
    assert replay and {r["variant"] for r in replay} == {"native", "fp32", "fp64"}
    by = {(r["run"], r["step"], r["variant"]): r for r in replay}
    for (run, step, variant), r in by.items():
        if variant == "fp32":
            ref = by[(run, step, "fp64")]["loss"]
            assert abs(r["loss"] - ref) <= 1e-4 * abs(ref) + 2e-6 and r["grad_rel_l2"] < 1e-3
        if variant == "native":
            assert r["loss"] < 0  # the precision defect on these inputs
    # FP64 β-curve on the captured inputs: the paper form's jump next to β=1, the continuous form meets KL(S‖T)
    jumps = {j["form"]: j for j in v["beta_curve"]["captured_endpoint_jumps"]}
    assert jumps["paper"]["D(high)/D(1)"] < 2e-3 and jumps["continuous"]["D(high)/D(1)"] > 0.98
    html = (report / "report.html").read_text()
    assert "Replay of captures" in html and "data:image/png;base64," in html
    # the seed defect table is there too, captures or not: the seed input's native loss is negative
    seed = {r["variant"]: r for r in v["seed_defect"] if r["input"] == "seed report"}
    assert seed["native"]["loss"] < 0 < seed["fp32"]["loss"] and "Seed defect table" in html


def test_doctored_negative_patched_loss_fails_naming_criterion(real_sweep, tmp_path):
    """A copy of the real files where the patched (fp32) run's step-2 line reports one negative loss call."""
    sweep = _copy(real_sweep, tmp_path / "doctored")
    (run,) = [p for p in sweep.iterdir() if p.name.startswith("loss=fp32")]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec["step"] >= 2:
            rec["gkd/neg_loss_calls_total"] = rec["gkd/neg_loss_calls_total"] + 1
        if rec["step"] == 2:
            rec["gkd/neg_loss_calls"] = rec["gkd/neg_loss_calls"] + 1
            rec["gkd/min_token_jsd"] = -1e-4
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    proc = _analyze(sweep, "--report", tmp_path / "report")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    v = json.loads((tmp_path / "report" / "verdict.json").read_text())
    assert v["verdict"] == "fail" and v["failed_criteria"] == ["no_negative_patched"]
    assert "[        fail] Patched loss has no negative loss calls: 1 negative of" in proc.stdout
    crit = next(c for c in v["criteria"] if c["name"] == "no_negative_patched")
    calls = lines[-1]["gkd/loss_calls_total"]
    assert crit["details"] == [f"{run.name}: 1 negative of {calls:g} calls (min token JSD -0.0001)"]


def test_real_run_folder_missing_or_corrupt_exit_2(real_sweep, tmp_path):
    sweep = _copy(real_sweep, tmp_path / "broken")
    (run,) = [p for p in sweep.iterdir() if p.name.startswith("loss=continuous")]
    (run / "summary.json").unlink()
    proc = _analyze(sweep, "--report", tmp_path / "r1")
    assert proc.returncode == 2 and f"run folder {run}: summary.json missing" in proc.stderr
    assert not (tmp_path / "r1" / "verdict.json").exists()
    shutil.rmtree(sweep)
    sweep = _copy(real_sweep, tmp_path / "broken2")
    (run,) = [p for p in sweep.iterdir() if p.name.startswith("loss=original")]
    text = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([text[0], text[1][:40], *text[2:]]) + "\n")
    proc = _analyze(sweep, "--report", tmp_path / "r2")
    assert proc.returncode == 2 and "metrics.jsonl:2: not valid JSON" in proc.stderr


def test_wandb_offline_runs_of_the_real_sweep(real_sweep, tmp_path):
    """The wandb runs ms-swift wrote (offline) load into the same table as the run folders."""
    from gkd_harness.analysis.load import load_sweep, load_wandb_offline

    local = load_sweep(real_sweep)
    group = local.groups[0]
    wb = load_wandb_offline(real_sweep, group=group)
    cols = [
        "run",
        "loss.precision",
        "loss.beta_form",
        "gkd.beta",
        "gkd.temperature",
        "run.seed",
        "dtype.student",
        "dtype.teacher",
        "outcome",
    ]
    assert wb.runs[cols].sort_values("run").to_dict("records") == local.runs[cols].sort_values("run").to_dict("records")
    for run in local.runs["run"]:
        a, b = local.run_history(run), wb.run_history(run)
        assert a.index.tolist() == b.index.tolist() == list(range(1, int(local.runs["run.max_steps"].iloc[0]) + 1))
        for m in ("train/loss", "gkd/neg_loss_calls_total", "spot/loss_fp64", "spot/grad_rel_l2"):
            assert a[m].tolist() == pytest.approx(b[m].tolist(), rel=1e-12), (run, m)
    proc = _analyze(real_sweep, "--report", tmp_path / "r", "--source", "wandb-offline", "--group", group)
    assert proc.returncode == 0, proc.stdout + proc.stderr
