"""Group, run and tag names are folder and wandb names (issue 24, item 4): before the fix
``tracking.wandb.group=../../../x`` wrote the run outside the output root, an empty group or ``.`` made
``outputs/runs`` itself the run folder, and a newline was accepted."""

from __future__ import annotations

import pytest

from gkd_harness.harness.config.name_rules import UNSAFE_NAME_STANDIN, folder_name
from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.config.validate import validate_config
from gkd_harness.harness.launcher.compose import point_config
from tests.harness.config.test_validate import base_cfg


@pytest.mark.parametrize(
    "override,key",
    [
        ("tracking.wandb.group=../../../x", "tracking.wandb.group"),
        ("tracking.wandb.group=''", "tracking.wandb.group"),
        ("tracking.wandb.group=.", "tracking.wandb.group"),
        ("tracking.wandb.group=a/b", "tracking.wandb.group"),
        ("tracking.wandb.group='a\nb'", "tracking.wandb.group"),
        ("run.name=x/../y", "run.name"),
        ("tracking.wandb.tags=[ok,'a\tb']", "tracking.wandb.tags[1]"),
    ],
)
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


# ------------------------------------------------------------------------------------------------ issue 32, item 1
# Hydra's override_dirname (key=value,...) names every run folder: `gkd-train -m loss.name=../../../../ESC` put the
# run outside the output root, and `model.template=...` did the same; only the group and run.name were checked.
import copy  # noqa: E402
import dataclasses  # noqa: E402
import typing  # noqa: E402
from pathlib import Path  # noqa: E402

from gkd_harness.harness.config.name_rules import NOT_NAME_KEYS, OWNED_TAG_PREFIXES, OWNED_TAGS, run_folder_name  # noqa: E402

#: one composed config per schema variant, so that every string key of every variant is walked
VARIANTS = (
    (),
    ("backend=megatron", "model.student_dtype=null", "model.teacher_dtype=null"),
    ("rollout=hf", "gkd.lmbda=0.5"),
    ("rollout=vllm_colocate", "gkd.lmbda=0.5"),
    ("rollout=vllm_server", "gkd.lmbda=0.5", "rollout.vllm.server.host=127.0.0.1"),
)
REPO = Path(__file__).resolve().parents[3]


def _string_keys(node, prefix=""):
    """(dotted key, kind) of every field of ``node``'s dataclass tree typed str, Optional[str], List[str] or Any."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, tp = getattr(node, f.name), hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _string_keys(value, key + ".")
            continue
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if tp is str or tp is typing.Any or str in args or typing.Any in args:
            yield key, "str"
        elif typing.get_origin(tp) is list and typing.get_args(tp) == (str,):
            yield key, "list"


def _set(cfg, key, value):
    *parents, last = key.split(".")
    node = cfg
    for p in parents:
        node = getattr(node, p)
    setattr(node, last, value)


def _walked():
    """{key: (the first variant's config that has it, kind)}"""
    seen = {}
    for variant in VARIANTS:
        cfg = base_cfg(*variant)
        validate_config(cfg)  # each variant is valid as composed
        for key, kind in _string_keys(cfg):
            seen.setdefault(key, (cfg, kind))
    return seen


def test_every_string_key_that_reaches_a_folder_name_refuses_a_parent_path():
    """The hidden-key walk: for every string key of the schema (every variant) outside NOT_NAME_KEYS, a `../`
    value is refused in one line naming that key. Before the fix loss.name, model.template, ... passed."""
    walked = _walked()
    assert {
        "loss.name",
        "model.template",
        "backend.recompute_granularity",
        "rollout.vllm.server.host",
        "tracking.wandb.entity",
    } <= set(walked)  # the walk reaches the variants' keys
    assert NOT_NAME_KEYS <= set(walked), NOT_NAME_KEYS - set(walked)  # no stale exemption
    missed = []
    for key, (base, kind) in sorted(walked.items()):
        if key in NOT_NAME_KEYS:
            continue
        for bad in ("../../../../ESC", "a/b", ".."):
            cfg = copy.deepcopy(base)
            _set(cfg, key, [bad] if kind == "list" else bad)
            try:
                validate_config(cfg)
            except ConfigError as e:
                if not (e.key == key or e.key.startswith(key + "[")) or "\n" in str(e):
                    missed.append(f"{key}={bad!r}: {e}")
            else:
                missed.append(f"{key}={bad!r}: accepted")
    assert missed == []


def test_keys_that_hold_paths_never_reach_a_folder_name():
    """The exempt keys (paths, URLs, raw flags) are each left out of Hydra's override_dirname."""
    from omegaconf import OmegaConf

    hydra_cfg = OmegaConf.load(REPO / "configs" / "hydra" / "default.yaml")
    excluded = set(hydra_cfg.job.config.override_dirname.exclude_keys)
    assert NOT_NAME_KEYS <= excluded, NOT_NAME_KEYS - excluded


@pytest.mark.parametrize(
    "override",
    [
        "model.template=../../../../../ESC",
        "model.model_type=a/b",
        "loss.beta_form=../../../../ESC",
        "gkd.beta=0.5 model.template=/etc",
    ],
)
def test_an_unsafe_override_never_makes_a_folder_outside_the_output_root(tmp_path, monkeypatch, override):
    """Hydra makes the run folder before the job validates: an override_dirname that is not one folder name is
    swapped for the stand-in (before: runs/<group>/model.template=../../../../../ESC left the output root)."""
    monkeypatch.setenv("GKD_OUTPUT_ROOT", str(tmp_path / "out"))
    for multirun in (False, True):
        _, run_dir = point_config(override.split(), multirun=multirun)
        assert run_dir.resolve().is_relative_to((tmp_path / "out").resolve()), run_dir
        assert run_dir.name == UNSAFE_NAME_STANDIN
    assert run_folder_name("gkd.beta=0.5,loss.name=a..b") == "gkd.beta=0.5,loss.name=a..b"
    assert run_folder_name("") == ""


# ------------------------------------------------------------------------------------------------ issue 32, item 5
@pytest.mark.parametrize("tag", ["original", "patched", "reference", "candidate:mine", "sha256:0123456789ab"])
def test_tags_the_harness_owns_cannot_be_given_by_hand(tag):
    """Before the fix `tracking.wandb.tags=[original]` was accepted on a patched run: the dashboards' filters
    counted it as upstream."""
    with pytest.raises(ConfigError) as err:
        validate_config(base_cfg(f"tracking.wandb.tags=[ok,'{tag}']"))
    assert str(err.value).startswith("tracking.wandb.tags[1]: ") and "harness sets itself" in str(err.value)


def test_owned_tags_are_the_tags_the_harness_sets():
    """OWNED_TAGS / OWNED_TAG_PREFIXES against the harness's own tag makers (contract roles, candidate tags)."""
    from gkd_harness.harness.contract import ROLE_BY_PRECISION
    from gkd_harness.harness.loss.candidate import candidate_tags

    assert OWNED_TAGS == set(ROLE_BY_PRECISION.values())
    tags = candidate_tags("candidate", str(REPO / "harness" / "loss" / "gkd.py"), "mine")
    assert tags and all(t.startswith(OWNED_TAG_PREFIXES) for t in tags)
    validate_config(base_cfg("tracking.wandb.tags=[originality,my-candidate]"))
