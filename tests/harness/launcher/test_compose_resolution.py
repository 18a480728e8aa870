"""Every value of the command line composed and resolved before anything reads it (issue 48, item 1).

Before, each of these ended in a traceback (exit 1) from ``gkd-train run.dry_run=true``: an unset
``${oc.env:...}`` under any key (Hydra met it first in ``hydra.run.dir``, which holds the overrides' text: a
172-line traceback), ``${hydra:runtime.cwd}`` in a value or a new key (HydraConfig not set outside the job),
``run.name=${run.name}``, ``run=${gkd.beta}`` (an AttributeError), ``model.embedded.tokenizer=-1`` (a ValueError
from the fixtures) and a 5,000-character ``run.dataset`` ("File name too long"). Now each is one line naming the
key, exit 2. The seeded fuzz (``fuzz_overrides``) of 320 overrides had 88 outcomes that were neither a clean
refusal nor an accepted plan; now none.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import entry_point
from tests.harness.launcher import fuzz_overrides

UNSET = "${oc.env:" + fuzz_overrides.UNSET_ENV + "}"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv(fuzz_overrides.UNSET_ENV, raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "override,key,says",
    [
        (f"gkd.beta={UNSET}", "gkd.beta", "not found"),
        (f"model.embedded.seed={UNSET}", "model.embedded.seed", "not found"),
        (f"tracking.wandb.tags=[a,{UNSET}]", "tracking.wandb.tags[1]", "not found"),
        (f"+fuzz={UNSET}", "fuzz", ""),
        ("run.name=${hydra:runtime.cwd}", "run.name", "path separator"),  # resolved as in the job, then refused
        ("+fuzz=${hydra:runtime.cwd}", "fuzz", "unknown key"),
        ("run.name=${run.name}", "run.name", "Recursive interpolation"),
        ("gkd.beta=${nope.nothing}", "gkd.beta", "nope.nothing"),
        ("run=${gkd.beta}", "run", "must be a mapping"),
        ("model.embedded.tokenizer=-1", "model.embedded.tokenizer", "must be one of"),
        ("run.dataset=" + "a" * 5000, "run.dataset", "not a usable path"),
        ("monitor=" + "a" * 5000, "monitor", "not a usable preset name"),
        ("loss=null", "loss", "group override"),
        ("backend=-inf", "backend", "group override"),
    ],
)
def test_each_case_is_one_line_naming_the_key(in_tmp, override, key, says):
    outcome = fuzz_overrides.outcome(override)
    assert outcome.kind == "refused", outcome
    import contextlib
    import io

    from gkd_harness.harness.launcher.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        main(["run.dry_run=true", override])
    line = err.getvalue().strip()
    assert e.value.code == 2 and "\n" not in line and len(line) < 600, line
    assert line.startswith(f"gkd-train: invalid config: {key}: ") and says in line, line


def test_a_hydra_value_resolves_as_in_the_job(in_tmp, capsys):
    """``${hydra:runtime.cwd}`` and ``${hydra:job.name}`` in a value resolve in the dry run as in the job."""
    from gkd_harness.harness.launcher.compose import point_config

    (in_tmp / "d.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
    )
    cfg, _ = point_config(["run.dataset=${hydra:runtime.cwd}/d.jsonl", "run.name=${hydra:job.name}"])
    assert cfg.run.dataset == f"{in_tmp}/d.jsonl" and cfg.run.name == "gkd-train"


def test_the_job_path_names_the_key_too(tmp_path):
    """Without the dry run, Hydra resolves ``hydra.run.dir`` (which holds the overrides' text) before the job:
    the refusal names the user's key, not ``hydra.run.dir`` (before: ``hydra.run.dir: KeyError raised ...``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.pop(fuzz_overrides.UNSET_ENV, None)
    for override, key in ((f"gkd.beta={UNSET}", "gkd.beta"), ("run.name=${run.name}", "run.name")):
        p = subprocess.run(
            [entry_point("gkd-train"), override], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 2 and p.stderr.startswith(f"gkd-train: invalid config: {key}: "), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


FAST_SAMPLE = 40


def _fuzz(n: int, tmp_path, monkeypatch) -> list:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GKD_OUTPUT_ROOT", str(tmp_path / "outputs"))
    results = fuzz_overrides.run(fuzz_overrides.overrides(n, seed=48))
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "a dry run wrote a file"
    return results


def test_fuzz_sample_has_no_other_outcome(tmp_path, monkeypatch):
    """The first 40 of the seeded fuzz (the whole 320 is the slow test below; each compose costs Hydra ~0.15 s)."""
    results = _fuzz(FAST_SAMPLE, tmp_path, monkeypatch)
    other = [r for r in results if r.kind == "other"]
    assert not other, other
    assert fuzz_overrides.counts(results)["accepted"] >= 1  # the fuzz reaches the plan too, not only refusals


@pytest.mark.slow
def test_fuzz_of_320_overrides_has_no_other_outcome(tmp_path, monkeypatch):
    """Before the fix: refused 199 / accepted 33 / other 88; after: 287 / 33 / 0."""
    results = _fuzz(320, tmp_path, monkeypatch)
    other = [r for r in results if r.kind == "other"]
    assert not other, other
    counts = fuzz_overrides.counts(results)
    assert counts["refused"] + counts["accepted"] == 320 and counts["accepted"] >= 20, counts
