"""``loss.source`` and ``loss.name`` are the candidate's keys (issue 29, reproduction 4).

The README's certify recipe sweeps ``loss=original,candidate loss.source=F loss.name=my-pr``: Hydra applies the two
keys to every point. Before the fix the original point inherited them: its folder was renamed
(``loss.name=my-pr,loss=original``), so upstream trained again beside its completed run, and its config recorded
the candidate's source. Now a non-candidate loss carries neither key (``gkd_harness.harness.config.schema.LossConfig``), and
neither names a folder (``configs/hydra/default.yaml``): the original point is the same point as in any other
sweep of the group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gkd_harness.harness.config.flat import flatten
from gkd_harness.harness.config.schema import LossConfig, from_dict, to_dict
from gkd_harness.harness.launcher.compose import point_config

REPO = Path(__file__).resolve().parents[3]
CANDIDATE = str(REPO / "examples" / "candidates" / "good_promote_first.py")
RECIPE = ["experiment=smoke", f"loss.source={CANDIDATE}", "loss.name=my-pr"]


@pytest.mark.parametrize("loss", ["original", "fp32", "continuous", "fp64"])
def test_a_non_candidate_point_of_the_recipe_carries_no_candidate_key(loss):
    cfg, run_dir = point_config([f"loss={loss}", *RECIPE], multirun=True)
    assert (cfg.loss.source, cfg.loss.name) == (None, None)
    plain, plain_dir = point_config([f"loss={loss}", "experiment=smoke"], multirun=True)
    assert flatten(to_dict(cfg)) == flatten(to_dict(plain))  # the same config as the point without the recipe ...
    assert run_dir == plain_dir and run_dir.name == f"loss={loss}"  # ... in the same folder


def test_the_candidate_point_keeps_its_source_and_name_and_a_folder_without_them():
    cfg, run_dir = point_config(["loss=candidate", *RECIPE], multirun=True)
    assert (cfg.loss.precision, cfg.loss.source, cfg.loss.name) == ("candidate", CANDIDATE, "my-pr")
    assert run_dir.name == "loss=candidate"  # a path would nest folders; the name is a label, like the group


def test_a_stored_config_rebuilds_without_candidate_keys_on_a_non_candidate_loss():
    """The rule lives in the typed schema, so every way a config is built (Hydra, a stored summary) obeys it."""
    cfg = point_config(["loss=original", *RECIPE])[0]
    data = to_dict(cfg)
    data["loss"].update(source="x.py", name="x")
    assert from_dict(data).loss == LossConfig(precision="native", beta_form="paper", source=None, name=None)
    data["loss"].update(precision="candidate")
    assert (from_dict(data).loss.source, from_dict(data).loss.name) == ("x.py", "x")
