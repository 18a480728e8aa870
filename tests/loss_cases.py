"""The loss tests' inputs are the certificate's: analysis/certify/cases.py is their one home (``problem`` makes
every set of inputs; ``make_case`` wraps it for the tests, ``make`` for the certificate's cases). This module
only re-exports it under the path the tests and scripts/measure_tolerances.py import."""

from gkd_harness.analysis.certify.cases import (  # noqa: F401
    BETAS,
    DTYPE_PAIRS,
    DTYPES,
    FORMS,
    MODES,
    TEMPERATURES,
    Problem,
    grid,
    make_case,
    seed_of,
)
