"""Shared fixtures.

* ``embedded_cache`` (session): a private cache root for ``harness.embedded`` (``$GKD_HARNESS_CACHE``), so the
  tiny models are built once per test session and never touch the user's cache.
* ``e2e_root`` (session): a folder for end-to-end run folders.
"""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("gkd_cache")
    old = os.environ.get("GKD_HARNESS_CACHE")
    os.environ["GKD_HARNESS_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("GKD_HARNESS_CACHE", None)
    else:
        os.environ["GKD_HARNESS_CACHE"] = old


@pytest.fixture(scope="session")
def e2e_root(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_runs")
