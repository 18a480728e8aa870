"""End-to-end: real ms-swift GKD runs of the tiny embedded default on CPU, wandb offline; files read back.

Each configuration runs once per session (``run`` fixture) and is shared by the tests that read it. Runs are a
few steps long; the 20-step acceptance numbers are in the issue note.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.run import train
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.losses import make_gkd_loss
from gkd_harness.harness.store.captures import load_capture
from gkd_harness.harness.store.metrics_io import read_metrics
from tests.conftest import entry_point

pytestmark = pytest.mark.slow

STEPS = 3
RESUME_STEPS = 12  # long enough to be killed after step 3 with a checkpoint behind it
RUNS = {
    # name: (overrides, world size)
    "original": (["loss=original", "monitor.capture=true", "monitor.spot_check.param_grad=true"], 1),
    "fp32": (["loss=fp32", "monitor.capture=true", "monitor.spot_check.param_grad=true"], 1),
    "fp32_off": (["loss=fp32", "monitor=off"], 1),
    "beta0_topk_sft": (
        ["loss=continuous", "gkd.beta=0", "gkd.topk=8", "gkd.sft_alpha=0.5", "monitor.capture=true", "run.max_steps=2"],
        1,
    ),
    "beta1_ddp": (["loss=fp32", "gkd.beta=1", "backend.nproc_per_node=2", "run.max_steps=2"], 2),
}


def compose_cfg(out_dir, overrides):
    return point_config(
        [
            f"run.output_dir={out_dir}",
            f"run.max_steps={STEPS}",
            "gkd.beta=0.5",
            "gkd.temperature=0.9",
            "tracking.wandb.mode=offline",
            "tracking.wandb.group=e2e",
            *overrides,
        ]
    )[0]


@pytest.fixture(scope="session")
def run(embedded_cache, e2e_root):
    done = {}

    def get(name):
        if name not in done:
            overrides, world = RUNS[name]
            out = e2e_root / name
            summary = train(compose_cfg(out, overrides))
            done[name] = (out, summary, world)
        return done[name]

    return get


def metrics(out):
    return read_metrics(Path(out) / "metrics.jsonl")


def last(out, key):
    return [r[key] for r in metrics(out) if key in r][-1]


def offline_run(out):
    from gkd_harness.analysis.load import OfflineRun, find_offline_runs

    files = find_offline_runs(Path(out) / "wandb")
    assert len(files) == 1, files
    return OfflineRun(files[0])


@pytest.mark.parametrize("name", list(RUNS))
def test_run_folder_contract(run, name):
    out, summary, world = run(name)
    steps = int(compose_cfg(out, RUNS[name][0]).run.max_steps)
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["last_step"] == steps and summary["world_size"] == world
    assert summary["dtypes_seen"] == {"student": "float32", "teacher": "bfloat16"}
    assert summary["dtypes_arrived"] == {"student": "float32", "teacher": "float32"}  # HF delivers FP32 both sides
    assert summary["versions"]["ms-swift"] and summary["versions"]["torch"]
    assert summary["config"]["backend.name"] == "hf" and "loss.precision" in summary["config"]
    assert (out / "config.yaml").is_file() and (out / "swift" / "logging.jsonl").is_file()
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all("train/loss" in r and "train/grad_norm" in r and "train/learning_rate" in r for r in rows)
    # the bypass net's counts (issue 41), monitoring on and off: the writer rank's calls, 1 per step (grad_accum 1)
    assert summary["steps_trained"] == steps and summary["loss_calls"] == steps
    if summary["config"]["monitor.enabled"]:
        # every loss call of every rank went through the harness (1 call per step per rank here)
        assert last(out, "gkd/loss_calls_total") == steps * world
        swift_log = [json.loads(x) for x in (out / "swift" / "logging.jsonl").read_text().splitlines()]
        assert any("gkd/neg_loss_calls_total" in x for x in swift_log)  # ms-swift's own metric path


@pytest.mark.parametrize("name", ["original", "fp32", "beta0_topk_sft"])
def test_wandb_offline_run_holds_harness_metrics(run, name):
    out, summary, _ = run(name)
    wr = offline_run(out)
    assert wr.group == "e2e" and wr.job_type == "gkd-train" and wr.name == out.name
    from gkd_harness.harness.config.flat import flatten

    conf = flatten(wr.config)  # the harness config is logged nested under "harness"
    assert conf["harness.loss.precision"] == summary["config"]["loss.precision"]
    assert conf["harness.gkd.beta"] == summary["config"]["gkd.beta"]
    assert conf["harness.dtypes_seen.teacher"] == "bfloat16"
    assert conf["harness.versions.ms-swift"] == summary["versions"]["ms-swift"]
    hist = [h for h in wr.scan_history() if "train/loss" in h]  # per-step rows (not the end-of-training one)
    local = metrics(out)
    assert len(hist) == len(local)
    for h, m in zip(hist, local):
        for key in ("gkd/neg_loss_calls_total", "spot/grad_rel_l2", "train/loss"):
            assert h[key] == pytest.approx(m[key], rel=1e-6)
    assert wr.summary["gkd/neg_loss_calls_total"]["max"] == last(out, "gkd/neg_loss_calls_total")
    assert "max" in wr.summary["spot/grad_rel_l2"]
    assert "api_key" not in json.dumps(wr.config).lower()


def test_original_is_negative_fp32_is_not(run):
    orig, _, _ = run("original")
    fp32, _, _ = run("fp32")
    assert last(orig, "gkd/neg_loss_calls_total") > 0
    assert last(fp32, "gkd/neg_loss_calls_total") == 0
    for r in metrics(fp32):
        assert r["spot/loss_abs_err"] <= 1e-4 * abs(r["spot/loss_fp64"]) + 2e-6
        assert r["spot/grad_rel_l2"] <= 1e-3 and r["spot/sign_mismatch"] == 0
        assert r["gkd/min_token_jsd"] >= 0
        assert r["spot/param_grad_rel_l2"] <= 1e-3  # model parameter gradient vs the FP64 loss's
    for r in metrics(orig):
        assert r["spot/loss_abs_err"] > 1e-4 * abs(r["spot/loss_fp64"]) + 2e-6
        assert r["spot/grad_rel_l2"] > 0.05 and r["spot/sign_mismatch"] == 1
        assert r["spot/param_grad_rel_l2"] > 1e-3


@pytest.mark.parametrize("name", ["original", "fp32", "beta0_topk_sft"])
def test_logged_values_against_independent_fp64_reference(run, name):
    """The capture of step 1 is what the loss saw; recompute it from first principles."""
    out, summary, _ = run(name)
    cap = load_capture(out / "captures" / "step1_rank0.safetensors")
    assert cap["student_logits"].dtype == torch.float32
    t = cap["teacher_output"]
    assert (t.full_logits if t.full_logits is not None else t.topk_logprobs).dtype == torch.bfloat16
    form = summary["config"]["loss.beta_form"]
    topk = (t.topk_logprobs, t.topk_indices) if t.is_topk_mode else None
    total, n, _ = reference_gkd(
        cap["student_logits"],
        cap["labels"],
        cap["beta"],
        cap["temperature"],
        form,
        teacher_full=t.full_logits,
        teacher_topk=topk,
        teacher_labels=t.labels,
    )
    ref = total / n
    row = metrics(out)[0]
    assert row["spot/loss_fp64"] == pytest.approx(ref, rel=1e-9)
    jsd = row["gkd/jsd_loss"]
    prec = summary["config"]["loss.precision"]
    run_total, run_n = make_gkd_loss(prec, form)(
        cap["student_logits"], t, cap["labels"], cap["beta"], cap["temperature"]
    )
    assert jsd == pytest.approx(float(run_total / run_n), rel=1e-6)  # the logged value is this call's loss
    if prec == "native":
        assert jsd < 0 < ref
    else:
        assert abs(jsd - ref) <= 1e-4 * abs(ref) + 2e-6


def test_sft_term_and_topk(run):
    out, summary, _ = run("beta0_topk_sft")
    assert summary["config"]["gkd.topk"] == 8 and summary["config"]["gkd.sft_alpha"] == 0.5
    for r in metrics(out):
        assert r["gkd/sft_loss"] > 0
        assert r["train/loss"] == pytest.approx(r["gkd/jsd_loss"] + 0.5 * r["gkd/sft_loss"], rel=1e-5)
        assert r["spot/grad_rel_l2"] <= 1e-3 and r["gkd/neg_loss_calls"] == 0


def test_ddp_counts_are_summed_over_ranks(run):
    out, summary, world = run("beta1_ddp")
    assert world == 2 and summary["world_size"] == 2
    rows = metrics(out)
    assert [r["gkd/loss_calls_total"] for r in rows] == [2.0, 4.0]  # 1 call per rank per step, both ranks
    assert all(r["spot/grad_rel_l2"] <= 1e-3 for r in rows)


def test_instrumentation_does_not_change_training(run):
    on, _, _ = run("fp32")
    off, _, _ = run("fp32_off")
    rows_off = metrics(off)
    assert not any(k.startswith(("gkd/", "spot/")) for r in rows_off for k in r)
    for key in ("train/loss", "train/grad_norm"):
        assert [r[key] for r in metrics(on)] == [r[key] for r in rows_off]


def test_completed_run_is_skipped(run):
    out, summary, _ = run("fp32")
    before = (out / "metrics.jsonl").read_text()
    again = train(compose_cfg(out, RUNS["fp32"][0]))
    assert again["ended_at"] == summary["ended_at"]
    assert (out / "metrics.jsonl").read_text() == before


def test_cli_rejects_bad_config_naming_the_key(tmp_path):
    proc = subprocess.run(
        [entry_point("gkd-train"), f"run.output_dir={tmp_path / 'r'}", "gkd.beta=1.5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gkd-train: invalid config: gkd.beta: must lie in [0, 1], got 1.5"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


def test_completed_folder_with_another_config_is_refused_listing_the_keys(run, tmp_path):
    """Issue 12 item 4: a changed path-valued key (model.teacher) used to be skipped as "completed"."""
    out, summary, _ = run("fp32")
    other = tmp_path / "teacher"
    import shutil

    shutil.copytree(summary["inputs"]["teacher"], other)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    args = [
        f"run.output_dir={out}",
        f"run.max_steps={STEPS}",
        "gkd.beta=0.5",
        "gkd.temperature=0.9",
        "tracking.wandb.mode=offline",
        "tracking.wandb.group=e2e",
        *RUNS["fp32"][0],
    ]
    proc = subprocess.run(
        [entry_point("gkd-train"), *args, f"model.teacher={other}"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    assert "model.teacher" in proc.stderr and "run.overwrite=true" in proc.stderr and "Traceback" not in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # nothing touched
    same = subprocess.run([entry_point("gkd-train"), *args], capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, same.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # skipped, .hydra/ untouched


def test_a_second_run_into_a_live_folder_exits_at_once_naming_the_owner(embedded_cache, tmp_path):
    """Issue 12 item 3: the second run used to move the live run's files away and swap its plugin settings."""
    out = tmp_path / "D"
    env = {**os.environ, "GKD_HARNESS_CACHE": str(embedded_cache)}
    first = subprocess.Popen(
        [entry_point("gkd-train"), "run.max_steps=4", f"run.output_dir={out}", "tracking.wandb.mode=disabled"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (out / ".lock").exists():
            assert time.time() < deadline and first.poll() is None, first.stderr.read() if first.poll() else "timeout"
            time.sleep(0.2)
        second = subprocess.run(
            [
                entry_point("gkd-train"),
                "run.max_steps=4",
                "loss=original",
                f"run.output_dir={out}",
                "tracking.wandb.mode=disabled",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        assert str(out) in second.stderr and f"pid {first.pid}" in second.stderr.replace("pid=", "pid ")
        assert first.wait(timeout=900) == 0
    finally:
        if first.poll() is None:
            first.kill()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["config"]["loss.precision"] == "fp32"
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert not (out / "previous_attempts").exists()


@pytest.fixture
def callers_wandb_service(monkeypatch):
    """A live wandb service in this process, its WANDB_SERVICE in the environment every child inherits (as in a
    notebook or a test worker that ran wandb): the CI failure "run ID ... is in use" on resume came from it."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.setup()
    assert os.environ.get("WANDB_SERVICE")
    yield
    wandb.teardown()
    os.environ.pop("WANDB_SERVICE", None)


def test_sigkill_mid_training_keeps_metrics_and_marks_failed_then_resumes(
    embedded_cache, tmp_path, callers_wandb_service
):
    out = tmp_path / "killed"
    env = {**os.environ, "GKD_HARNESS_CACHE": str(embedded_cache)}
    args = [
        entry_point("gkd-train"),
        f"run.output_dir={out}",
        f"run.max_steps={RESUME_STEPS}",
        "run.save_steps=2",
        "loss=original",
        "tracking.wandb.mode=offline",
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and len(read_metrics(out / "metrics.jsonl")) < 3:
            assert proc.poll() is None, "gkd-train ended before it could be killed"
            time.sleep(0.2)
        pid = json.loads((out / "summary.json").read_text())["train_pid"]
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=300) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "killed by SIGKILL" in summary["error"]  # issue 32: named, with
    assert "out of memory?" in summary["error"]  # the OOM killer's signal pointed out
    rows = read_metrics(out / "metrics.jsonl")
    assert len(rows) >= 3 and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert summary["last_step"] >= 3
    assert list((out / "wandb").rglob("run-*.wandb"))

    # run.resume=true continues from the newest complete checkpoint; the metrics stream stays one per step
    done = subprocess.run([*args, "run.resume=true"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and "checkpoint-" in summary["resumed_from"]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, RESUME_STEPS + 1))
    assert rows[-1]["gkd/loss_calls_total"] == RESUME_STEPS  # cumulative counts continue across the restart
    _assert_wandb_rewound_to_the_checkpoint(out, summary["resumed_from"])


def _wandb_history(path):
    """``(branch point or None, [(_step, train/global_step)])`` of one .wandb file."""
    from gkd_harness.analysis.sweep.wandb_file import read_records

    branch, rows = None, []
    for rec in read_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run" and rec.run.branch_point.run:
            branch = (rec.run.branch_point.run, rec.run.branch_point.metric, rec.run.branch_point.value)
        if kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
            if "train/global_step" in items:
                rows.append((items["_step"], items["train/global_step"]))
    return branch, rows


def _assert_wandb_rewound_to_the_checkpoint(out, checkpoint):
    """Issue 41, item 6: the resumed attempt rewinds the same wandb run (WANDB_RESUME_FROM, kept in the offline .wandb
    file for `wandb sync`) to the step where the first attempt logged the checkpoint's global step (one wandb row per
    step here: global step N is row N - 1); its own rows continue right after. Before, it resumed with
    WANDB_RESUME=allow and no branch point, so the first attempt's values after the checkpoint stood.

    Issue 48, item 8: the killed attempt's file may end before the checkpoint (wandb's core dies with the rank); then
    the rewind is to its last row and the rows from there to the checkpoint are replayed from metrics.jsonl. Either
    way the synced history holds every step once, in order, as metrics.jsonl does."""
    from gkd_harness.harness.contract import WANDB_STEP_FILE

    ckpt_step = int(Path(checkpoint).name.split("-")[1])
    recorded = json.loads((Path(checkpoint) / WANDB_STEP_FILE).read_text())
    assert recorded["wandb_step"] == ckpt_step - 1
    first, second = sorted((out / "wandb").rglob("run-*.wandb"), key=lambda p: p.parent.name)[-2:]
    branch0, held = _wandb_history(first)
    assert branch0 is None
    branch, rows = _wandb_history(second)
    rewind = min(recorded["wandb_step"], held[-1][0]) if held else None
    assert branch == (None if rewind is None else (recorded["run_id"], "_step", rewind))
    merged = [r for r in held if rewind is not None and r[0] <= rewind] + rows
    assert [w for w, _ in merged] == list(range(len(merged)))  # wandb's rows contiguous after the rewind
    # one row per step, then HF's end-of-training summary row at the last step
    assert [g for _, g in merged] == [*range(1, RESUME_STEPS + 1), RESUME_STEPS]
    metric_steps = [r["step"] for r in read_metrics(out / "metrics.jsonl")]
    assert metric_steps == [g for _, g in merged][:-1]
