"""Group, run and tag names are folder and wandb names (issue 24, item 4): before the fix
``tracking.wandb.group=../../../x`` wrote the run outside the output root, an empty group or ``.`` made
``outputs/runs`` itself the run folder, and a newline was accepted."""
from __future__ import annotations

import pytest

from harness.config.name_rules import UNSAFE_NAME_STANDIN, folder_name
from harness.config.schema import ConfigError
from harness.config.validate import validate_config
from harness.launcher.compose import point_config
from tests.harness.config.test_validate import base_cfg


@pytest.mark.parametrize("override,key", [
    ("tracking.wandb.group=../../../x", "tracking.wandb.group"), ("tracking.wandb.group=''", "tracking.wandb.group"),
    ("tracking.wandb.group=.", "tracking.wandb.group"), ("tracking.wandb.group=a/b", "tracking.wandb.group"),
    ("tracking.wandb.group='a\nb'", "tracking.wandb.group"), ("run.name=x/../y", "run.name"),
    ("tracking.wandb.tags=[ok,'a\tb']", "tracking.wandb.tags[1]"),
])
def test_unsafe_names_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        validate_config(base_cfg(override))
    assert str(err.value).startswith(f"{key}: ")


def test_an_unsafe_group_never_makes_a_folder_outside_the_output_root(tmp_path, monkeypatch):
    """Hydra's run folder is made before validation: the group is swapped for a stand-in in hydra.run.dir."""
    monkeypatch.setenv("GKD_OUTPUT_ROOT", str(tmp_path / "out"))
    for group in ("../../../x", "", ".", "a/b"):
        _, run_dir = point_config([f"tracking.wandb.group='{group}'"])
        assert run_dir.resolve().is_relative_to((tmp_path / "out").resolve())
        assert UNSAFE_NAME_STANDIN in run_dir.parts
    assert folder_name("beta_sweep") == "beta_sweep"


def test_safe_names_pass():
    validate_config(base_cfg("tracking.wandb.group=my-sweep_2", "run.name=beta.0.5", "tracking.wandb.tags=[a,b-c]"))
