"""Composing the config tree outside ``@hydra.main``: for the dry run, the SLURM dry run and tests.

The tree ships inside the package ``gkd_harness.configs`` (``configs/`` in the repository), so it is found from an
editable install and from a wheel alike. :func:`point_config` gives what a point's ``gkd-train`` job sees: the
typed config with ``run.output_dir`` set to the folder Hydra would give it.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

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
    if not OmegaConf.has_resolver("gkd_job_folder"):  # run.output_dir's default (configs/train.yaml)
        OmegaConf.register_new_resolver("gkd_job_folder", job_folder)


def job_folder() -> Optional[str]:
    """The job's folder: Hydra's ``hydra.runtime.output_dir`` in a job; where no job runs (``--cfg job
    --resolve``), the folder Hydra would give it (``hydra.run.dir``, in a sweep ``hydra.sweep.dir/subdir``).
    Outside a Hydra app (the compose API before :func:`_as_in_the_job`), None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    from omegaconf import OmegaConf

    hydra_cfg: Any = HydraConfig.get()
    if not OmegaConf.is_missing(hydra_cfg.runtime, "output_dir") and hydra_cfg.runtime.output_dir:
        return str(hydra_cfg.runtime.output_dir)
    # HydraConfig's Hydra node hangs under the user's config (hydra_config.py), which --cfg job strips of it
    whole = OmegaConf.to_container(hydra_cfg._get_parent(), resolve=False)
    assert isinstance(whole, dict)
    whole["hydra"] = OmegaConf.to_container(hydra_cfg, resolve=False)
    master = OmegaConf.create(whole)
    return str(run_dir_for(master, list(hydra_cfg.overrides.task), hydra_cfg.mode == RunMode.MULTIRUN).absolute())


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
        except (HydraException, OmegaConfBaseException, ValueError) as e:  # ValueError: `loss=null`
            raise composition_error(e, overrides) from None
        except OSError as e:  # a preset name the file system cannot take (`monitor=<5,000 characters>`)
            raise ConfigError(_key_in_message("", overrides), f"not a usable preset name ({e.strerror})") from None


#: the longest message of a composition error kept (a 5,000-character value is not echoed whole)
MAX_MESSAGE = 240


def _first_line(e: BaseException) -> str:
    text = str(getattr(e, "msg", None) or e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def composition_error(e: BaseException, overrides: Sequence[str] = ()) -> ConfigError:
    """A Hydra/OmegaConf composition error as one :class:`ConfigError` naming the key at fault.

    An error Hydra meets in its own node (``hydra.run.dir`` holds the overrides' text, so an unset
    ``${oc.env:...}`` or a self reference in any override first fails there) names the user's key that does not
    resolve (:func:`unresolvable_key`); an unknown preset names its group and lists the group's presets (Hydra's
    list, without the typed schemas stored beside them); an error without a key names the override it mentions."""
    from hydra.errors import MissingConfigException

    cause: Optional[BaseException] = e
    while cause is not None and getattr(cause, "full_key", None) is None:
        cause = cause.__cause__ or cause.__context__
    key = getattr(cause, "full_key", None)
    root = _root_of(cause)
    if root is not None and (not key or str(key).startswith("hydra")):
        found = unresolvable_key(root, skip=("run.output_dir",))
        if found is not None:
            return found
    if isinstance(e, MissingConfigException) and e.missing_cfg_file and "/" in str(e.missing_cfg_file):
        return unknown_preset(str(e.missing_cfg_file), e.options)
    if cause is not None and key:
        return ConfigError(str(key), _first_line(cause))
    return ConfigError(_key_in_message(str(e), overrides), _first_line(e))


def print_full_error(e: BaseException, error: ConfigError) -> None:
    """``HYDRA_FULL_ERROR=1``: the traceback of Hydra's error on stderr, its message replaced by ``error``'s (an
    unknown preset's list without the schemas); the caller then prints the line and exits 2 as without it."""
    import traceback

    e.args = (str(error),)
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)


def unknown_preset(missing: str, options: Optional[Sequence[str]]) -> ConfigError:
    """``loss=fp33``: the group, the missing preset and the group's presets (not the schemas: ``loss_schema``)."""
    from gkd_harness.harness.config.schema import SCHEMAS

    group, _, name = missing.rpartition("/")
    schemas = {schema for _, schema, _ in SCHEMAS}
    shown = [o for o in options or () if o not in schemas and not o.endswith("_schema")]
    listing = "".join(f"\n\t{o}" for o in shown)
    return ConfigError(
        group, f"no preset {name!r} (Could not find '{missing}')\nAvailable options in '{group}':{listing}"
    )


