"""Tests write only under their own temporary folders (issue 24): the output root and the harness's cache."""

import os
from pathlib import Path


def test_every_test_sees_a_cache_and_an_output_root_under_the_session_tmp(tmp_path_factory):
    """Before: ``$GKD_HARNESS_CACHE`` was set only for tests that asked for ``embedded_cache``; the others built the
    embedded models and ms-swift's flag table in the user's ``~/.cache/gkd-harness``."""
    base = tmp_path_factory.getbasetemp().resolve()
    for var in ("GKD_HARNESS_CACHE", "GKD_OUTPUT_ROOT"):
        assert var in os.environ, var
        assert base in Path(os.environ[var]).resolve().parents, (var, os.environ[var])
