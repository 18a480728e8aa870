"""The bypass net's decision (issue 41): ``gkd-train`` fails a run whose training steps did not all call the harness's
``gkd_loss`` (``loss_calls`` < ``steps_trained`` in the writer rank's ``summary.json`` fields), and
judges nothing without both counts or without a step trained. The real run is in test_loss_bypass_e2e."""

import pytest

from gkd_harness.harness.contract import LOSS_CALLS_FIELD, STEPS_TRAINED_FIELD
from gkd_harness.harness.launcher.run import loss_bypass_error


def test_steps_without_a_loss_call_fail_in_one_line_naming_the_counts():
    error = loss_bypass_error({LOSS_CALLS_FIELD: 0, STEPS_TRAINED_FIELD: 20, "world_size": 8})
    assert error == (
        "the harness's gkd_loss was never called in 20 training steps: something bypassed it (a fused-loss flag "
        "such as --use_liger_kernel, an external plugin rebinding gkd_loss or the trainer's loss method, ...); "
        "the run measured nothing (summary.json: loss_calls=0, steps_trained=20)"
    )


def test_one_step_is_said_in_the_singular():
    error = loss_bypass_error({LOSS_CALLS_FIELD: 0, STEPS_TRAINED_FIELD: 1})
    assert error is not None and "never called in 1 training step:" in error


@pytest.mark.parametrize("calls,steps", [(1, 20), (19, 20), (1, 2)])
def test_fewer_calls_than_steps_fail_as_a_partial_bypass(calls, steps):
    """Each training step calls gkd_loss at least once (once per micro-batch); fewer calls than steps means some
    steps trained through another loss (before: any call at all passed, so a bypass on all but one step did)."""
    error = loss_bypass_error({LOSS_CALLS_FIELD: calls, STEPS_TRAINED_FIELD: steps})
    assert error == (
        f"the harness's gkd_loss was called {calls} time{'s' if calls != 1 else ''} in {steps} training steps (each "
        "step calls it at least once): something bypassed it on some steps (a fused-loss flag such as "
        "--use_liger_kernel, an external plugin rebinding gkd_loss or the trainer's loss method, ...); the run "
        f"measured only part of its training (summary.json: loss_calls={calls}, steps_trained={steps})"
    )


@pytest.mark.parametrize(
    "summary",
    [
        {LOSS_CALLS_FIELD: 20, STEPS_TRAINED_FIELD: 20},  # one call per step (Megatron's last rank, HF's rank 0)
        {LOSS_CALLS_FIELD: 80, STEPS_TRAINED_FIELD: 20},  # gradient accumulation: several calls per step
        {LOSS_CALLS_FIELD: 0, STEPS_TRAINED_FIELD: 0},  # a resume at its last step trains nothing
        {LOSS_CALLS_FIELD: None, STEPS_TRAINED_FIELD: None},  # a resumed attempt whose rank never reported
        {STEPS_TRAINED_FIELD: 20},  # no count: not judged (the plugin's own "never reported" check is elsewhere)
        {LOSS_CALLS_FIELD: 0},
        {},
        {LOSS_CALLS_FIELD: False, STEPS_TRAINED_FIELD: 3},  # a bool is no count
        {LOSS_CALLS_FIELD: 0, STEPS_TRAINED_FIELD: "3"},
    ],
)
def test_a_call_per_step_or_no_steps_or_no_counts_pass(summary):
    assert loss_bypass_error(summary) is None
