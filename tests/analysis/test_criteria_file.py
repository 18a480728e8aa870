"""The sign-off criteria file: a typed schema over configs/signoff/default.yaml (the only home of defaults);
unknown keys, missing keys and bad types are refused with one line naming the file and the full key."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from gkd_harness.analysis.signoff.criteria_file import (
    CRITERIA_NAMES,
    SignoffCriteria,
    criteria_from_dict,
    default_criteria_text,
    load_criteria,
)
from gkd_harness.analysis.sweep.records import UnusableInput


def test_default_file_loads_typed_and_matches_the_schema_exactly():
    where, text = default_criteria_text()
    assert where.endswith("signoff/default.yaml")
    cfg = load_criteria()
    assert isinstance(cfg, SignoffCriteria)
    assert cfg.to_dict() == yaml.safe_load(text)  # every YAML key is in the schema and every field in the YAML
    assert cfg.spot_tolerance.loss_rtol == 1e-4 and isinstance(cfg.spot_tolerance.min_checks_per_run, int)
    assert cfg.report.first_steps == 3
    assert cfg.no_nonfinite.max_nonfinite_calls == 0 and cfg.no_nonfinite.required
    assert CRITERIA_NAMES[:3] == ("no_negative_patched", "no_nonfinite", "spot_tolerance")


def test_schema_has_no_defaults():
    def walk(cls):
        for f in dataclasses.fields(cls):
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp)

    walk(SignoffCriteria)


def test_override_merges_and_accepts_yaml12_floats(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(
        "spot_tolerance:\n  loss_rtol: 1e-5\n  param_grad_rel_l2_max: null\nno_failed_runs:\n  allow_incomplete: true\n"
    )
    cfg = load_criteria(f)
    assert cfg.spot_tolerance.loss_rtol == 1e-5 and cfg.spot_tolerance.param_grad_rel_l2_max is None
    assert cfg.spot_tolerance.loss_atol == 2e-6  # untouched keys keep the shipped value
    assert cfg.no_failed_runs.allow_incomplete is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("no_negative_patched:\n  max_negatives: 1\n", "unknown criteria key 'no_negative_patched.max_negatives'"),
        ("spot_toleranse:\n  loss_rtol: 1\n", "unknown criteria key 'spot_toleranse'"),
        ("spot_tolerance:\n  loss_rtol: -1\n", "criteria key 'spot_tolerance.loss_rtol' must be a number >= 0, got -1"),
        ("spot_tolerance:\n  loss_rtol: 'tight'\n", "'spot_tolerance.loss_rtol' must be a number >= 0, got 'tight'"),
        ("spot_tolerance:\n  loss_rtol: .inf\n", "'spot_tolerance.loss_rtol' must be a number >= 0, got inf"),
        ("spot_tolerance:\n  min_checks_per_run: 1.5\n", "'spot_tolerance.min_checks_per_run' must be an integer >= 0"),
        ("spot_tolerance: 3\n", "criteria key 'spot_tolerance' must be a mapping, got 3"),
        ("no_nonfinite:\n  required: 'yes'\n", "'no_nonfinite.required' must be true or false, got 'yes'"),
        ("original_shows_defect:\n  require: most\n", "'original_shows_defect.require' must be all | any, got 'most'"),
        (
            "beta_forms_unchanged:\n  betas: [0.0, 1.5]\n",
            "'beta_forms_unchanged.betas' must be a non-empty list of numbers >= 0 and <= 1, got [0.0, 1.5]",
        ),
        # The roles have one definition (gkd_harness.harness.contract.role_of): the criteria file no longer sets them (issue 29).
        ("patched_precisions: [fp32]\n", "unknown criteria key 'patched_precisions'"),
        ("report:\n  first_steps: 0\n", "'report.first_steps' must be an integer >= 1, got 0"),
        ("- a\n- b\n", "expected a mapping"),
        ("spot_tolerance: {loss_rtol: [\n", "not valid YAML"),
    ],
)
def test_bad_criteria_file_names_file_and_full_key(tmp_path, text, message):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UnusableInput) as e:
        load_criteria(f)
    msg = str(e.value)
    assert message in msg and str(f) in msg and "\n" not in msg


def test_incomplete_mapping_names_the_missing_key():
    data = load_criteria().to_dict()
    del data["no_nonfinite"]["metrics"]
    with pytest.raises(UnusableInput, match=r"^x.yaml: criteria key 'no_nonfinite.metrics' missing$"):
        criteria_from_dict(data, "x.yaml")


def test_missing_criteria_file(tmp_path):
    with pytest.raises(UnusableInput, match="does not exist"):
        load_criteria(tmp_path / "nope.yaml")
