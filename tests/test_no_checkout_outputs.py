"""The test suite writes only under temporary folders: a gkd-train started the way the CLI tests start it (the
test process's environment, the checkout as working directory) leaves no ``outputs/`` in the checkout.

Before: a config error with ``run.output_dir`` set still left the ``outputs/`` Hydra made (tests/harness/launcher/
test_train_e2e.py::test_cli_rejects_bad_config_naming_the_key and the other CLI runs of that file)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import entry_point

CHECKOUT = Path(__file__).resolve().parents[1]


def _entries(folder: Path) -> set:
    return {p.relative_to(folder) for p in folder.rglob("*")} if folder.exists() else set()


def test_gkd_train_from_the_checkout_leaves_no_outputs_there(tmp_path):
    outputs = CHECKOUT / "outputs"
    existed, before = outputs.exists(), _entries(outputs)
    proc = subprocess.run(
        [entry_point("gkd-train"), f"run.output_dir={tmp_path / 'r'}", "gkd.beta=1.5"],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert outputs.exists() == existed and _entries(outputs) == before
    assert Path(os.environ["GKD_OUTPUT_ROOT"]).resolve() != outputs.resolve()
