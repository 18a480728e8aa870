"""Local datasets checked at validation, before any model loads (issue 24, item 5): before the fix an empty jsonl
failed 72 s later with ``StopIteration``, a malformed line 55 s later with the row only in swift.log, and rows
without an assistant turn trained to "completed" with loss 0.0."""
from __future__ import annotations

import json

import pytest

from harness.config.schema import ConfigError
from harness.config.validate import validate_config
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
    msg = _error(tmp_path, json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n{\"messages\": [\n")
    assert "train.jsonl line 3 is not valid JSON" in msg and len(msg.splitlines()) == 1


def test_a_row_without_an_assistant_turn_is_refused_unless_on_policy(tmp_path):
    text = json.dumps(GOOD) + "\n" + json.dumps(PROMPT_ONLY) + "\n"
    assert "line 2 has no assistant turn" in _error(tmp_path, text)
    from harness.config.dataset_rules import check_dataset  # on-policy: the student writes every response
    check_dataset("run.dataset", str(tmp_path / "train.jsonl"), on_policy=True)


def test_other_formats_with_a_response_pass(tmp_path):
    rows = [GOOD, {"query": "q", "response": "r"}, {"conversations": [{"from": "human", "value": "q"},
                                                                     {"from": "gpt", "value": "a"}]}]
    _validate(tmp_path, "".join(json.dumps(r) + "\n" for r in rows))
