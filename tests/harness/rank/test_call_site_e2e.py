"""A call site that fails to import when the plugin loads stops the run (exit 1, the module named), never a
"completed" run on upstream's loss (issue 31). The failure is injected by a ``sitecustomize`` on the ms-swift
process's path: the plugin's import of ``swift.rlhf_trainers.gkd_trainer`` raises once; ms-swift's own import of
it later succeeds, with upstream's ``gkd_loss`` bound."""

import pytest

from tests.launch.helpers import harness_env, read_summary, run_gkd_train, tail

SITECUSTOMIZE = """
import importlib.abc, sys, traceback

class _FailForThePlugin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "swift.rlhf_trainers.gkd_trainer" and any(
                f.filename.endswith("harness/rank/plugin.py") for f in traceback.extract_stack()):
            raise ImportError("injected: the plugin cannot import the HF trainer")
        return None

sys.meta_path.insert(0, _FailForThePlugin())
"""


@pytest.mark.slow
def test_a_failed_call_site_import_stops_the_run_naming_the_module(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = harness_env(tmp_path / "out")
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    run_dir = tmp_path / "run"
    proc = run_gkd_train(["run.max_steps=2", "loss=fp32", f"run.output_dir={run_dir}"], env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, tail(out)
    assert "swift.rlhf_trainers.gkd_trainer" in out and "injected: the plugin cannot import the HF trainer" in out
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and summary["status"] != "completed"
