"""Local datasets checked at validation, before any model loads (issue 24, item 5): before the fix an empty jsonl
failed 72 s later with ``StopIteration``, a malformed line 55 s later with the row only in swift.log, and rows
without an assistant turn trained to "completed" with loss 0.0."""

from __future__ import annotations

import json

import pytest

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.validate import validate_config
from tests.harness.config.test_validate import base_cfg, model_dir

GOOD = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
PROMPT_ONLY = {"messages": [{"role": "user", "content": "2+2?"}]}


def _validate(tmp_path, text: str, *overrides):
    data = tmp_path / "train.jsonl"
    data.write_text(text)
    models = [f"model.student={model_dir(tmp_path, 's', 400)}", f"model.teacher={model_dir(tmp_path, 't', 400)}"]
    validate_config(base_cfg(*models, f"run.dataset={data}", *overrides))
    return data


def _error(tmp_path, text: str, *overrides) -> str:
    with pytest.raises(ConfigError) as err:
        _validate(tmp_path, text, *overrides)
    return str(err.value)


def test_an_empty_file_is_named(tmp_path):
    msg = _error(tmp_path, "\n")
    assert msg.startswith("run.dataset: ") and "train.jsonl is empty" in msg


def test_a_malformed_line_is_named_by_number(tmp_path):
    msg = _error(tmp_path, json.dumps(GOOD) + "\n" + json.dumps(GOOD) + '\n{"messages": [\n')
    assert "train.jsonl line 3 is not valid JSON" in msg and len(msg.splitlines()) == 1


def test_a_row_without_an_assistant_turn_is_refused_unless_on_policy(tmp_path):
    text = json.dumps(GOOD) + "\n" + json.dumps(PROMPT_ONLY) + "\n"
    assert "line 2 has no assistant turn" in _error(tmp_path, text)
    from gkd_harness.harness.config.dataset_rules import check_dataset  # on-policy: the student writes every response

    check_dataset("run.dataset", str(tmp_path / "train.jsonl"), on_policy=True)


def test_other_formats_with_a_response_pass(tmp_path):
    rows = [
        GOOD,
        {"query": "q", "response": "r"},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
    ]
    _validate(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))


# --- hub dataset ids, where the cache allows (issue 24) ------------------------------------------------------
def _hub_cache(tmp_path, monkeypatch, *cached: str):
    """Private hub and datasets caches holding ``cached`` dataset repos in huggingface_hub's own layout (blobs,
    refs/main, snapshots/<commit>/ links), checked with the library's own ``scan_cache_dir``."""
    from huggingface_hub import scan_cache_dir

    hub = tmp_path / "hf" / "hub"
    for repo_id in cached:
        repo = hub / f"datasets--{repo_id.replace('/', '--')}"
        (repo / "blobs").mkdir(parents=True)
        (repo / "blobs" / "0f1e2d").write_text(json.dumps(GOOD) + "\n")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("a" * 40)
        snap = repo / "snapshots" / ("a" * 40)
        snap.mkdir(parents=True)
        (snap / "train.jsonl").symlink_to("../../blobs/0f1e2d")
    hub.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    assert sorted((r.repo_type, r.repo_id) for r in scan_cache_dir(hub).repos) == [("dataset", r) for r in cached]


def _hub_cfg(tmp_path, *overrides):
    if not (tmp_path / "s").exists():
        model_dir(tmp_path, "s", 400), model_dir(tmp_path, "t", 400)
    return base_cfg(f"model.student={tmp_path / 's'}", f"model.teacher={tmp_path / 't'}", *overrides)


def test_an_uncached_hub_dataset_is_refused_when_offline(tmp_path, monkeypatch):
    """Before: validated, and ms-swift failed after the models had loaded."""
    _hub_cache(tmp_path, monkeypatch, "example-org/cached")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for key in ("run.dataset", "monitor.eval.dataset"):
        with pytest.raises(
            ConfigError,
            match=rf"^{key}: 'HF::example-org/missing:default#200' is not a local file "
            "and hub dataset example-org/missing is not in the Hugging Face cache",
        ):
            validate_config(
                _hub_cfg(tmp_path, "run.dataset=example-org/cached", f"{key}='HF::example-org/missing:default#200'")
            )
    validate_config(
        _hub_cfg(tmp_path, "run.dataset='example-org/cached#200'", "monitor.eval.dataset=example-org/cached")
    )
    validate_config(_hub_cfg(tmp_path, "run.dataset=example-org/missing", "run.dry_run=true"))  # plans for other nodes
    monkeypatch.delenv("HF_HUB_OFFLINE")
    validate_config(_hub_cfg(tmp_path, "run.dataset=example-org/missing"))  # online: ms-swift downloads it


def test_the_embedded_models_runs_are_offline_so_their_hub_dataset_must_be_cached(tmp_path, monkeypatch):
    """The embedded models' runs are launched with HF_HUB_OFFLINE=1, whatever this shell says."""
    _hub_cache(tmp_path, monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(ConfigError, match=r"^run\.dataset: 'example-org/missing' is not a local file"):
        validate_config(base_cfg("run.dataset=example-org/missing"))
    (tmp_path / "hf" / "datasets" / "example-org___missing").mkdir(parents=True)  # prepared by `datasets`
    validate_config(base_cfg("run.dataset=example-org/missing"))


def test_gkd_train_refuses_an_uncached_hub_dataset_in_one_line(tmp_path):
    import os
    import subprocess

    from tests.conftest import entry_point

    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "GKD_OUTPUT_ROOT": str(tmp_path / "out"),
    }
    proc = subprocess.run(
        [entry_point("gkd-train"), "run.dataset=example-org/missing"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gkd-train: invalid config: run.dataset: 'example-org/missing'")
    assert not list((tmp_path / "out").rglob("*"))  # no run folder
