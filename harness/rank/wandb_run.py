"""Inside ms-swift's process: the harness's records of ms-swift's logs and its additions to the wandb run that
ms-swift opened (config, metric summaries)."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from harness.config.flat import flatten
from harness.contract import HARNESS_PREFIXES, HF_KEY_MAP, WANDB_SUMMARIES
from harness.config.secrets import redact


# ----------------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------------
def design_record(logs: Mapping[str, Any], step: int) -> Optional[Dict[str, Any]]:
    """The DESIGN-named subset of one HF ``logs`` dict plus ``step``; ``None`` for a log without any."""
    rec: Dict[str, Any] = {}
    for k, v in logs.items():
        name = HF_KEY_MAP.get(k, k if k.startswith(HARNESS_PREFIXES) else None)
        if name is None or v is None:
            continue
        try:
            rec[name] = float(v)
        except (TypeError, ValueError):
            continue
    if not rec:
        return None
    rec["step"] = int(step)
    return rec


def attach_to_wandb_run(harness_config: Mapping[str, Any]) -> bool:
    """Inside ms-swift's process: add the harness config and metric summaries to the active wandb run."""
    try:
        import wandb
    except ImportError:
        return False
    run = wandb.run
    if run is None:
        return False
    run.config.update({f"harness.{k}": v for k, v in flatten(redact(dict(harness_config))).items()},
                      allow_val_change=True)
    for name, summary in WANDB_SUMMARIES.items():
        run.define_metric(name, summary=summary)
    return True


def update_wandb_config(values: Mapping[str, Any]) -> None:
    """Add late-known values (dtypes seen at the loss boundary) to the active wandb run's config."""
    try:
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        wandb.run.config.update({f"harness.{k}": v for k, v in flatten(redact(dict(values))).items()},
                                allow_val_change=True)
