"""The bare GPU proof (launch/gpu_bare.py), rehearsed on the CPU: from a plain checkout (PYTHONPATH, the project's
install not used), ms-swift's loss file loaded without its package __init__, one row per check.

The full bare-image simulation (a venv with torch + transformers and the ms-swift wheel only) is a documented
command in docs/cluster.md; these tests keep to seconds."""
import json
import subprocess
import sys

from tests.launch.helpers import REPO


def _bare(tmp_path, *args, code=None):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "launch.gpu_bare", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_bare_mode_rows_on_cpu(tmp_path):
    out = tmp_path / "out"
    proc = _bare(tmp_path, "--out", str(out), "--device", "cpu", "--tokens", "4", "1",
                 "--only", "repro", "native_bitwise", "seed_shape/topk", "seed_shape/full/beta0.5")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["bare_checks.json", "bare_checks.md", "rows.jsonl"]
    rows = {r["check"]: r for r in json.loads((out / "bare_checks.json").read_text())["rows"]}
    assert list(rows) == ["env", "repro", "native_bitwise/topk", "native_bitwise/full", "seed_shape/topk/beta0",
                          "seed_shape/topk/beta0.5", "seed_shape/topk/beta0.9", "seed_shape/topk/beta1",
                          "seed_shape/full/beta0.5"]
    assert rows["native_bitwise/full"]["loss_equal"] and rows["native_bitwise/full"]["grad_equal"]
    seed = rows["seed_shape/full/beta0.5"]
    assert seed["vocab"] == 248_320 and seed["teacher_dtype"] == "bfloat16"
    v = seed["variants"]
    assert v["fp64"]["grad_rel_l2_vs_fp64"] == 0 and v["fp32"]["grad_rel_l2_vs_fp64"] < 1e-3
    assert v["upstream"]["negative"]  # the defect at the seed shape: the exact loss is positive
    assert v["fp64"]["loss"] > 0 and not v["fp32"]["negative"]
    assert rows["repro"]["upstream_native"] < 0 < rows["repro"]["variants"]["fp64"]["loss"]
    assert rows["env"]["harness_from"] == str(REPO / "harness")


def test_loss_file_loads_without_ms_swift_package_init(tmp_path):
    """A bare image where ms-swift's __init__ cannot import (simulated: swift.utils blocked): the loss file alone
    is loaded under its module name, and the harness's native variant binds to it."""
    code = ("import sys; sys.modules['swift.utils'] = None\n"
            "from launch.gpu_bare import load_upstream_loss\n"
            "mod, how = load_upstream_loss(); print(how)\n"
            "from harness.losses import make_gkd_loss\n"
            "assert make_gkd_loss('native') is mod.gkd_loss\n")
    proc = _bare(tmp_path, code=code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("loss file only (") and "gkd_loss.py" in proc.stdout
