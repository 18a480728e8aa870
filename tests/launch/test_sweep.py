"""gkd_harness.launch.sweep with real Hydra multiruns of a small task function (fast; no ms-swift).

The task function follows the run-folder contract the way gkd_harness.harness.launcher.cli does (summary.json running ->
completed | failed, metrics.jsonl one line per step, skip when completed) so the callback's bookkeeping is
exercised through the repo's own ``configs/hydra`` (callbacks, folders, names, launchers). The end-to-end
versions with the real ``gkd-train`` live in ``tests/launch/test_sweep_e2e.py``.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import hydra
    from gkd_harness.harness.launcher.compose import register

    register()  # the harness's resolvers (configs/hydra/launcher/submitit_local.yaml's gkd_local_gpus)

    @hydra.main(version_base="1.3", config_path="configs", config_name="train")
    def main(cfg):
        out = Path(cfg.run.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        manifest = out.parent / "sweep_manifest.json"  # written by the launching process before any point
        (out / "manifest_at_start").write_text(manifest.read_text() if manifest.exists() else "")
        summary = out / "summary.json"
        if summary.exists() and json.loads(summary.read_text())["status"] == "completed":
            with open(out / "skipped", "a") as fh:
                fh.write("x")
            return
        conf = {"run.max_steps": cfg.run.max_steps, "gkd.beta": cfg.gkd.beta}
        summary.write_text(json.dumps({"status": "running", "error": None, "config": conf}))
        with open(out / "runs", "a") as fh:
            fh.write("x")
        for step in range(1, cfg.run.max_steps + 1):
            with open(out / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps({"step": step, "train/loss": 0.1}) + "\\n")
        if cfg.gkd.beta == cfg.run.fail_beta:
            summary.write_text(json.dumps({"status": "failed", "error": "RuntimeError: planned failure",
                                           "config": conf, "last_step": cfg.run.max_steps}))
            raise RuntimeError("planned failure")
        summary.write_text(json.dumps({"status": "completed", "error": None, "config": conf,
                                       "last_step": cfg.run.max_steps, "wall_s": 0.5}))

    if __name__ == "__main__":
        main()
    """
)

TRAIN = textwrap.dedent(
    """
    defaults:
      - hydra: default
      - _self_
    gkd: {beta: 0.5}
    run: {max_steps: 3, output_dir: "${hydra:runtime.output_dir}", fail_beta: -1, device: cpu}
    backend: {nproc_per_node: 1}
    tracking: {wandb: {group: unit, mode: offline}}
    """
)


@pytest.fixture()
def app(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "hydra").symlink_to(REPO / "configs" / "hydra")
    (tmp_path / "configs" / "train.yaml").write_text(TRAIN)
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def _run(app, *overrides):
    env = {**os.environ, "GKD_OUTPUT_ROOT": str(app / "out"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "app.py", "-m", *overrides], cwd=app, env=env, capture_output=True, text=True, timeout=240
    )
    return proc, proc.stdout + proc.stderr


def _summary_lines(text):
    return [line for line in text.splitlines() if line.startswith("  ") and ("gkd.beta=" in line)]


