"""Credentials in Hydra's own files and folder names: the ``.hydra/`` files a run writes itself, a sweep's
``multirun.yaml`` and ``.hydra/`` files, and a run folder whose name holds a credential."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, List

from gkd_harness.harness.config.secrets import REDACTED, find_secret_keys, redact_name, redact_text, secret_values
from gkd_harness.harness.contract import CONFIG_FILE, HYDRA_DIR
from gkd_harness.harness.store.files import RunFolderError
from gkd_harness.harness.store.files import os_error as _os_error
from gkd_harness.harness.store.files import write_atomic as _write_atomic
from gkd_harness.harness.store.lock import describe_owner, host_name, owned_by_this_process, pid_alive, read_lock


def _override_secret_values(overrides: Iterable[str]) -> List[str]:
    out = []
    for item in overrides:
        key, sep, value = str(item).partition("=")
        if sep and find_secret_keys({key.lstrip("+~"): value}):
            out.append(value.strip("'\""))
    return out


def hydra_secret_values(hydra_dir: str | os.PathLike) -> List[str]:
    """Credential values a Hydra output folder holds: values under secret-looking keys in ``config.yaml`` and
    values of secret-looking ``key=value`` items in ``overrides.yaml``."""
    from omegaconf import OmegaConf

    hydra_dir = Path(hydra_dir)
    values: List[str] = []
    for name, pick in (
        (CONFIG_FILE, lambda c: secret_values(c)),
        ("overrides.yaml", lambda c: _override_secret_values(c or [])),
    ):
        path = hydra_dir / name
        if not path.is_file():
            continue
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        except Exception:  # noqa: BLE001 - an unparsable file is still scrubbed by key patterns
            continue
        values.extend(pick(loaded))
    return sorted(set(v for v in values if v and v != REDACTED))


def scrub_file(path: str | os.PathLike, values: Iterable[str] = ()) -> bool:
    """Redact credentials in one text file in place (atomic; :func:`gkd_harness.harness.config.secrets.redact_text`). Returns
    whether it changed."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _os_error(e, "read", path, path.parent) from None
    new = redact_text(text, values)
    if new == text:
        return False
    _write_atomic(path, new, path.parent)
    return True


def scrub_hydra_dir(hydra_dir: str | os.PathLike, extra_values: Iterable[str] = ()) -> List[Path]:
    """Redact credentials, in place, from every YAML file of a Hydra output folder (``.hydra/config.yaml``,
    ``overrides.yaml``, ``hydra.yaml``; also a sweep's ``multirun.yaml`` when given its folder): values under
    secret-looking keys, secret ``key=value`` overrides (also inside ``override_dirname`` and the output paths),
    and every occurrence of those values. Returns the files changed."""
    hydra_dir = Path(hydra_dir)
    values = [*hydra_secret_values(hydra_dir), *[str(v) for v in extra_values]]
    changed = []
    for path in sorted(hydra_dir.glob("*.yaml")):
        if scrub_file(path, values):
            changed.append(path)
    return changed


def save_hydra_files(run_dir: str | os.PathLike, task_cfg: Any, subdir: str = HYDRA_DIR) -> Path:
    """Write Hydra's three output files (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``, the same content
    Hydra writes) into ``run_dir/subdir``, credentials redacted. For an app run with ``hydra.output_subdir: null``:
    the harness then writes them itself once it owns the folder and knows it will run, so a skipped point's
    ``.hydra/`` stays untouched and no credential ever lands there. Call it inside the Hydra task function."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra_node = HydraConfig.get()
    out = Path(run_dir) / subdir
    overrides = [str(o) for o in hydra_node.overrides.task]
    values = [*secret_values(OmegaConf.to_container(task_cfg, resolve=False)), *_override_secret_values(overrides)]
    texts = {
        CONFIG_FILE: OmegaConf.to_yaml(task_cfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": OmegaConf.to_container(hydra_node)})),
        "overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(overrides)),
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _os_error(e, "create", out, Path(run_dir)) from None
    for name, text in texts.items():
        _write_atomic(out / name, redact_text(text, values), Path(run_dir))
    return out


def redacted_folder_name(path: str | os.PathLike, values: Iterable[str] = ()) -> Path:
    """``path`` with credentials redacted from its last component (Hydra's ``override_dirname``)."""
    path = Path(path)
    return path.with_name(redact_name(path.name, values))


def scrub_folder_name(path: str | os.PathLike, values: Iterable[str] = ()) -> Path:
    """Rename a run folder whose name holds a credential to its redacted name; returns the (new) path.

    Refuses (:class:`RunFolderError`) a folder owned by a live process, or a target that exists already.
    """
    path = Path(path)
    target = redacted_folder_name(path, values)
    if target == path or not path.exists():
        return path
    owner = read_lock(path)
    if (
        owner
        and not owned_by_this_process(path)
        and isinstance(owner.get("pid"), int)
        and (owner.get("host") != host_name() or pid_alive(owner["pid"], owner.get("pid_start")))
    ):
        raise RunFolderError(
            f"cannot rename run folder {redact_name(str(path), values)}: in use by {describe_owner(owner)}", path, path
        )
    if target.exists():
        raise RunFolderError(f"cannot rename run folder to {target}: it exists already", target, path)
    try:
        os.replace(path, target)
    except OSError as e:
        raise _os_error(e, "rename", path, path) from None
    return target


__all__ = [
    "hydra_secret_values",
    "scrub_file",
    "scrub_hydra_dir",
    "save_hydra_files",
    "redacted_folder_name",
    "scrub_folder_name",
]
