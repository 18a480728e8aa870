"""gkd_harness.harness.config.flat: the one flattener of config trees."""

from __future__ import annotations

import dataclasses

from gkd_harness.harness.config.flat import flatten


# ------------------------------------------------------------------------------------------------ config trees
def test_flatten_keeps_lists_and_empty_mappings_and_reads_dataclasses():
    @dataclasses.dataclass
    class Loss:
        precision: str = "fp32"
        extra: dict = dataclasses.field(default_factory=dict)

    @dataclasses.dataclass
    class Cfg:
        loss: Loss = dataclasses.field(default_factory=Loss)
        tags: list = dataclasses.field(default_factory=lambda: ["a"])

    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}) == {
        "a.b": 1,
        "a.c.d": [1, 2],
        "e": {},
        "f": None,
    }
    assert flatten(Cfg()) == {"loss.precision": "fp32", "loss.extra": {}, "tags": ["a"]}
    assert flatten({}) == {}
