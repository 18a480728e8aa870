"""Credentials in Hydra's own files (gkd_harness.harness.store.hydra_files): a real Hydra app writes the .hydra/ files that get
scrubbed, and the harness writes them itself without the secret."""

from __future__ import annotations

import subprocess
import sys

from gkd_harness.harness.config.secrets import REDACTED
from gkd_harness.harness.store.hydra_files import redacted_folder_name, scrub_folder_name, scrub_hydra_dir
from tests.harness.store.run_folder_helpers import REPO

# ------------------------------------------------------------------------------------------------ secrets
HYDRA_APP = """
import hydra
from omegaconf import OmegaConf

@hydra.main(version_base="1.3", config_path=None, config_name="cfg")
def main(cfg):
    print(OmegaConf.to_yaml(cfg))

if __name__ == "__main__":
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="cfg", node={"gkd": {"beta": 0.5}, "tracking": {"wandb": {"group": "g"}}})
    main()
"""


def test_scrub_hydra_outputs_and_folder_name_of_a_real_hydra_run(tmp_path):
    """Issue 12 item 6: `+tracking.wandb.api_key=...` lands in .hydra/*.yaml and the folder name."""
    secret = "Sekr3tKeyValue0123456789"
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP)
    out = tmp_path / "outputs"
    subprocess.run(
        [
            sys.executable,
            str(app),
            f"+tracking.wandb.api_key={secret}",
            "gkd.beta=0.9",
            f"hydra.run.dir={out}/" + "${hydra.job.override_dirname}",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    [run_dir] = list(out.iterdir())
    hydra_dir = run_dir / ".hydra"

    def leaks():
        hits = [p for p in out.rglob("*") if secret in p.name]
        hits += [p for p in out.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]
        return hits

    assert secret in run_dir.name and {p.name for p in leaks()} >= {"config.yaml", "overrides.yaml", "hydra.yaml"}
    changed = scrub_hydra_dir(hydra_dir)
    assert {p.name for p in changed} == {"config.yaml", "overrides.yaml", "hydra.yaml"}
    assert redacted_folder_name(run_dir).name == run_dir.name.replace(secret, "REDACTED")
    new_dir = scrub_folder_name(run_dir)
    assert leaks() == []
    assert new_dir.name == "+tracking.wandb.api_key=REDACTED,gkd.beta=0.9"
    # the files still parse, and keep everything but the secret
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(new_dir / ".hydra" / "config.yaml")
    assert cfg.tracking.wandb.api_key == REDACTED and cfg.gkd.beta == 0.9 and cfg.tracking.wandb.group == "g"
    assert list(OmegaConf.load(new_dir / ".hydra" / "overrides.yaml")) == [
        f"+tracking.wandb.api_key={REDACTED}",
        "gkd.beta=0.9",
    ]
    assert scrub_hydra_dir(new_dir / ".hydra") == []  # idempotent


HYDRA_APP_OWN_FILES = """
import sys
import hydra
from omegaconf import OmegaConf
sys.path.insert(0, {repo!r})
from gkd_harness.harness.store.hydra_files import save_hydra_files

@hydra.main(version_base="1.3", config_path=None, config_name="cfg")
def main(cfg):
    from hydra.core.hydra_config import HydraConfig
    save_hydra_files(HydraConfig.get().runtime.output_dir, cfg)

if __name__ == "__main__":
    from hydra.core.config_store import ConfigStore
    ConfigStore.instance().store(name="cfg", node={{"gkd": {{"beta": 0.5}}, "tracking": {{"wandb": {{"group": "g"}}}}}})
    main()
"""


def test_harness_writes_hydra_files_itself_without_the_secret(tmp_path):
    """With hydra.output_subdir=null Hydra writes nothing; save_hydra_files writes the same three files, redacted."""
    secret = "Sekr3tKeyValue0123456789"
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP_OWN_FILES.format(repo=str(REPO)))
    out = tmp_path / "outputs"
    subprocess.run(
        [
            sys.executable,
            str(app),
            f"+tracking.wandb.api_key={secret}",
            "gkd.beta=0.9",
            "hydra.output_subdir=null",
            f"hydra.run.dir={out}/run",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    hydra_dir = out / "run" / ".hydra"
    assert sorted(p.name for p in hydra_dir.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert not any(secret in p.read_text() for p in hydra_dir.iterdir())
    from omegaconf import OmegaConf

    assert OmegaConf.load(hydra_dir / "config.yaml").gkd.beta == 0.9
    hydra_yaml = OmegaConf.load(hydra_dir / "hydra.yaml")
    assert list(hydra_yaml.hydra.overrides.task) == [f"+tracking.wandb.api_key={REDACTED}", "gkd.beta=0.9"]
    assert hydra_yaml.hydra.job.name == "app"