def _key_in_message(message: str, overrides: Sequence[str]) -> str:
    """The key of the override that ``message`` names (``loss`` for "Could not find 'loss/fp33'"), or of the one
    preset set to null (Hydra's "Config group override must be a string"), else ``overrides``."""
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o or o.startswith("~")]
    for key in keys:
        if f"'{key}'" in message or f"'{key}/" in message or f"'{key.replace('.', '/')}" in message:
            return key
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    for o in overrides:  # a preset given as a number, a null, a name too long for a file ("group override")
        key, _, value = o.partition("=")
        if "." in key or key.startswith("-") or not value:
            continue
        try:
            parsed = OverridesParser.create().parse_overrides([o])[0].value()
        except HydraException:
            continue
        if not isinstance(parsed, str) or len(value) > 200:
            return key.lstrip("+~")
    return "overrides"


def _root_of(e: Optional[BaseException]) -> Any:
    node = getattr(e, "parent_node", None)
    try:
        return node._get_root() if node is not None else None
    except Exception:  # noqa: BLE001 - no root: no culprit search
        return None


def unresolvable_key(cfg: Any, skip: Sequence[str] = ()) -> Optional[ConfigError]:
    """The first key of the user's config (Hydra's node left out) whose interpolation does not resolve, as a
    :class:`ConfigError` naming it (an unset ``${oc.env:...}``, ``run.name=${run.name}``, a missing key), or None."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.errors import OmegaConfBaseException

    def walk(node: Any, prefix: str) -> Optional[ConfigError]:
        keys: list = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
        for k in keys:
            name = f"{prefix}[{k}]" if isinstance(node, ListConfig) else f"{prefix}{'.' if prefix else ''}{k!s}"
            if name == "hydra" or name in skip:
                continue
            child = node._get_node(k)
            if child is None:
                continue
            if child._is_interpolation():
                try:
                    node[k]
                except OmegaConfBaseException as e:
                    return ConfigError(name, _first_line(e))
                except ValueError as e:  # a resolver's own error (HydraConfig not set)
                    return ConfigError(name, _first_line(e))
            elif isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_missing():
                found = walk(child, name)
                if found is not None:
                    return found
        return None

    return walk(cfg, "")


@contextmanager
def _as_in_the_job(master: Any) -> Iterator[None]:
    """``HydraConfig`` set from ``master``'s Hydra node, as in a job (``${hydra:...}`` in a value resolves as it
    would there); the previous one restored after. :func:`_job_folder_is` then sets ``hydra.runtime.output_dir``."""
    from hydra.core.hydra_config import HydraConfig

    instance = HydraConfig.instance()
    previous = instance.cfg
    instance.set_config(master)
    try:
        yield
    finally:
        instance.cfg = previous


def _job_folder_is(master: Any, run_dir: Path) -> None:
    """``hydra.runtime.output_dir`` of ``master`` (and of the ``HydraConfig`` set from it) is ``run_dir``."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    with read_write(master.hydra), open_dict(master.hydra):
        master.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(master)


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
    """Every value composed and resolved as the job would see it, before anything reads the config: a value that
    does not resolve, or a group replaced by a scalar (``run=${gkd.beta}``), is a :class:`ConfigError` naming it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    data = OmegaConf.to_container(master, resolve=False)
    if not isinstance(data, dict):
        raise ConfigError("config", f"must be a mapping, got {type(data).__name__}")
    data.pop("hydra", None)
    if not isinstance(data.get("run"), dict):
        raise ConfigError("run", f"must be a mapping (the run.* keys), got {str(data.get('run'))[:80]!r}")
    given = str(data["run"].get("output_dir", ""))
    with _as_in_the_job(master):
        try:
            if given and "${" not in given:
                run_dir = Path(given)
            elif run_dir is None:
                run_dir = run_dir_for(master, job_overrides, multirun)
            run_dir = Path(run_dir).expanduser().resolve()
        except OmegaConfBaseException as e:  # hydra.run.dir holds the overrides' text: name the key that fails
            raise composition_error(e, job_overrides) from None
        except (OSError, RuntimeError) as e:  # a path the OS cannot take (a name too long, a symlink loop)
            raise ConfigError("run.output_dir", f"not a usable folder ({type(e).__name__})") from None
        data["run"]["output_dir"] = str(run_dir)  # what the job folder's interpolation becomes in the job
        _job_folder_is(master, run_dir)
        found = unresolvable_key(master)
        if found is not None:
            raise found
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
    "composition_error",
    "unresolvable_key",
    "unknown_preset",
    "job_folder",
]
