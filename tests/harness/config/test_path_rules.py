"""``run.output_dir`` and local datasets (issue 48, items 2 and 3), in the dry run too.

Before: ``run.output_dir`` pointing at a user's non-empty folder got 15 run files beside the user's, exit 0; the
dry run accepted ``/etc``, ``/`` and ``../../..``; ``run.dataset=/dev/zero`` passed validation and failed inside
ms-swift (exit 1). Now each is one line naming the key, exit 2, before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess

import pytest

from tests.conftest import entry_point

ROW = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def _dry(*overrides) -> tuple:
    from gkd_harness.harness.launcher.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["run.dry_run=true", *overrides])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue().strip()


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    (tmp_path / "here" / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "here" / "a" / "b")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    return tmp_path


@pytest.mark.parametrize("target", ["/etc", "/", "/usr/lib", "/proc/self"])
def test_a_system_folder_is_refused(cwd, target):
    code, _, err = _dry(f"run.output_dir={target}")
    assert code == 2 and err.startswith("gkd-train: invalid config: run.output_dir: ") and "system folder" in err, err


def test_the_root_by_dotdot_is_refused(cwd):
    depth = len(cwd.parts) + 3
    code, _, err = _dry("run.output_dir=" + "/".join([".."] * depth))
    assert code == 2 and "run.output_dir: / is a system folder" in err, err


def test_a_users_folder_is_refused_and_left_alone(cwd):
    mine = cwd / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    code, _, err = _dry(f"run.output_dir={mine}")
    assert code == 2 and "holds files the harness did not write" in err, err
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]


def test_a_real_run_into_a_users_folder_writes_nothing(cwd):
    mine = cwd / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("HYDRA_FULL_ERROR", None)
    p = subprocess.run(
        [entry_point("gkd-train"), f"run.output_dir={mine}", "run.max_steps=1"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and "run.output_dir:" in p.stderr, p.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    "layout",
    [
        {},  # empty
        {"summary.json": "{}"},  # a run folder
        {".lock": ""},  # a run that got no further than its lock
        {"swift.node1.log": ""},  # node 1 of a two-node run started first (tests/launch/test_two_nodes.py)
        {"gkd.beta=0.5/summary.json": "{}", "gkd.beta=0.9/.hydra/x": ""},  # a group's folder of run folders
    ],
)
def test_an_empty_or_harness_folder_is_accepted(cwd, layout):
    folder = cwd / "out"
    folder.mkdir()
    for name, text in layout.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    code, out, err = _dry(f"run.output_dir={folder}")
    assert code in (0, None) and "# gkd-train dry run" in out, err


def test_a_device_is_no_dataset(cwd):
    code, _, err = _dry("run.dataset=/dev/zero")
    assert code == 2 and err.startswith("gkd-train: invalid config: run.dataset: /dev/zero is a character device"), err


def test_a_fifo_is_no_dataset(cwd):
    fifo = cwd / "rows.jsonl"
    os.mkfifo(fifo)
    code, _, err = _dry(f"run.dataset={fifo}", "model=tiny")
    assert code == 2 and "is a FIFO" in err, err
    code, _, err = _dry(f"monitor.eval.dataset={fifo}")
    assert code == 2 and err.startswith("gkd-train: invalid config: monitor.eval.dataset: "), err


def test_a_regular_file_is_a_dataset(cwd):
    data = cwd / "rows.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    code, out, err = _dry(f"run.dataset='{data}#1'")
    assert code in (0, None) and "# gkd-train dry run" in out, err


def test_a_path_too_long_names_its_key(cwd):
    code, _, err = _dry("model.student=/" + "a" * 300)
    assert code == 2 and err.startswith("gkd-train: invalid config: model.student: is not a usable path"), err
