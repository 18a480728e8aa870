"""The typed records of the run folder and the sweep folder (gkd_harness.harness.store.records): every file written
through its record and read back, and a layer test: no module outside the store layer opens one of those files by
name."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import gkd_harness
from gkd_harness.harness import contract
from gkd_harness.harness.store import records as rec
from gkd_harness.harness.store.run_folder import RunFolder

ROOT = Path(gkd_harness.__file__).parent


def test_every_run_folder_file_round_trips_through_its_record(tmp_path):
    run = tmp_path / "sweep" / "p1"
    folder = RunFolder(run).create()
    summary = folder.start_summary("p1", "g", {"loss.precision": "fp32", "run.dataset": None})
    assert rec.read_summary(run) == summary and summary["status"] == "running"
    rec.write_summary(run, dict(summary, status="completed", last_step=3))
    assert rec.read_summary(run)["status"] == "completed" and rec.read_summary(run)["last_step"] == 3

    cmd = rec.Command(("swift", "rlhf", "--rlhf_type", "gkd"), {"WANDB_RUN_ID": "abc123", "WANDB_MODE": "offline"})
    folder.write_command(cmd)
    assert rec.read_command(run) == cmd and rec.wandb_run_id(run) == "abc123"
    assert (run / contract.COMMAND_FILE).is_file()

    rec.write_config(run, "loss:\n  precision: fp32\ngkd:\n  beta: 0.5\n")
    assert rec.read_config(run) == {"loss": {"precision": "fp32"}, "gkd": {"beta": 0.5}}

    rows = [
        {"step": 1, contract.TRAIN_LOSS: 0.5, contract.TRAIN_GRAD_NORM: float("nan")},
        {"step": 2, contract.TRAIN_LOSS: float("inf")},
        {"step": 2, contract.EVAL_JSD: 0.25, contract.EVAL_TOP1_AGREEMENT: 0.9},
    ]
    rec.write_metrics_rows(run, rows)
    back = rec.read_metrics_rows(run)
    assert [r["step"] for r in back] == [1, 2, 2] and back[0][contract.TRAIN_LOSS] == 0.5
    assert math.isnan(back[0][contract.TRAIN_GRAD_NORM]) and back[1][contract.TRAIN_LOSS] == math.inf
    assert rec.read_evaluation_rows(run) == [rows[2]]
    appender = rec.metrics_appender(run)
    appender.write({"step": 3, contract.TRAIN_LOSS: 0.4})
    appender.close()
    assert [r["step"] for r in rec.read_metrics_rows(run)] == [1, 2, 2, 3]

    captures = run / contract.CAPTURES_DIR
    captures.mkdir()
    for step, rank in ((10, 1), (5, 0), (10, 0)):
        rec.capture_path(captures, step, rank).write_bytes(b"")
    (captures / "notes.txt").write_text("not a capture")
    assert [(c.step, c.rank, c.path.name) for c in rec.read_captures(run)] == [
        (5, 0, "step5_rank0.safetensors"),
        (10, 0, "step10_rank0.safetensors"),
        (10, 1, "step10_rank1.safetensors"),
    ]

    manifest = rec.Manifest(
        ("p1", "p2"),
        {"p1": {"run.seed": 1, "overrides": ["run.seed=1"]}},
        ({"id": 1, "points": ["p1", "p2"]},),
        {"patched_not_worse": {"margin": 0.01}},
        "g",
    )
    rec.write_manifest(tmp_path / "sweep", manifest)
    assert rec.read_manifest(tmp_path / "sweep") == manifest


def test_a_read_returns_none_for_an_absent_file_and_names_a_broken_one(tmp_path):
    for read in (rec.read_summary, rec.read_command, rec.read_config, rec.read_manifest):
        assert read(tmp_path) is None
    assert rec.read_metrics_rows(tmp_path) == [] and rec.read_captures(tmp_path) == []
    (tmp_path / contract.SUMMARY_FILE).write_text("{not json")
    with pytest.raises(rec.RecordError, match=r"summary\.json: not valid JSON"):
        rec.read_summary(tmp_path)
    (tmp_path / contract.SUMMARY_FILE).write_text(json.dumps({"status": "done"}))
    with pytest.raises(rec.RecordError, match=r"summary\.json: 'status' must be running\|completed"):
        rec.read_summary(tmp_path)
    (tmp_path / contract.SWEEP_MANIFEST_FILE).write_text(json.dumps({"points": "p1"}))
    with pytest.raises(rec.RecordError, match=r"sweep_manifest\.json: 'points' must be a list"):
        rec.read_manifest(tmp_path)
    assert rec.read_quietly(rec.read_manifest, tmp_path) is None


def test_a_first_layout_manifest_reads_as_one_launch(tmp_path):
    (tmp_path / contract.SWEEP_MANIFEST_FILE).write_text(json.dumps({"points": ["a", "b"], "written_at": "t"}))
    m = rec.read_manifest(tmp_path)
    assert m.points == ("a", "b") and [x["id"] for x in m.launches] == [1] and m.launches[0]["points"] == ["a", "b"]


# ---------------------------------------------------------------------------------------------------------------
# the layer: only the store layer opens a record file by name
# ---------------------------------------------------------------------------------------------------------------
#: The contract's names of the record files, as constants and as literals.
_NAMES = {
    n for n in dir(contract) if isinstance(getattr(contract, n), str) and getattr(contract, n) in contract.RECORD_FILES
}
_LITERALS = set(contract.RECORD_FILES)


def _names_a_record(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in _NAMES
    return isinstance(node, ast.Constant) and node.value in _LITERALS


def record_file_opens(source: str) -> list:
    """``(line, what)`` for each place ``source`` makes a record file's path or opens it by name: ``folder /
    SUMMARY_FILE``, ``open(... "metrics.jsonl")``, ``Path(...).rglob(SUMMARY_FILE)``, ``os.path.join(d, NAME)``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _names_a_record(node.right):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and _opener(node.func) and any(_names_a_record(a) for a in node.args):
            out.append((node.lineno, ast.unparse(node)))
    return sorted(out)


#: Calls that make a path from, or open, a file name they are given.
_OPENERS = {"open", "Path", "join", "joinpath", "glob", "rglob", "with_name"}


def _opener(func: ast.AST) -> bool:
    return (isinstance(func, ast.Name) and func.id in _OPENERS) or (
        isinstance(func, ast.Attribute) and func.attr in _OPENERS
    )


def test_the_layer_test_sees_each_way_of_opening_a_record_file():
    code = (
        "from gkd_harness.harness.contract import SUMMARY_FILE, METRICS_FILE\n"
        "a = folder / SUMMARY_FILE\n"
        "b = open(os.path.join(d, 'command.json'))\n"
        "c = list(root.rglob(contract.METRICS_FILE))\n"
        "d = folder / 'sweep_manifest.json'\n"
        "e = f'{SUMMARY_FILE} is missing'\n"  # a message naming the file opens nothing
        "f = label(SUMMARY_FILE)\n"  # nor a label
    )
    assert [line for line, _ in record_file_opens(code)] == [2, 3, 4, 5]


def test_only_the_store_layer_opens_a_record_file_by_name():
    store = ROOT / "harness" / "store"
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if store in path.parents or path == ROOT / "harness" / "contract.py":
            continue
        for line, what in record_file_opens(path.read_text()):
            found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not found, "read or write these through gkd_harness.harness.store.records:\n" + "\n".join(found)
