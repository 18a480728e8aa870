"""Run folder and wandb tracking.

Run folder (one per run, ``run.output_dir``; contract in DESIGN.md)::

    config.yaml        resolved harness config (secrets redacted)
    metrics.jsonl      one JSON object per logging step, DESIGN metric names + "step", flushed line by line
    summary.json       status running|completed|failed, error, run_name, group, flat config, dtypes_seen,
                       versions, last_step, started_at, ended_at, wall_s
    captures/          step{S}_rank{R}.safetensors where capture is enabled
    wandb/             WANDB_DIR
    swift/             ms-swift's own output_dir (logging.jsonl, args.json)

wandb: ms-swift owns ``wandb.init``; the harness passes group, job type, tags, name, project, entity, mode and
dir through ``WANDB_*`` variables (:func:`wandb_env`), and inside the run adds its own config and
``define_metric`` summaries (:func:`attach_to_wandb_run`). No API key is ever written: keys whose name looks
like a secret are redacted from everything saved, and the key itself only travels in the inherited environment.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import socket
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional
from urllib.parse import urlparse

WANDB_MODES = ("online", "offline", "disabled")
# whole-name matches: api_key, WANDB_API_KEY, hub_token, token, secret, password (not max_tokens)
_SECRET_RE = re.compile(r"(^|[._-])(\w*api_?key|\w*_?token|\w*secret|\w*password)$", re.IGNORECASE)
REDACTED = "<redacted>"

#: HF ``logs`` keys -> DESIGN names (the rest of the harness keys already carry their DESIGN names).
HF_KEY_MAP = {"loss": "train/loss", "grad_norm": "train/grad_norm", "learning_rate": "train/learning_rate"}
HARNESS_PREFIXES = ("gkd/", "spot/", "rollout/")

#: wandb summaries: worst values of the counts and the spot-check errors.
WANDB_SUMMARIES = {
    "gkd/neg_loss_calls_total": "max",
    "gkd/nonfinite_calls_total": "max",
    "gkd/loss_calls_total": "max",
    "gkd/neg_loss_calls": "max",
    "gkd/neg_token_frac": "max",
    "gkd/min_token_jsd": "min",
    "spot/loss_abs_err": "max",
    "spot/loss_rel_err": "max",
    "spot/grad_rel_l2": "max",
    "spot/sign_mismatch": "max",
    "spot/param_grad_rel_l2": "max",
}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def redact(obj: Any) -> Any:
    """Copy of ``obj`` with the value of every secret-looking key (api_key, token, secret, password) redacted."""
    if isinstance(obj, Mapping):
        return {k: (REDACTED if _SECRET_RE.search(str(k)) and v not in (None, "") else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}`` (lists stay values)."""
    out: Dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def package_versions() -> Dict[str, str]:
    """Versions of the packages whose arithmetic the results depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("ms-swift", "torch", "transformers", "trl", "wandb"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunFolder:
    """The run folder of one run; every writer of the contract files goes through here."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # layout -------------------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def captures_dir(self) -> Path:
        return self.path / "captures"

    @property
    def wandb_dir(self) -> Path:
        return self.path / "wandb"

    @property
    def swift_dir(self) -> Path:
        return self.path / "swift"

    # files --------------------------------------------------------------------------------------------
    def create(self) -> "RunFolder":
        self.path.mkdir(parents=True, exist_ok=True)
        self.wandb_dir.mkdir(exist_ok=True)
        return self

    def write_config(self, yaml_text: str) -> None:
        self.config_path.write_text(yaml_text)

    def archive_previous_attempt(self) -> Optional[Path]:
        """Move an unfinished attempt's files to ``previous_attempts/<n>/`` so a restart starts clean.

        Training restarts from step 0, so appending to the old metrics stream (or a second wandb run in the same
        folder) would mix two attempts. Returns the archive folder, or None when there was nothing to move.
        """
        names = ("metrics.jsonl", "summary.json", "config.yaml", "captures", "wandb", "swift", "swift.log",
                 "command.json", "plugin_settings.json")
        present = [n for n in names if (self.path / n).exists()]
        if not present:
            return None
        root = self.path / "previous_attempts"
        n = 1
        while (root / str(n)).exists():
            n += 1
        target = root / str(n)
        target.mkdir(parents=True)
        for name in present:
            os.replace(self.path / name, target / name)
        return target

    def truncate_metrics(self, last_step: int) -> int:
        """Keep only the metrics lines up to ``last_step`` (a run resumed from that checkpoint); returns lines kept."""
        rows = [r for r in read_metrics(self.metrics_path) if int(r.get("step", 0)) <= last_step]
        tmp = self.metrics_path.with_name(".metrics.jsonl.tmp")
        with open(tmp, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.metrics_path)
        return len(rows)

    def read_summary(self) -> Optional[Dict[str, Any]]:
        try:
            return json.loads(self.summary_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def is_completed(self) -> bool:
        summary = self.read_summary()
        return bool(summary) and summary.get("status") == "completed"

    def start_summary(self, run_name: str, group: Optional[str], flat_config: Mapping[str, Any]) -> Dict[str, Any]:
        summary = {
            "status": "running", "error": None, "run_name": run_name, "group": group,
            "config": redact(dict(flat_config)), "dtypes_seen": {}, "versions": package_versions(),
            "last_step": 0, "started_at": now_iso(), "ended_at": None, "wall_s": None,
        }
        _atomic_write_json(self.summary_path, summary)
        return summary

    def update_summary(self, **fields: Any) -> Dict[str, Any]:
        """Merge ``fields`` into summary.json (nested dicts merged one level deep)."""
        summary = self.read_summary() or {}
        for k, v in fields.items():
            if isinstance(v, Mapping) and isinstance(summary.get(k), Mapping):
                summary[k] = {**summary[k], **v}
            else:
                summary[k] = v
        _atomic_write_json(self.summary_path, redact(summary))
        return summary

    def finish_summary(self, status: str, error: Optional[str] = None) -> Dict[str, Any]:
        summary = self.read_summary() or {}
        started = summary.get("started_at")
        wall = None
        if started:
            wall = (_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(started)).total_seconds()
        last = last_metrics_step(self.metrics_path)
        return self.update_summary(status=status, error=error, ended_at=now_iso(), wall_s=wall,
                                   last_step=max(int(summary.get("last_step") or 0), last))


class MetricsWriter:
    """Appends one JSON object per logging step to ``metrics.jsonl``; each line is flushed and fsynced."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(dict(record), default=float, allow_nan=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: str | os.PathLike) -> list[Dict[str, Any]]:
    """All complete lines of a metrics stream (a torn last line is skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def last_metrics_step(path: str | os.PathLike) -> int:
    steps = [int(r.get("step", 0)) for r in read_metrics(path)]
    return max(steps) if steps else 0


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
        warnings.warn("tracking.wandb.mode=online but the wandb server is unreachable: logging offline instead "
                      "(sync later with `wandb sync`)", RuntimeWarning, stacklevel=2)
        return "offline"
    return mode


def wandb_env(wandb_cfg: Mapping[str, Any], mode: str, run_dir: Path, run_name: str,
              job_type: str = "gkd-train") -> Dict[str, str]:
    """``WANDB_*`` variables that steer ms-swift's ``wandb.init`` (never contains a key)."""
    env = {"WANDB_MODE": mode, "WANDB_DIR": str(Path(run_dir) / "wandb"), "WANDB_NAME": run_name,
           "WANDB_JOB_TYPE": job_type, "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
    for key, var in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY"), ("group", "WANDB_RUN_GROUP")):
        if wandb_cfg.get(key):
            env[var] = str(wandb_cfg[key])
    tags = wandb_cfg.get("tags") or []
    if tags:
        env["WANDB_TAGS"] = ",".join(str(t) for t in tags)
    return env


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
