"""Deterministic loss-suite inputs shared by the tests and tests/measure_tolerances.py: the certificate's own
generator (analysis/certify/cases.py, one home for both), re-exported under the names the tests use."""
from analysis.certify.cases import (BETAS, DTYPE_PAIRS, DTYPES, FORMS, MODES, TEMPERATURES, Problem,  # noqa: F401
                                    grid, make_case, seed_of)

Case = Problem  # the name the tests used for a set of inputs
