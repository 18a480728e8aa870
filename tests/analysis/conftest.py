"""Shared fixtures for the analysis tests: a small synthetic sweep (contract-shaped run folders)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gkd_harness.bench.synthetic import write_sweep


@pytest.fixture(scope="session")
def synthetic_sweep_dir(tmp_path_factory) -> Path:
    """16 runs: β {0, 0.5, 0.9, 1} x {paper, continuous} x {native, fp32}, 12 steps, spot check every 3 steps."""
    root = tmp_path_factory.mktemp("synthetic") / "sweep"
    write_sweep(root, betas=(0.0, 0.5, 0.9, 1.0), temperatures=(0.9,), seeds=(0,), steps=12, spot_every=3)
    return root


@pytest.fixture
def sweep_copy(synthetic_sweep_dir, tmp_path) -> Path:
    """A private copy of the synthetic sweep that a test may edit."""
    dst = tmp_path / "sweep"
    shutil.copytree(synthetic_sweep_dir, dst)
    return dst


@pytest.fixture
def figs(monkeypatch) -> dict:
    """File name -> the matplotlib Figure that the sign-off's plots saved under it."""
    from pathlib import Path

    from gkd_harness.analysis.signoff import plots

    kept = {}
    save = plots._save

    def keep(fig, path):
        kept[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return kept