@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_failing_point_does_not_stop_the_others_and_each_point_gets_a_line(app, launcher):
    proc, out = _run(
        app,
        f"hydra/launcher={launcher}",
        "gkd.beta=0.1,0.5,0.9,1.0",
        "run.fail_beta=0.5",
        "hydra.callbacks.sweep_status.progress_interval_s=0",
    )
    assert proc.returncode != 0, out  # Hydra re-raises the failed point after the batch
    sweep = app / "out" / "multirun" / "unit"
    status = {
        d.name: json.loads((d / "summary.json").read_text())["status"]
        for d in sweep.iterdir()
        if (d / "summary.json").exists()
    }
    assert status == {
        "gkd.beta=0.1,run.fail_beta=0.5": "completed",
        "gkd.beta=0.5,run.fail_beta=0.5": "failed",
        "gkd.beta=0.9,run.fail_beta=0.5": "completed",
        "gkd.beta=1.0,run.fail_beta=0.5": "completed",
    }
    lines = _summary_lines(out.split("summary, 4 points")[1])
    assert len(lines) == 4, out
    assert sum(line.split()[0] == "completed" for line in lines) == 3
    failed = [line for line in lines if line.split()[0] == "failed"]
    assert len(failed) == 1 and "gkd.beta=0.5" in failed[0] and "planned failure" in failed[0]
    assert "[sweep unit] summary, 4 points: 3 completed, 1 failed" in out
    verdict = json.loads((sweep / "gkd.beta=0.5,run.fail_beta=0.5" / ".hydra" / "job_return.json").read_text())
    assert verdict["status"] == "FAILED" and "planned failure" in verdict["error"]
    # every point (a submitit worker process for submitit_local) found the whole plan already written
    for name in status:
        manifest = json.loads((sweep / name / "manifest_at_start").read_text())
        assert manifest["points"] == sorted(status) and manifest["group"] == "unit", name
        assert manifest["launcher"].endswith("LocalLauncher" if launcher == "submitit_local" else "BasicLauncher")


def test_resume_skips_completed_and_reruns_failed(app):
    args = ("gkd.beta=0.1,0.5", "hydra.callbacks.sweep_status.progress_interval_s=0")
    first, out1 = _run(app, *args, "run.fail_beta=0.5")
    assert first.returncode != 0
    sweep = app / "out" / "multirun" / "unit"
    third, out3 = _run(app, *args, "run.fail_beta=0.5")  # the same command again
    assert "2 points" in out3 and "1 completed earlier (skipped), 1 failed earlier (rerun)" in out3
    done = sweep / "gkd.beta=0.1,run.fail_beta=0.5"
    assert (done / "runs").read_text() == "x"  # ran once
    assert (done / "skipped").read_text() == "x"  # skipped on the rerun
    assert (sweep / "gkd.beta=0.5,run.fail_beta=0.5" / "runs").read_text() == "xx"  # failed point reran
    assert "completed (skipped: completed earlier)" in out3


def test_progress_line_reports_done_failed_and_current_step(tmp_path):
    from gkd_harness.launch.sweep import SweepStatusCallback

    cb = SweepStatusCallback(progress_interval_s=0)
    cb._group = "g"
    cb._points = [("a", tmp_path / "a"), ("b", tmp_path / "b"), ("c", tmp_path / "c")]
    for name, status in (("a", "completed"), ("b", "running")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"status": status, "config": {"run.max_steps": 20}}))
    (tmp_path / "b" / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 7)))
    line = cb.progress_line()
    assert line.startswith("[sweep g] 1/3 points done, 0 failed | b step 7/20 | "), line
    assert " elapsed, ETA " in line


REFUSING_APP = (
    APP.replace(  # as gkd_harness.harness.launcher.cli does when run_folder refuses a folder holding another config
        "    out = Path(cfg.run.output_dir)\n",
        "    out = Path(cfg.run.output_dir)\n"
        '    if cfg.run.get("dataset") == "b":\n'
        "        from gkd_harness.harness.launcher.cli import PointFailed\n"
        '        return PointFailed(2, "ConfigMismatch: the folder holds a run of another config", refused=True)\n',
    )
)
assert REFUSING_APP != APP


