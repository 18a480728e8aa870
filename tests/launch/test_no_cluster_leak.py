"""Cluster and partition values never leak into committed configs (they belong in git-ignored configs/local/)."""

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

#: keys whose value is site-specific: allowed only as null / empty in committed configs
CLUSTER_KEYS = {
    "partition",
    "account",
    "qos",
    "constraint",
    "exclude",
    "comment",
    "reservation",
    "nodelist",
    "setup",
    "entity",
    "mail_user",
    "mail-user",
    "wckey",
    "gres",
}


def committed_config_files() -> list[Path]:
    """Every file under gkd_harness/configs/ (the top-level configs/ links there) that git would commit (tracked, or untracked and not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "gkd_harness/configs"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(REPO / p for p in out if (REPO / p).is_file())


def _walk(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, (*path, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, (*path, str(i)))
    else:
        yield path, node


def leaks(text: str) -> list[str]:
    """Site-specific values in one YAML document: cluster keys with a value, absolute or home paths."""
    found = []
    for path, value in _walk(yaml.safe_load(text) or {}):
        dotted = ".".join(path)
        if any(part in CLUSTER_KEYS for part in path) and value not in (None, "", [], {}):
            found.append(f"{dotted}={value!r}")
        elif isinstance(value, str) and (value.startswith(("/", "~")) or "/home/" in value or "/scratch" in value):
            found.append(f"{dotted}={value!r}")
    if "additional_parameters" in text:
        for path, value in _walk(yaml.safe_load(text) or {}):
            if "additional_parameters" in path and value not in (None, "", [], {}):
                found.append(f"{'.'.join(path)}={value!r}")
    return found


def test_committed_configs_hold_no_cluster_values():
    files = [p for p in committed_config_files() if p.suffix in (".yaml", ".yml")]
    assert files, "no config files found"
    offenders = {str(p.relative_to(REPO)): leaks(p.read_text()) for p in files}
    offenders = {k: v for k, v in offenders.items() if v and not k.endswith(".example.yaml")}
    assert offenders == {}


def test_local_folder_is_ignored_except_docs_and_examples():
    def ignored(rel):
        return subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO).returncode == 0

    assert ignored("gkd_harness/configs/local/default.yaml")
    assert ignored("gkd_harness/configs/local/my_cluster.yaml")
    assert not ignored("gkd_harness/configs/local/README.md")


def test_example_file_is_committable():
    """.gitignore must keep `!gkd_harness/configs/local/*.example.yaml` (``configs/`` is a link into gkd_harness/) so the documented example reaches users."""
    assert (
        subprocess.run(
            ["git", "check-ignore", "-q", "gkd_harness/configs/local/slurm.example.yaml"], cwd=REPO
        ).returncode
        == 1
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("hydra:\n  launcher:\n    partition: gpu-h100\n", ["hydra.launcher.partition='gpu-h100'"]),
        ("hydra:\n  launcher:\n    partition: null\n    account: null\n", []),
        ("model:\n  teacher: /lustre/models/Qwen3.5-9B\n", ["model.teacher='/lustre/models/Qwen3.5-9B'"]),
        ("hydra:\n  launcher:\n    setup: [module load cuda]\n", ["hydra.launcher.setup.0='module load cuda'"]),
        ("teacher: Qwen/Qwen3.5-9B\n", []),
    ],
)
def test_leak_detector_catches_site_values(text, expected):
    assert leaks(text) == expected
