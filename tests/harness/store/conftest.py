"""Fixtures of the store tests."""

from __future__ import annotations

import subprocess

import pytest

from tests.harness.store.run_folder_helpers import mount_tmpfs


@pytest.fixture
def small_fs(tmp_path):
    """A real 64 KiB tmpfs (root only), unmounted afterwards."""
    mnt = tmp_path / "fs"
    mount_tmpfs(mnt, "64k")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