def test_a_refused_rerun_writes_nothing_into_the_folders_it_does_not_own(app):
    """Issue 19: a rerun refused because the folders hold another config's runs (or another sweep's live point)
    used to write job_return.json FAILED into every completed folder, so gkd-analyze counted them as failed."""
    (app / "app.py").write_text(REFUSING_APP)
    (app / "configs" / "train.yaml").write_text(TRAIN.replace("fail_beta: -1,", "fail_beta: -1, dataset: a,"))
    args = ("gkd.beta=0.1,0.5", "hydra.callbacks.sweep_status.progress_interval_s=0")
    first, out1 = _run(app, *args)
    assert first.returncode == 0, out1
    sweep = app / "out" / "multirun" / "unit"
    names = ["gkd.beta=0.1", "gkd.beta=0.5"]
    manifest = json.loads((sweep / "sweep_manifest.json").read_text())
    assert manifest["points"] == names and manifest["group"] == "unit"
    # the plan (issue 38): each point's declared seed, steps and overrides; the launch, append-only
    assert manifest["declared"][names[0]]["overrides"] == ["gkd.beta=0.1"]
    assert [x["id"] for x in manifest["launches"]] == [1] and manifest["launches"][0]["adds"] == names
    before = {n: (sweep / n / ".hydra" / "job_return.json").read_text() for n in names}
    live = sweep / "gkd.beta=0.5" / "summary.json"  # as if another sweep's point were running there
    live.write_text(json.dumps({"status": "running", "error": None, "config": {}}))
    second, out2 = _run(app, *args, "run.dataset=b")  # run.dataset is not in the folder name
    assert second.returncode == 2, out2  # refused, as gkd-train refusing one folder (README: exit 2)
    relaunch = json.loads((sweep / "sweep_manifest.json").read_text())["launches"]
    assert [x["id"] for x in relaunch] == [1, 2] and relaunch[1]["adds"] == [] and relaunch[1]["drops"] == []
    assert {n: (sweep / n / ".hydra" / "job_return.json").read_text() for n in names} == before
    assert json.loads(before["gkd.beta=0.1"])["status"] == "COMPLETED"
    assert json.loads(live.read_text())["status"] == "running"
    log = (sweep / "refused_points.log").read_text().splitlines()
    assert len(log) == 2 and all("ConfigMismatch" in line for line in log)
    assert "refused: gkd.beta=0.1: ConfigMismatch" in out2 and "2 points refused" in out2


def test_submitit_slurm_writes_the_manifest_before_it_submits(app):
    """hydra/launcher=submitit_slurm: the launching process writes sweep_manifest.json before submitit builds
    its SLURM executor. Without SLURM here, submitit then stops ("Could not detect srun"), so nothing was
    submitted and no point started, yet the plan is on disk for gkd-analyze to name the missing points."""
    proc, out = _run(
        app, "hydra/launcher=submitit_slurm", "gkd.beta=0.1,0.5", "hydra.callbacks.sweep_status.progress_interval_s=0"
    )
    assert proc.returncode != 0 and "srun" in out, out
    sweep = app / "out" / "multirun" / "unit"
    manifest = json.loads((sweep / "sweep_manifest.json").read_text())
    assert manifest["points"] == ["gkd.beta=0.1", "gkd.beta=0.5"] and manifest["group"] == "unit"
    assert manifest["launcher"].endswith("SlurmLauncher")
    assert not [d for d in sweep.iterdir() if d.name.startswith("gkd.beta=")]  # no point started


