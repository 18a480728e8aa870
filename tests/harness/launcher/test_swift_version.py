"""The tested ms-swift series (gkd_harness.harness.launcher.swift_version): the check before launch, the version-dependent
arguments, and pyproject's requirement (one range, two spellings: checked equal here)."""

import re
import subprocess

import pytest

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.launcher.swift_version import (
    ALLOW_KEY,
    TESTED_SWIFT_SERIES,
    check_swift_version,
    series,
    version_args,
)
from tests.launch.helpers import REPO, gkd_train_cmd, harness_env


@pytest.mark.parametrize("ver", ["4.5.0", "4.5.3", "4.6.0", "4.6.2.post1", "4.6.0rc1"])
def test_tested_versions_pass(ver):
    assert check_swift_version(False, ver) == ver


@pytest.mark.parametrize("ver", ["4.4.1", "4.7.0", "5.0.0", "3.12.4"])
def test_untested_versions_are_refused_in_one_line_unless_allowed(ver):
    with pytest.raises(ConfigError) as err:
        check_swift_version(False, ver)
    msg = str(err.value)
    assert msg.startswith(f"{ALLOW_KEY}: ms-swift {ver} is installed; the harness is tested with 4.5.x and 4.6.x")
    assert f"{ALLOW_KEY}=true" in msg and "\n" not in msg
    assert check_swift_version(True, ver) == ver


def test_pyproject_requires_the_tested_series():
    line = next(x for x in (REPO / "pyproject.toml").read_text().splitlines() if x.strip().startswith('"ms-swift>='))
    low, high = re.search(r'"ms-swift>=([\d.]+),<([\d.]+)"', line).groups()
    assert series(low) == TESTED_SWIFT_SERIES[0]
    major, minor = map(int, TESTED_SWIFT_SERIES[-1].split("."))
    assert high == f"{major}.{minor + 1}"
    assert len(TESTED_SWIFT_SERIES) == minor - int(TESTED_SWIFT_SERIES[0].split(".")[1]) + 1  # contiguous


def test_arguments_that_differ_are_set_explicitly():
    """4.5.x keeps dataloader_persistent_workers=True (with 0 workers torch raises); 4.5.x's Megatron GKD trainer
    returns the CP-reduced mean with calculate_per_token_loss False, 4.6.x's the sum with it forced True."""
    for ver in ("4.5.3", "4.6.0"):
        hf = version_args(ver, megatron=False)
        assert hf == ["--dataloader_num_workers", "0", "--dataloader_persistent_workers", "false"]
    assert version_args("4.5.3", megatron=True) == ["--calculate_per_token_loss", "false"]
    assert version_args("4.6.0", megatron=True) == ["--calculate_per_token_loss", "true"]


def test_gkd_train_refuses_an_untested_version_before_launch(tmp_path):
    """The whole CLI: an installed ms-swift 9.9.0 (a distribution's metadata first on the path) stops the dry run
    with exit 2 and one line; run.allow_untested_swift=true goes on."""
    fake = tmp_path / "site" / "ms_swift-9.9.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: ms-swift\nVersion: 9.9.0\n")
    env = harness_env(tmp_path / "out")
    env["PYTHONPATH"] = f"{fake.parent}:{env['PYTHONPATH']}"
    cmd = gkd_train_cmd(["run.dry_run=true", f"run.output_dir={tmp_path / 'run'}"])
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert lines == [
        f"gkd-train: invalid config: {ALLOW_KEY}: ms-swift 9.9.0 is installed; the harness is tested "
        f"with 4.5.x and 4.6.x: install one of them, or set {ALLOW_KEY}=true to run on 9.9.0 anyway"
    ]
    proc = subprocess.run(
        [*cmd, f"{ALLOW_KEY}=true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--dataloader_persistent_workers false" in proc.stdout
