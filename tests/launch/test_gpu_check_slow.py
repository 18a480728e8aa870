"""launch/gpu_check.sh's preflight reports a slow import as slow, not as failed (issue 33: ``import mcore_bridge``
took 180 s on a loaded machine and the dry run said "import mcore_bridge fails", so its checks were skipped)."""

from __future__ import annotations

from gkd_harness.launch.gpu_check import main, preflight_row, table


def _slow_module(tmp_path, monkeypatch, seconds: float = 30.0) -> None:
    (tmp_path / "gkd_slow_mod").mkdir()
    (tmp_path / "gkd_slow_mod" / "__init__.py").write_text(f"import time\ntime.sleep({seconds})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_an_import_past_the_timeout_is_slow_not_failed(tmp_path, monkeypatch):
    _slow_module(tmp_path, monkeypatch)
    row = preflight_row("slow", "gkd_slow_mod", "gkd-slow-mod", "-", timeout=1.0)
    assert row == {
        "check": "preflight/slow",
        "rc": 0,
        "slow": True,
        "detail": "slow: `import gkd_slow_mod` (gkd-slow-mod, version unknown) did not finish in 1 s "
        "(a loaded machine or a cold disk cache?); not a failure: the checks that need it "
        "still run, each under its own timeout",
    }
    text, ok = table([row])
    assert ok and "preflight/slow  SLOW" in text


def test_the_preflight_prints_slow_and_leaves_it_out_of_the_failed_list(tmp_path, monkeypatch, capsys):
    import gkd_harness.launch.gpu_check as gpu_check

    _slow_module(tmp_path, monkeypatch)
    monkeypatch.setattr(gpu_check, "PREFLIGHT", (("slow", "gkd_slow_mod", "gkd-slow-mod", "-"),))
    monkeypatch.setattr(gpu_check, "PREFLIGHT_TIMEOUT_S", 1.0)
    assert main(["preflight", "--out", str(tmp_path / "checks.jsonl")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["preflight/slow", "SLOW", "slow:"], out
    assert out[-1] == "PREFLIGHT_FAILED="
