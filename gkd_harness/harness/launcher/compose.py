"""Composing the config tree outside ``@hydra.main``: for the dry run, the SLURM dry run and tests.

The tree ships inside the package ``gkd_harness.configs`` (``configs/`` in the repository), so it is found from an
editable install and from a wheel alike. :func:`point_config` gives what a point's ``gkd-train`` job sees: the
typed config with ``run.output_dir`` set to the folder Hydra would give it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from gkd_harness.harness.config.schema import ConfigError, TrainConfig, register_schemas, to_typed

CONFIG_MODULE = "gkd_harness.configs"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
CONFIG_NAME = "train"
#: The submitit plugin's launcher schemas, known to Hydra under these names instead of the plugin's own
#: (:func:`register`): configs/hydra/launcher/submitit_{local,slurm}.yaml keep the names users type
#: (``hydra/launcher=submitit_slurm`` picks the harness's settings) and extend the schema through their defaults
#: lists. Under the plugin's names, Hydra matched each file to the schema of the same name, a deprecated behaviour
#: it warned about on every compose.
LAUNCHER_SCHEMAS = {"submitit_local": "submitit_local_schema", "submitit_slurm": "submitit_slurm_schema"}


def register() -> None:
    """Schemas into Hydra's ConfigStore and the harness's resolvers into OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    from gkd_harness.harness.launcher.node import local_gpu_count

    register_schemas()
    _rename_launcher_schemas()
    if not OmegaConf.has_resolver("gkd_folder_name"):  # hydra.run.dir / sweep.dir never leave the output root
        from gkd_harness.harness.config.name_rules import folder_name

        OmegaConf.register_new_resolver("gkd_folder_name", folder_name)
    if not OmegaConf.has_resolver("gkd_run_folder"):  # nor does a run folder named by an unsafe override
        from gkd_harness.harness.config.name_rules import run_folder_name

        OmegaConf.register_new_resolver("gkd_run_folder", run_folder_name)
    if not OmegaConf.has_resolver("gkd_local_gpus"):
        OmegaConf.register_new_resolver("gkd_local_gpus", lambda nproc, device: local_gpu_count(nproc, device))


def _rename_launcher_schemas() -> None:
    """The submitit plugin's schemas under :data:`LAUNCHER_SCHEMAS`' names (idempotent). Hydra's plugin scan, run
    once per process and first here, registers them under the plugin's names; ConfigStore has no public removal."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # the scan imports hydra_plugins.hydra_submitit_launcher.config, which stores the schemas
    group = ConfigStore.instance().repo.get("hydra", {}).get("launcher", {})
    for plugin_name, ours in LAUNCHER_SCHEMAS.items():
        node = group.pop(f"{plugin_name}.yaml", None)
        if node is not None:
            ConfigStore.instance().store(group="hydra/launcher", name=ours, node=node.node, provider=node.provider)


def compose(overrides: Sequence[str]):
    """``configs/train.yaml`` composed with ``overrides`` (Hydra's compose API, hydra node included)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3", job_name="gkd-train"):
        try:
            return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise composition_error(e) from None


def composition_error(e: BaseException) -> ConfigError:
    """A Hydra/OmegaConf composition error as one :class:`ConfigError` line naming the key."""
    cause: Optional[BaseException] = e
    while cause is not None and getattr(cause, "full_key", None) is None:
        cause = cause.__cause__ or cause.__context__
    key = str(getattr(cause, "full_key", None) or "overrides")
    text = str(getattr(cause, "msg", None) or e).strip().splitlines()
    return ConfigError(key, text[0] if text else type(e).__name__)


def override_dirname(job_overrides: Iterable[str], hydra_cfg) -> str:
    """Hydra's ``override_dirname`` for one point (same exclusions and separators as ``hydra.job.config``)."""
    # Hydra has no public function for override_dirname: its own, so a point's folder is the one Hydra gives it
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra.core.override_parser.overrides_parser import OverridesParser

    od = hydra_cfg.job.config.override_dirname
    parsed = OverridesParser.create().parse_overrides(list(job_overrides))
    return get_overrides_dirname(parsed, exclude_keys=list(od.exclude_keys), item_sep=od.item_sep, kv_sep=od.kv_sep)


def run_dir_for(master, job_overrides: Sequence[str], multirun: bool) -> Path:
    """The folder Hydra gives a job: ``hydra.run.dir``, or ``hydra.sweep.dir/<override_dirname>`` in a sweep."""
    from omegaconf import OmegaConf, open_dict

    cfg = OmegaConf.create(OmegaConf.to_container(master, resolve=False))
    name = override_dirname(job_overrides, cfg.hydra)
    with open_dict(cfg):
        cfg.hydra.job.override_dirname = name
        cfg.hydra.job.name = "gkd-train"
    if multirun:
        return Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
    return Path(str(cfg.hydra.run.dir))


@dataclass(frozen=True)
class Point:
    """One job as its ``gkd-train`` process sees it: the typed config, its run folder, the ``experiment=`` choice."""

    cfg: TrainConfig
    run_dir: Path
    experiment: Optional[str]


def compose_point(job_overrides: Sequence[str], run_dir: Optional[Path] = None, multirun: bool = False) -> Point:
    """:func:`point_config` plus the ``experiment=`` choice (a wandb tag)."""
    master = compose(job_overrides)
    cfg, run_dir = _point_from(master, job_overrides, run_dir, multirun)
    choice = master.hydra.runtime.choices.get("experiment")
    return Point(cfg, run_dir, str(choice) if choice not in (None, "null") else None)


def point_config(
    job_overrides: Sequence[str], run_dir: Optional[Path] = None, multirun: bool = False
) -> tuple[TrainConfig, Path]:
    """(typed config, run folder) of one job, as its ``gkd-train`` process would see them.

    The run folder is ``run.output_dir`` when the overrides set it, else ``run_dir``, else Hydra's folder for the
    job (:func:`run_dir_for`).

    Raises:
        ConfigError: a missing or ill-typed value, naming its key.
    """
    return _point_from(compose(job_overrides), job_overrides, run_dir, multirun)


def _point_from(master, job_overrides: Sequence[str], run_dir: Optional[Path], multirun: bool):
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(master, resolve=False)
    if not isinstance(data, dict):
        raise ConfigError("config", f"must be a mapping, got {type(data).__name__}")
    data.pop("hydra", None)
    given = str(data["run"].get("output_dir", ""))
    if given and "${" not in given:
        run_dir = Path(given)
    elif run_dir is None:
        run_dir = run_dir_for(master, job_overrides, multirun)
    run_dir = Path(run_dir).expanduser().resolve()
    data["run"]["output_dir"] = str(run_dir)  # what ${hydra:runtime.output_dir} becomes in the job
    return to_typed(OmegaConf.create(data)), run_dir


__all__ = [
    "CONFIG_MODULE",
    "CONFIG_PATH",
    "CONFIG_NAME",
    "LAUNCHER_SCHEMAS",
    "compose",
    "override_dirname",
    "run_dir_for",
    "point_config",
    "compose_point",
    "Point",
    "register",
]
