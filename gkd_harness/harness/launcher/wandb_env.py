"""The WANDB_* variables that steer ms-swift's own ``wandb.init`` (name, group, job type, tags, a stable run id,
mode, dir), and the online/offline decision. No API key is ever written: it only travels in the inherited
environment."""

from __future__ import annotations

import hashlib
import os
import socket
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence
from urllib.parse import urlparse

from gkd_harness.harness.config.schema import WANDB_MODES
from gkd_harness.harness.config.secrets import redact_name
from gkd_harness.harness.contract import WANDB_DIR, role_of

#: wandb's variable naming a live wandb service (``wandb.env.SERVICE``): a process with a wandb run sets it, and its
#: children join that service instead of starting their own.
WANDB_SERVICE_ENV = "WANDB_SERVICE"


# ----------------------------------------------------------------------------------------------------------
# wandb
# ----------------------------------------------------------------------------------------------------------
def wandb_reachable(base_url: Optional[str] = None, timeout: float = 3.0) -> bool:
    """Can we open a TCP connection to the wandb server (``WANDB_BASE_URL`` or api.wandb.ai)?"""
    url = urlparse(base_url or os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_wandb_mode(mode: str, reachable=wandb_reachable) -> str:
    """The mode to run with: online falls back to offline (one warning) when wandb is unreachable."""
    if mode not in WANDB_MODES:
        raise ValueError(f"tracking.wandb.mode must be one of {WANDB_MODES}, got {mode!r}")
    if mode == "online" and not reachable():
        warnings.warn(
            "tracking.wandb.mode=online but the wandb server is unreachable: logging offline instead "
            "(sync later with `wandb sync`)",
            RuntimeWarning,
            stacklevel=2,
        )
        return "offline"
    return mode


def wandb_run_id(run_dir: str | os.PathLike, fingerprint: Optional[str] = None) -> str:
    """Stable wandb run id of a run folder: 16 hex characters of sha256(absolute path [+ config fingerprint]).

    Every attempt in the same folder (a retry, a ``run.resume``) gets the same id, so with ``WANDB_RESUME=allow``
    it continues the same wandb run. Passing the config ``fingerprint`` gives a run replaced by
    ``run.overwrite=true`` with a different config a new id (it is a different run).
    """
    key = str(Path(run_dir).expanduser().resolve())
    if fingerprint:
        key += "\0" + str(fingerprint)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _tag(value: Any) -> str:
    # WANDB_TAGS is split on ","; wandb refuses tags longer than 64 characters
    return str(value).replace(",", ";").strip()[:64]


def run_tags(
    precision: Optional[str] = None,
    beta_form: Optional[str] = None,
    experiment: Optional[str] = None,
    group: Optional[str] = None,
    extra: Sequence[Any] = (),
) -> List[str]:
    """Tags a dashboard can filter on, in this order, without repeats or empties:
    the role (``original``, ``patched`` or ``reference``: :func:`gkd_harness.harness.contract.role_of`); the precision; the β form; the
    experiment name; the group; then the user's ``tracking.wandb.tags``.
    ``run_tags("fp32", "paper", "smoke", "smoke")`` -> ``["patched", "fp32", "paper", "smoke"]``."""
    tags: List[str] = []
    if precision:
        tags.append(role_of(precision))
    for value in (precision, beta_form, experiment, group, *extra):
        t = _tag(value) if value not in (None, "") else ""
        if t and t not in tags:
            tags.append(t)
    return tags


def experiment_name() -> Optional[str]:
    """The ``experiment=`` choice of the running Hydra app (``None`` outside Hydra or without one)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get("experiment")
    except Exception:  # noqa: BLE001 - not inside a Hydra app
        return None
    return str(choice) if choice not in (None, "null") else None


def wandb_env(
    wandb_cfg: Mapping[str, Any],
    mode: str,
    run_dir: Path,
    run_name: str,
    job_type: str = "gkd-train",
    *,
    precision: Optional[str] = None,
    beta_form: Optional[str] = None,
    experiment: Optional[str] = None,
    fingerprint: Optional[str] = None,
    loss_tags: Sequence[str] = (),
) -> Dict[str, str]:
    """``WANDB_*`` variables that steer ms-swift's ``wandb.init`` (never contains a key).

    ``wandb_cfg``: ``tracking.wandb`` as a mapping (project, entity, group, tags). Sets WANDB_MODE, WANDB_DIR
    (``run_dir/wandb``), WANDB_NAME (credentials redacted), WANDB_JOB_TYPE, WANDB_RUN_GROUP, WANDB_TAGS
    (:func:`run_tags`), WANDB_RUN_ID (:func:`wandb_run_id`) and WANDB_RESUME=allow, WANDB_PROJECT/ENTITY when set.
    wandb 0.31 reads each of these in ``Settings.update_from_env_vars``; explicit ``wandb.init`` arguments win:
    HF's WandbCallback passes ``name=--run_name`` and ``project=$WANDB_PROJECT``, Megatron's passes ``name``,
    ``project`` and ``dir=--output_dir``.
    """
    env = {
        "WANDB_MODE": mode,
        "WANDB_DIR": str(Path(run_dir) / WANDB_DIR),
        "WANDB_NAME": redact_name(str(run_name)),
        "WANDB_JOB_TYPE": job_type,
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_RUN_ID": wandb_run_id(run_dir, fingerprint),
        "WANDB_RESUME": "allow",
    }
    for key, var in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY"), ("group", "WANDB_RUN_GROUP")):
        if wandb_cfg.get(key):
            env[var] = str(wandb_cfg[key])
    # loss_tags: a candidate's name and sha256 prefix (gkd_harness.harness.loss.candidate.candidate_tags), before the user's tags
    tags = run_tags(
        precision, beta_form, experiment, wandb_cfg.get("group"), [*loss_tags, *list(wandb_cfg.get("tags") or [])]
    )
    if tags:
        env["WANDB_TAGS"] = ",".join(tags)
    return env
