"""The cold-cache ``run.extra_args`` check is never silent (issue 33): building ms-swift's flag table prints one
line when it starts, progress while ms-swift imports, one line when done; a second process waits on the build's
lock naming its owner. The real build (importing ms-swift, 20 s to minutes) is replaced by a stand-in process
that writes a table; everything around it is the harness's own code."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from gkd_harness.harness.config.swift_flags import TABLE_FORMAT, backend_name, load_table, table_path
from gkd_harness.harness.fixtures import building
from gkd_harness.harness.fixtures.building import exclusive
from gkd_harness.harness.launcher import extra_args

ROW = {
    "flags": ["--lora_rank"],
    "dest": "lora_rank",
    "action": "store",
    "nargs": None,
    "type": "int",
    "const": None,
    "choices": None,
}


def _stand_in(path, sleep_s: float):
    """A process like ``python -m gkd_harness.harness.launcher.extra_args``: sleeps (the import), writes a one-flag table."""
    body = json.dumps({"format": TABLE_FORMAT, "backend": backend_name(False), "actions": [ROW]})
    code = f"import time, pathlib; time.sleep({sleep_s}); pathlib.Path({str(path)!r}).write_text({body!r})"
    return [sys.executable, "-c", code]


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GKD_HARNESS_CACHE", str(tmp_path))
    assert load_table(False) is None
    return table_path(False)


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("gkd-harness: ")]


def test_a_cold_cache_build_says_when_it_starts_how_it_goes_and_when_it_is_done(cold_cache, capfd, monkeypatch):
    """Before: ``log.info`` only, which gkd-train's console does not show: 130 s of silence."""
    monkeypatch.setattr(building, "PROGRESS_EVERY_S", 0.3)
    monkeypatch.setattr(extra_args, "_table_command", lambda megatron: _stand_in(cold_cache, 1.0))
    table = extra_args.flag_table(False)
    assert table == [ROW]
    lines = _lines(capfd.readouterr().err)
    assert lines[0] == (
        f"gkd-harness: building the table of ms-swift's flags once, for run.extra_args "
        f"({cold_cache.name}: imports ms-swift)"
    ), lines
    assert any(ln.startswith("gkd-harness: still importing ms-swift's argument classes (") for ln in lines[1:-1])
    assert lines[-1].startswith("gkd-harness: built the table of ms-swift's flags in "), lines
    assert extra_args.flag_table(False) == [ROW] and _lines(capfd.readouterr().err) == []  # cached: silent


def test_a_second_process_waits_naming_the_owner_and_uses_its_table(cold_cache, capfd, monkeypatch):
    """The owner holds the lock while it builds; the waiter names it once, then finds the table built (it
    starts no build of its own)."""
    monkeypatch.setattr(building, "PROGRESS_EVERY_S", 0.3)
    monkeypatch.setattr(extra_args, "_table_command", lambda megatron: pytest.fail("the waiter built the table"))
    lock = cold_cache.with_name(f".{cold_cache.name}.lock")
    taken, release = threading.Event(), threading.Event()

    def owner():  # another process in real life; a thread holds an flock of its own open file just the same
        with exclusive(lock, "building the table of ms-swift's flags once") as build:
            build.progress("still importing ms-swift's argument classes (40 s)")
            taken.set()
            release.wait(10)
            cold_cache.write_text(
                json.dumps({"format": TABLE_FORMAT, "backend": backend_name(False), "actions": [ROW]})
            )

    t = threading.Thread(target=owner)
    t.start()
    assert taken.wait(10)
    threading.Timer(1.0, release.set).start()
    try:
        assert extra_args.flag_table(False) == [ROW]
    finally:
        release.set()
        t.join(10)
    lines = _lines(capfd.readouterr().err)
    waiting = [ln for ln in lines if ln.startswith("gkd-harness: waiting for pid ")]
    assert len(waiting) == 1 and "building the table of ms-swift's flags once (lock: " in waiting[0], lines
    assert not any("building the table of ms-swift's flags once, for" in ln for ln in lines)  # no second build
