"""Hydra's own answers kept (issue 47, items 3 and 4).

* ``gkd-train loss=fp33``: before, one line without Hydra's "Available options in 'loss'"; with
  ``HYDRA_FULL_ERROR=1`` the options appeared but the exit code became 1 and the internal ``loss_schema`` was
  listed. Now the line, then the group's presets (no schema), exit 2; with ``HYDRA_FULL_ERROR=1`` a traceback
  too, the same list and exit 2.
* ``gkd-train --cfg job --resolve``: before, exit 2 (``run.output_dir ... Incompatible value 'None'``: no job
  runs, so Hydra's ``hydra.runtime.output_dir`` is unset). Now it prints the resolved config, ``run.output_dir``
  the folder the job would get.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import entry_point

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "gkd_harness/configs/loss").glob("*.yaml"))


def _train(args, cwd, **extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", **extra}
    if "HYDRA_FULL_ERROR" not in extra:
        env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [entry_point("gkd-train"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _listed(stderr: str) -> list:
    lines = stderr.splitlines()
    start = max(i for i, x in enumerate(lines) if x.startswith("Available options in 'loss':"))
    return [x.strip() for x in lines[start + 1 :] if x.startswith("\t")]


def test_an_unknown_preset_lists_the_groups_presets(tmp_path):
    p = _train(["loss=fp33"], tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("gkd-train: invalid config: loss: no preset 'fp33'"), p.stderr
    assert _listed(p.stderr) == PRESETS and "schema" not in p.stderr, p.stderr


def test_hydra_full_error_keeps_the_exit_code_and_hides_the_schemas(tmp_path):
    p = _train(["loss=fp33"], tmp_path, HYDRA_FULL_ERROR="1")
    assert p.returncode == 2, p.stderr
    assert "Traceback" in p.stderr and "schema" not in p.stderr, p.stderr
    assert _listed(p.stderr) == PRESETS, p.stderr
    assert p.stderr.strip().splitlines()[-1 - len(PRESETS) - 1].startswith("gkd-train: invalid config: loss: ")


def test_cfg_job_resolve_prints_the_resolved_config(tmp_path):
    p = _train(["--cfg", "job", "--resolve", "gkd.beta=0.3"], tmp_path)
    assert p.returncode == 0, p.stderr
    import yaml

    cfg = yaml.safe_load(p.stdout)
    root = Path(os.environ.get("GKD_OUTPUT_ROOT", tmp_path / "outputs"))
    assert cfg["gkd"]["beta"] == 0.3
    assert Path(cfg["run"]["output_dir"]) == (tmp_path / root / "runs" / "default" / "gkd.beta=0.3").resolve()
    assert "${" not in p.stdout
