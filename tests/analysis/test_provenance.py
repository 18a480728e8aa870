"""Issue 19: provenance of a run (harness commit and dirty flag, sha256 of the loss code, ms-swift version) in
summary.json and in the analysis tables."""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib.metadata import distribution, version
from pathlib import Path

from gkd_harness.analysis.sweep.runs import load_sweep
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.store.provenance import provenance
from gkd_harness.harness.store.run_folder import RunFolder

REPO = Path(__file__).resolve().parents[2]


def test_provenance_names_the_commit_and_hashes_the_loss_code_each_precision_runs():
    native = provenance("native")
    upstream = Path(distribution("ms-swift").locate_file("swift/rlhf_trainers/gkd_loss.py"))
    assert native["loss_sha256"] == hashlib.sha256(upstream.read_bytes()).hexdigest()
    assert native["ms_swift"] == version("ms-swift")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert native["harness_commit"] == head and isinstance(native["harness_dirty"], bool)
    fp32 = provenance("fp32")
    assert fp32["loss_code"] == str(REPO / "gkd_harness" / "harness" / "loss") and len(fp32["loss_sha256"]) == 64
    assert fp32["loss_sha256"] != native["loss_sha256"]


def test_summary_json_carries_the_provenance_and_the_analysis_reads_it(tmp_path):
    (tmp_path / "run").mkdir()
    summary = RunFolder(tmp_path / "run").start_summary("run", "g", {"loss.precision": "native", "run.max_steps": 2})
    assert summary["provenance"]["loss_sha256"] == provenance("native")["loss_sha256"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["provenance"] == summary["provenance"]
    run = write_run(tmp_path / "sweep" / "a", beta=0.5, beta_form="paper", precision="native", seed=1, steps=4)
    s = json.loads((run / "summary.json").read_text())
    s["provenance"] = provenance("native")
    (run / "summary.json").write_text(json.dumps(s))
    row = load_sweep(tmp_path / "sweep").runs.iloc[0]
    assert row["version.loss_sha256"] == s["provenance"]["loss_sha256"]
    assert row["version.harness_commit"] == s["provenance"]["harness_commit"]
