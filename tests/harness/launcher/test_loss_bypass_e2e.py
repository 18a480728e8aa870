"""End-to-end: a run whose training steps never call the harness's ``gkd_loss`` ends as failed (issue 41).

The bypass is real and unlisted: ms-swift's own ``--custom_register_path`` (a free flag, so ``run.extra_args``
passes it; ms-swift appends it to ``--external_plugins`` after the harness's plugin) loads a file that reroutes the
HF GKD trainer's JSD method to ms-swift's upstream ``gkd_loss``, held by its own reference: the trainer module's
``gkd_loss`` still is the harness's (so the train-begin check passes), but no training step calls it, as with
Liger's fused loss. ``monitor=off``: the bare path, with no instrument to count calls.
"""

import json
import os
import subprocess

import pytest

from gkd_harness.harness.store.metrics_io import read_metrics
from tests.conftest import entry_point

pytestmark = pytest.mark.slow

STEPS = 2

#: A stand-in for a fused-loss flag nobody listed: the trainer's loss method no longer calls the module's gkd_loss.
BYPASS_PLUGIN = """
from swift.rlhf_trainers import gkd_loss as _upstream_module
from swift.rlhf_trainers.gkd_trainer import GKDTrainer

_upstream = _upstream_module.gkd_loss  # ms-swift's own function, not the module global the harness rebinds


def _compute_jsd_loss(self, student_logits, teacher_output, labels):
    import torch

    shifted = torch.roll(labels, shifts=-1, dims=1)
    teacher_output.labels = torch.roll(teacher_output.labels, shifts=-1, dims=1)
    total, num_valid = _upstream(student_logits, teacher_output, shifted, self.beta, self.temperature)
    return total * 0 if num_valid == 0 else total / num_valid


GKDTrainer._compute_jsd_loss = _compute_jsd_loss
print("bypass plugin: GKDTrainer._compute_jsd_loss rerouted to upstream gkd_loss", flush=True)
"""


def test_a_run_that_never_calls_the_harness_loss_ends_failed(tmp_path, embedded_cache):
    plugin = tmp_path / "bypass_plugin.py"
    plugin.write_text(BYPASS_PLUGIN)
    out = tmp_path / "run"
    env = {**os.environ, "GKD_HARNESS_CACHE": str(embedded_cache), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    proc = subprocess.run(
        [
            entry_point("gkd-train"),
            f"run.output_dir={out}",
            f"run.max_steps={STEPS}",
            "loss=fp32",
            "monitor=off",
            "tracking.wandb.mode=offline",
            f"run.extra_args=[--custom_register_path,{plugin}]",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    swift_log = (out / "swift.log").read_text() if (out / "swift.log").exists() else ""
    assert "bypass plugin: GKDTrainer._compute_jsd_loss rerouted" in swift_log, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 1, (proc.returncode, summary.get("status"), proc.stderr[-2000:])
    assert summary["status"] == "failed"
    error = summary["error"]
    assert error == (
        f"TrainingFailed: the harness's gkd_loss was never called in {STEPS} training steps: something bypassed it "
        "(a fused-loss flag such as --use_liger_kernel, an external plugin rebinding gkd_loss or the trainer's loss "
        f"method, ...); the run measured nothing (summary.json: loss_calls=0, steps_trained={STEPS})"
    )
    assert proc.stderr.splitlines()[-1] == "gkd-train: run failed: " + error.removeprefix("TrainingFailed: ")
    assert "Traceback" not in proc.stderr
    # what was logged stays: the steps ms-swift trained are in metrics.jsonl, the wandb files are there
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert summary["last_step"] == STEPS
    assert summary["loss_calls"] == 0 and summary["steps_trained"] == STEPS
    assert list((out / "wandb").rglob("run-*.wandb"))
