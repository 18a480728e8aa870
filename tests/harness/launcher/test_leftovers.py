"""No leftovers (issue 24, item 7): a dry-run sweep and a config error leave no folder under the output root.
Before the fix ``gkd-train -m experiment=beta_sweep run.dry_run=true`` left 24 empty point folders (and the sweep
folder with multirun.yaml), and a config error left a run folder holding an empty log file."""

from __future__ import annotations

import os
import subprocess

from gkd_harness.harness.launcher.leftovers import remove_if_empty
from tests.conftest import entry_point


def _gkd_train(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "GKD_OUTPUT_ROOT": str(tmp_path / "out")}
    return subprocess.run(
        [entry_point("gkd-train"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def _left(tmp_path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def test_a_dry_run_sweep_leaves_no_folder(tmp_path):
    p = _gkd_train(tmp_path, "-m", "experiment=smoke", "run.dry_run=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("# gkd-train dry run") == 3
    assert _left(tmp_path) in ([], ["out"])


def test_a_config_error_leaves_no_folder(tmp_path):
    p = _gkd_train(tmp_path, "gkd.beta=2")
    assert p.returncode == 2 and "gkd.beta" in p.stderr
    assert _left(tmp_path) in ([], ["out"])


def test_a_folder_with_content_is_never_removed(tmp_path):
    run = tmp_path / "out" / "runs" / "g" / "x"
    run.mkdir(parents=True)
    (run / "train.log").write_text("")
    (run / "summary.json").write_text("{}")
    assert not remove_if_empty(run, tmp_path / "out") and (run / "summary.json").exists()
    (run / "summary.json").unlink()
    assert remove_if_empty(run, tmp_path / "out")
    assert _left(tmp_path) == ["out"]  # the empty parents went too, the output root stayed


def test_a_failed_sweep_point_keeps_its_folder_and_the_sweep_exits_2(tmp_path):
    """Tidying up never hides a failure: the point's job_return.json records it, and the sweep exits 2 (an invalid
    config, as a single run; tests/launch/test_sweep.py covers the exit code)."""
    p = _gkd_train(tmp_path, "-m", "experiment=smoke", "gkd.beta=2")
    assert p.returncode == 2, p.stderr[-2000:]
    assert len(list((tmp_path / "out").rglob("job_return.json"))) == 3


def test_a_dry_run_leaves_an_earlier_sweeps_multirun_yaml_as_it_was(tmp_path):
    """Issue 47, item 15: docs/beta.md's dry run in the quick start's folder rewrote that sweep's multirun.yaml
    (Hydra writes it before any job starts). Now a dry run puts the earlier one back, byte for byte."""
    sweep = tmp_path / "out" / "multirun" / "smoke"
    sweep.mkdir(parents=True)
    earlier = b"# the smoke sweep that ran\nhydra:\n  mode: MULTIRUN\n"
    (sweep / "multirun.yaml").write_bytes(earlier)
    p = _gkd_train(tmp_path, "-m", "experiment=smoke", "gkd.beta=0.9", "run.dry_run=true")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (sweep / "multirun.yaml").read_bytes() == earlier
    assert sorted(x.name for x in sweep.iterdir()) == ["multirun.yaml"]
