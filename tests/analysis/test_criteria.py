"""gkd_harness.analysis.signoff.criteria: a criterion's status is one of the contract's CriterionStatus values."""

from __future__ import annotations

import typing

import pytest

from gkd_harness.analysis.signoff.criteria import as_status
from gkd_harness.harness.contract import CRITERION_STATUSES, FAILING_STATUSES, CriterionStatus


def test_statuses_are_the_literal_type_and_failing_is_a_subset():
    assert CRITERION_STATUSES == typing.get_args(CriterionStatus)
    assert CRITERION_STATUSES == ("pass", "fail", "not_measured", "not_applicable", "skipped", "disabled")
    assert set(FAILING_STATUSES) == {"fail", "not_measured"}


def test_as_status_takes_a_status_and_refuses_anything_else():
    assert [as_status(s) for s in CRITERION_STATUSES] == list(CRITERION_STATUSES)
    with pytest.raises(ValueError, match="'passed': not one of"):
        as_status("passed")
