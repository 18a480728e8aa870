"""The bare GPU proof (launch/gpu_bare.py), rehearsed on the CPU: from a plain checkout (PYTHONPATH, the project's
install not used), ms-swift's loss file loaded without its package __init__, every row judged against the
independent FP64 reference (harness/loss/reference.py).

Each row can fail: the defect rows turn to "not reproduced" when upstream is swapped for a fixed loss, and the fix
rows fail when fp32 is broken (a negative loss, or a gradient 1% off with the right value)."""

import json
import subprocess
import sys

import pytest

from tests.launch.helpers import REPO


def _bare(tmp_path, *args, code=None):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "gkd_harness.launch.gpu_bare", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _rows(out):
    return {r["check"]: r for r in json.loads((out / "bare_checks.json").read_text())["rows"]}


def test_bare_rows_on_cpu_report_the_defect_and_pass_the_fix(tmp_path):
    out = tmp_path / "out"
    proc = _bare(
        tmp_path,
        "--out",
        str(out),
        "--device",
        "cpu",
        "--tokens",
        "4",
        "1",
        "--only",
        "repro",
        "native_bitwise",
        "seed/full/beta0.5",
        "spot/topk",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["bare_checks.json", "bare_checks.md", "rows.jsonl"]
    rows = _rows(out)
    assert list(rows) == [
        "env",
        "defect/repro",
        "fix/repro",
        "native_bitwise/topk",
        "native_bitwise/full",
        "defect/seed/full/beta0.5",
        "fix/seed/full/beta0.5",
        "spot/topk",
    ]
    # the seed report's figures (its synthetic repro): upstream negative, the exact loss positive
    rep = rows["defect/repro"]
    assert rep["finding"] == "reproduced" and rep["upstream_loss"] < 0 < rep["reference_loss"]
    assert rows["fix/repro"]["ok"] and rows["fix/repro"]["loss"] > 0
    assert rows["defect/seed/full/beta0.5"]["finding"] == "reproduced"
    fix = rows["fix/seed/full/beta0.5"]
    assert fix["ok"] and fix["vocab"] == 248_320 and fix["grad_rel_l2"] <= fix["grad_tol"] < 1.01e-4
    assert rows["native_bitwise/full"]["loss_equal"] and rows["native_bitwise/full"]["grad_equal"]
    assert rows["spot/topk"]["ok"] and rows["spot/topk"]["max_tokens"] == 256
    assert rows["env"]["harness_from"] == str(REPO / "harness") and 0 < rows["env"]["carried_mib"] < 60
    assert f"carries {rows['env']['carried_mib']:.2f} MiB (limit 60 MiB)" in proc.stdout
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert [json.loads(x)["check"] for x in lines] == list(rows)
    md = (out / "bare_checks.md").read_text()
    assert "| defect/repro | reproduced |" in md and "6/6 checks ok; defect reproduced in 2/2 rows" in md


def _fp32():
    from gkd_harness.harness.losses import make_gkd_loss

    return make_gkd_loss("fp32")


def test_a_fixed_upstream_makes_the_defect_rows_not_reproduced(tmp_path):
    from gkd_harness.harness.losses import make_jsd_loss
    from gkd_harness.launch.gpu_bare import Upstream, run

    rows = run(
        tmp_path,
        "cpu",
        tokens=(4, 1),
        only=("repro", "seed/topk/beta0.5", "seed/full/beta1"),
        upstream=Upstream(gkd_loss=_fp32(), jsd_loss=make_jsd_loss("fp64")),
    )
    defects = {r["check"]: r["finding"] for r in rows if r["check"].startswith("defect/")}
    assert defects == {
        "defect/repro": "not reproduced",
        "defect/seed/topk/beta0.5": "not reproduced",
        "defect/seed/full/beta1": "not reproduced",
    }
    assert all(r["ok"] for r in rows if r["check"].startswith("fix/"))


def _grad_off(total_fn):
    """A loss with fp32's value and a gradient 1% too large."""

    def loss(*args, **kwargs):
        total, nv = total_fn(*args, **kwargs)
        return total.detach() + (total - total.detach()) * 1.01, nv

    return loss


@pytest.mark.parametrize("broken", ["negative", "gradient"])
def test_a_broken_fp32_makes_the_fix_rows_fail(tmp_path, broken):
    from swift.rlhf_trainers.gkd_loss import gkd_loss as upstream_gkd_loss

    from gkd_harness.launch.gpu_bare import run

    fix = upstream_gkd_loss if broken == "negative" else _grad_off(_fp32())
    rows = run(tmp_path, "cpu", tokens=(4, 1), only=("repro", "seed/topk/beta0.5", "seed/full/beta0.5"), fix=fix)
    fixes = {r["check"]: r for r in rows if r["check"].startswith("fix/")}
    assert set(fixes) == {"fix/repro", "fix/seed/topk/beta0.5", "fix/seed/full/beta0.5"}
    for r in fixes.values():
        assert not r["ok"], r
        if broken == "negative":
            assert "negative loss" in r["why"]
        else:
            assert "gradient rel L2" in r["why"] and 9e-3 < r["grad_rel_l2"] < 1.1e-2
            assert r["loss_abs_err"] <= r["loss_tol"]
    md = (tmp_path / "bare_checks.md").read_text()
    assert "| fix/repro | FAIL |" in md


def test_a_run_cut_short_leaves_its_rows(tmp_path):
    """The files are rewritten after every row: a run stopped in its third row group still has the first two."""
    from gkd_harness.launch.gpu_bare import run

    calls = []

    def fix(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt  # not an Exception: the run stops here, as a killed one would
        return _fp32()(*args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cpu", tokens=(4, 1), only=("repro", "native_bitwise/full", "seed/full/beta0.5"), fix=fix)
    saved = json.loads((tmp_path / "bare_checks.json").read_text())
    assert saved["done"] is False
    assert [r["check"] for r in saved["rows"]] == ["env", "defect/repro", "fix/repro", "native_bitwise/full"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 4
    assert "(still running, or cut short)" in (tmp_path / "bare_checks.md").read_text()


def test_loss_file_loads_without_ms_swift_package_init(tmp_path):
    """A bare image where ms-swift's __init__ cannot import (simulated: swift.utils blocked): the loss file and
    the spot check load (swift.utils stays blocked: the spot check needs no more of ms-swift), and the harness's
    native variant binds to the loaded file."""
    code = (
        "import sys; sys.modules['swift.utils'] = None\n"
        "from gkd_harness.launch.gpu_bare import load_upstream_loss\n"
        "mod, how = load_upstream_loss(); print(how)\n"
        "from gkd_harness.harness.losses import make_gkd_loss\n"
        "assert make_gkd_loss('native') is mod.gkd_loss\n"
        "from gkd_harness.harness.rank.spot_check import spot_check\n"
        "assert sys.modules['swift.utils'] is None\n"
    )
    proc = _bare(tmp_path, code=code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("loss file only (") and "gkd_loss.py" in proc.stdout