def test_a_sweep_of_invalid_points_exits_2_like_a_single_run(tmp_path):
    """Before: ``gkd-train -m gkd.beta=1.5,2`` printed one line per point and exited 1 ("the run failed"), breaking
    the exit-code contract (2 = config error) that a single ``gkd-train gkd.beta=1.5`` keeps. Nothing loads."""
    from tests.conftest import entry_point

    env = {**os.environ, "GKD_OUTPUT_ROOT": str(tmp_path / "out")}
    proc = subprocess.run(
        [
            entry_point("gkd-train"),
            "-m",
            "gkd.beta=1.5,0.5",
            "run.max_steps=1",
            "run.dry_run=true",
            "hydra.callbacks.sweep_status.progress_interval_s=0",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "1 of 2 points have an invalid config (first: gkd.beta: must lie in [0, 1], got 1.5)" in out, out


INVALID_APP = (
    APP.replace(  # as gkd_harness.harness.launcher.cli does when validation refuses a point (ConfigError, exit 2)
        "    out = Path(cfg.run.output_dir)\n",
        "    out = Path(cfg.run.output_dir)\n"
        '    if cfg.run.get("dataset") == "b":\n'
        "        from gkd_harness.harness.launcher.cli import PointFailed\n"
        '        return PointFailed(2, "ConfigError: run.dataset: b: row 1 has no assistant turn")\n',
    )
)
assert INVALID_APP != APP


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_invalid_rerun_writes_nothing_into_the_completed_folders(app):
    """Issue 29, reproduction 9: rerunning a completed sweep's group with an invalid ``run.dataset`` (not in the
    folder names, so the points map onto the completed folders): validation refuses every point, and the callback
    wrote job_return.json FAILED into all the completed folders, so gkd-analyze's verdict flipped to "failed".
    An invalid point owns no folder that holds another attempt's run: its refusal goes to the console and the
    sweep's log, and the sweep exits 2 as a single invalid gkd-train does."""
    (app / "app.py").write_text(INVALID_APP)
    (app / "configs" / "train.yaml").write_text(TRAIN.replace("fail_beta: -1,", "fail_beta: -1, dataset: a,"))
    args = ("gkd.beta=0.1,0.5", "hydra.callbacks.sweep_status.progress_interval_s=0")
    first, out1 = _run(app, *args)
    assert first.returncode == 0, out1
    sweep = app / "out" / "multirun" / "unit"
    names = ["gkd.beta=0.1", "gkd.beta=0.5"]
    before = {n: _files(sweep / n) for n in names}
    assert json.loads(before["gkd.beta=0.1"][".hydra/job_return.json"])["status"] == "COMPLETED"
    second, out2 = _run(app, *args, "run.dataset=b")
    assert second.returncode == 2, out2
    assert {n: _files(sweep / n) for n in names} == before  # not a byte changed in either completed folder
    log = (sweep / "refused_points.log").read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in log] == [
        f"refused: {n}: ConfigError: run.dataset: b: row 1 has no assistant turn" for n in names
    ]
    assert "[sweep unit] refused: gkd.beta=0.1: ConfigError: run.dataset" in out2
    assert "2 of 2 points have an invalid config (first: run.dataset: b: row 1 has no assistant turn)" in out2
    table = _summary_lines(out2.split("summary, 2 points")[1])
    assert [line.split()[0] for line in table] == ["refused", "refused"], out2


def test_an_invalid_point_in_a_fresh_folder_still_records_its_failure_there(app):
    """The folder Hydra made for this attempt alone (nothing of another attempt in it) is the point's own: its
    job_return.json says FAILED with the error, so gkd-analyze names the config-failed point."""
    (app / "app.py").write_text(INVALID_APP)
    (app / "configs" / "train.yaml").write_text(TRAIN.replace("fail_beta: -1,", "fail_beta: -1, dataset: b,"))
    proc, out = _run(app, "gkd.beta=0.1", "hydra.callbacks.sweep_status.progress_interval_s=0")
    assert proc.returncode == 2, out
    verdict = json.loads(
        (app / "out" / "multirun" / "unit" / "gkd.beta=0.1" / ".hydra" / "job_return.json").read_text()
    )
    assert verdict == {"status": "FAILED", "error": "ConfigError: run.dataset: b: row 1 has no assistant turn"}


def test_gkd_train_rerun_of_a_completed_smoke_group_with_an_invalid_dataset_leaves_its_folders_alone(tmp_path):
    """Issue 29, reproduction 9, with the real ``gkd-train``: the smoke group's three completed folders (as a
    finished ``gkd-train -m experiment=smoke`` leaves them), then the same sweep with a ``run.dataset`` whose row
    has no assistant turn. Validation refuses each point before any model loads; before the fix every completed
    folder then got ``job_return.json`` FAILED and the sign-off said "3 failed of 3 runs"."""
    from tests.conftest import entry_point

    sweep = tmp_path / "out" / "multirun" / "smoke"
    names = ["loss=continuous", "loss=fp32", "loss=original"]
    for name in names:
        (sweep / name / ".hydra").mkdir(parents=True)
        (sweep / name / "summary.json").write_text(
            json.dumps({"status": "completed", "error": None, "last_step": 2, "config": {"run.max_steps": 2}})
        )
        (sweep / name / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
        (sweep / name / ".hydra" / "job_return.json").write_text('{"status": "COMPLETED", "error": null}')
        (sweep / name / "cli.log").write_text("")  # Hydra's job log file, which it opens for every job
    before = {n: _files(sweep / n) for n in names}
    bad = tmp_path / "no_assistant.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    env = {**os.environ, "GKD_OUTPUT_ROOT": str(tmp_path / "out"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            entry_point("gkd-train"),
            "-m",
            "experiment=smoke",
            f"run.dataset={bad}",
            "hydra.callbacks.sweep_status.progress_interval_s=0",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert {n: _files(sweep / n) for n in names} == before, out
    log = (sweep / "refused_points.log").read_text()
    assert all(f"refused: {n}: ConfigError: run.dataset: " in log for n in names), log
    assert "3 of 3 points have an invalid config (first: run.dataset: " in out, out


CANDIDATE = str(REPO / "examples" / "candidates" / "good_promote_first.py")


def _planned_folders(out: str) -> list[str]:
    return sorted(
        line.split("run folder ", 1)[1].strip()
        for line in out.splitlines()
        if line.startswith("# gkd-train dry run: run folder ")
    )


@pytest.mark.parametrize(
    "recipe,group",
    [
        (["tracking.wandb.group=certify-my-pr"], "certify-my-pr"),  # README's recipe: a group of its own
        ([], "smoke"),  # the recipe before it had one
    ],
)
def test_the_certify_recipe_plans_the_original_point_in_its_own_folder(tmp_path, recipe, group):
    """Issue 29, reproduction 4: ``loss.name`` / ``loss.source`` (set on every point of the sweep) named the
    original point's folder ``loss.name=my-pr,loss=original``, so upstream trained again beside its completed
    run. The README's recipe plans exactly two points, original and candidate, in a group of its own."""
    from tests.conftest import entry_point

    env = {**os.environ, "GKD_OUTPUT_ROOT": str(tmp_path / "out"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            entry_point("gkd-train"),
            "-m",
            "experiment=smoke",
            "loss=original,candidate",
            f"loss.source={CANDIDATE}",
            "loss.name=my-pr",
            *recipe,
            "run.dry_run=true",
            "hydra.callbacks.sweep_status.progress_interval_s=0",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    sweep = tmp_path / "out" / "multirun" / group
    assert _planned_folders(out) == [str(sweep / "loss=candidate"), str(sweep / "loss=original")], out


@pytest.mark.slow
def test_the_certify_recipe_after_a_smoke_sweep_leaves_the_original_folder_untouched(tmp_path, smoke_sweep):
    """The recipe run in a group whose original point completed earlier with the same config: that point is
    skipped and its folder is not touched (not a byte: no verdict, no log line); only the candidate trains."""
    import shutil

    from tests.conftest import SMOKE_GROUP, SMOKE_STEPS
    from tests.launch.helpers import harness_env, run_gkd_train

    sweep = tmp_path / "out" / "multirun" / SMOKE_GROUP
    shutil.copytree(smoke_sweep, sweep)
    original = next(sweep.glob("loss=original,*"))
    before = _files(original)
    proc = run_gkd_train(
        [
            "experiment=smoke",
            "loss=original,candidate",
            f"loss.source={CANDIDATE}",
            "loss.name=my-pr",
            f"run.max_steps={SMOKE_STEPS}",
            "monitor.capture=true",
            f"tracking.wandb.group={SMOKE_GROUP}",
            "hydra.callbacks.sweep_status.progress_interval_s=0",
        ],
        harness_env(tmp_path / "out"),
        tmp_path,
        multirun=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert _files(original) == before
    assert f"completed (skipped: completed earlier) steps {SMOKE_STEPS}/{SMOKE_STEPS}" in out
    candidate = sweep / original.name.replace("loss=original", "loss=candidate")
    summary = json.loads((candidate / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["candidate"]["name"] == "my-pr"
    assert sorted(p.name.split(",")[0] for p in sweep.iterdir() if p.is_dir()) == [
        "loss=candidate",
        "loss=continuous",
        "loss=fp32",
        "loss=original",
    ]


SKIP_LOGGING_APP = APP.replace(  # as gkd_harness.harness.launcher.run does: a skipped point logs one line, then returns
    '        with open(out / "skipped", "a") as fh:\n            fh.write("x")\n',
    "        import logging\n"
    '        logging.getLogger("gkd_harness.train").info(f"{out}: completed earlier with the same config, skipping")\n',
)
assert SKIP_LOGGING_APP != APP


def test_a_skipped_point_leaves_the_completed_folder_byte_for_byte(app):
    """Hydra's default job logging opened ``<run folder>/<job>.log`` for every job, so a point skipped because
    the same config completed there appended its log line to the earlier run's folder (and the callback rewrote
    that run's job_return.json). configs/hydra/job_logging/console.yaml: the console only."""
    (app / "app.py").write_text(SKIP_LOGGING_APP)
    args = ("gkd.beta=0.1", "hydra.callbacks.sweep_status.progress_interval_s=0")
    first, out1 = _run(app, *args)
    assert first.returncode == 0, out1
    done = app / "out" / "multirun" / "unit" / "gkd.beta=0.1"
    ours = lambda: {k: v for k, v in _files(done).items() if k != "manifest_at_start"}  # noqa: E731 (the app's probe)
    before = ours()
    second, out2 = _run(app, *args)
    assert second.returncode == 0, out2
    assert "completed earlier with the same config, skipping" in out2  # on the console
    assert ours() == before


def _summary(folder: Path, status: str, last: int = 2) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(
        json.dumps({"status": status, "error": None, "last_step": last, "config": {"run.max_steps": 4}})
    )


def test_the_sweep_summary_counts_an_interrupted_point(tmp_path):
    """Issue 40 item 6: after Ctrl-C the summary read "6 points: 0 completed, 0 failed, 5 missing": the point whose
    summary.json says interrupted was in no count."""
    import io

    from gkd_harness.launch.sweep import SweepStatusCallback

    out = io.StringIO()
    cb = SweepStatusCallback(progress_interval_s=0, stream=out)
    cb._sweep_dir, cb._group = tmp_path, "g"
    cb._points = [(n, tmp_path / n) for n in ("a", "b", "c")]
    _summary(tmp_path / "a", "completed", 4)
    _summary(tmp_path / "b", "interrupted")
    cb._report()
    head = out.getvalue().splitlines()[0]
    assert "summary, 3 points: 1 completed, 0 failed, 1 interrupted, 1 missing" in head, head


def test_two_sweeps_of_one_group_at_once_each_read_back_only_their_own_refusals(tmp_path):
    """Issue 38 item 10: two sweeps of one group at once both printed "0 completed, 2 refused" and exited 1, though
    each point trained once: each read the other's refusals from the shared log. A refusal is tagged with its
    launch; a point refused because the other launch held its folder, which completed there, is not refused."""
    import io

    from gkd_harness.launch.sweep import SweepStatusCallback

    a, b = (SweepStatusCallback(progress_interval_s=0, stream=io.StringIO()) for _ in range(2))
    for cb in (a, b):
        cb._sweep_dir, cb._group = tmp_path, "g"
        cb._points = [(n, tmp_path / n) for n in ("p1", "p2")]
    _summary(tmp_path / "p1", "completed", 4)
    _summary(tmp_path / "p2", "completed", 4)
    b._refused(tmp_path / "p1", "RunFolderBusy: p1 is owned by a live run (pid 1)")
    b._refused(tmp_path / "p2", "ConfigMismatch: the folder holds a run of another config")
    assert a.refused_points() == {} and [p.status for p in a.statuses()] == ["completed", "completed"]
    assert b.refused_points() == {"p2": "ConfigMismatch: the folder holds a run of another config"}
    assert [p.status for p in b.statuses()] == ["completed", "refused"]
