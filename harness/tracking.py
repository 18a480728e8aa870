"""Config trees as they may be shown or saved (one ``flatten``, secret detection and redaction) and wandb.

- :func:`flatten` is the harness's one flattener of config trees (analysis imports it from here).
- Secrets: :func:`find_secret_keys` lists credential-looking keys (``api_key``, ``token``, ``secret``,
  ``password``, at any depth) so validation can refuse them, :func:`secret_env_var` names the environment
  variable to use instead, and :func:`redact` / :func:`redact_text` / :func:`redact_name` remove their values from
  anything saved (config trees, text files, folder names). ``harness.run_folder.scrub_hydra_dir`` applies them
  to Hydra's own output files.
- wandb: ms-swift owns ``wandb.init``; the harness passes name, group, job type, tags, a stable run id with
  resume allowed, project, entity, mode and dir through ``WANDB_*`` variables (:func:`wandb_env`), and inside the
  run adds its own config and ``define_metric`` summaries (:func:`attach_to_wandb_run`). No API key is ever
  written: it only travels in the inherited environment.

The run folder itself (layout, lock, fingerprint, summary.json, metrics.jsonl) is ``harness.run_folder``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import socket
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence
from urllib.parse import urlparse

from harness.config import WANDB_MODES  # noqa: E402
# whole-name matches: api_key, WANDB_API_KEY, hub_token, token, secret, password (not max_tokens, token_budget)
_SECRET_RE = re.compile(r"(^|[._-])(\w*api_?key|\w*_?token|\w*secret|\w*password|\w*passwd)$", re.IGNORECASE)
REDACTED = "<redacted>"
#: What replaces a secret inside a file or folder name (no characters a shell or a file system would trip on).
REDACTED_NAME = "REDACTED"

#: HF ``logs`` keys -> DESIGN names (the rest of the harness keys already carry their DESIGN names).
from harness.metric_names import HARNESS_PREFIXES, HF_KEY_MAP, WANDB_SUMMARIES  # noqa: E402 - the one owner


# ----------------------------------------------------------------------------------------------------------
# config trees
# ----------------------------------------------------------------------------------------------------------
def _as_mapping(obj: Any) -> Optional[Mapping]:
    if isinstance(obj, Mapping):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return None


def flatten(tree: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested mapping (or dataclass tree) -> flat dict with dotted keys.

    ``{"loss": {"precision": "fp32"}, "run": {"extra_args": []}, "e": {}}`` ->
    ``{"loss.precision": "fp32", "run.extra_args": [], "e": {}}``: lists stay values, and so does an empty
    mapping (so a key that holds ``{}`` is not lost). The harness's one flattener.
    """
    out: Dict[str, Any] = {}
    for k, v in (_as_mapping(tree) or {}).items():
        key = f"{prefix}{k}"
        sub = _as_mapping(v)
        if sub is not None and len(sub):
            out.update(flatten(sub, key + "."))
        else:
            out[key] = {} if sub is not None else v
    return out


def is_secret_key(key: str) -> bool:
    """Does the last part of a (dotted) key look like a credential? ``tracking.wandb.api_key`` yes,
    ``monitor.spot_check.max_tokens`` no."""
    return bool(_SECRET_RE.search(str(key).split(".")[-1].lstrip("+~")))


def _present(value: Any) -> bool:
    return value not in (None, "") and not (isinstance(value, (list, tuple, dict)) and not value)


def redact(obj: Any) -> Any:
    """Copy of ``obj`` with the value of every secret-looking key (api_key, token, secret, password) redacted.

    Works on nested mappings (also dataclass trees), lists, and flat dicts with dotted keys.
    """
    mapping = _as_mapping(obj)
    if mapping is not None:
        return {k: (REDACTED if is_secret_key(k) and _present(v) else redact(v)) for k, v in mapping.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


def find_secret_keys(tree: Any) -> List[str]:
    """Dotted keys (any depth, lists indexed as ``key.0``) whose name looks like a credential and whose value is
    set (``None`` / ``""`` are not credentials). ``{"tracking": {"wandb": {"api_key": "x"}}}`` ->
    ``["tracking.wandb.api_key"]``."""
    found: List[str] = []

    def walk(node: Any, prefix: str) -> None:
        mapping = _as_mapping(node)
        if mapping is not None:
            for k, v in mapping.items():
                key = f"{prefix}{k}"
                if is_secret_key(str(k)) and _present(v):
                    found.append(key)
                else:
                    walk(v, key + ".")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}{i}.")

    walk(tree, "")
    return found


def secret_values(tree: Any) -> List[str]:
    """The string forms of the values held under secret-looking keys (what must never appear in a saved file)."""
    values: List[str] = []

    def walk(node: Any) -> None:
        mapping = _as_mapping(node)
        if mapping is not None:
            for k, v in mapping.items():
                if is_secret_key(str(k)) and _present(v):
                    values.extend(str(x) for x in (v if isinstance(v, (list, tuple)) else [v]))
                else:
                    walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)

    walk(tree)
    return sorted(set(values), key=lambda s: (-len(s), s))


def secret_overrides(argv: Iterable[str]) -> List[str]:
    """Keys of command-line overrides (``key=value``, ``+key=value``, ``++key=value``, sweeps ``key=a,b``) that
    look like credentials and carry a value: ``["+tracking.wandb.api_key=abc", "gkd.beta=0.5"]`` ->
    ``["tracking.wandb.api_key"]``. Checked on ``sys.argv`` before Hydra runs, a credential is refused before
    Hydra prints, logs or saves it (folder names, .hydra/, multirun.yaml, the launcher's console lines)."""
    keys = []
    for arg in argv:
        key, sep, value = str(arg).partition("=")
        key = key.lstrip("+~")
        if sep and not key.startswith("-") and is_secret_key(key) and value.strip("'\"") not in ("", "null"):
            keys.append(key)
    return keys


#: Where each kind of credential belongs instead of the config.
_SECRET_ENV_VARS = (("wandb", "WANDB_API_KEY"), ("hf", "HF_TOKEN"), ("hub", "HF_TOKEN"),
                    ("huggingface", "HF_TOKEN"), ("modelscope", "MODELSCOPE_API_TOKEN"))


def secret_env_var(key: str) -> str:
    """The environment variable that should carry the credential a config ``key`` tried to hold
    (``tracking.wandb.api_key`` -> ``WANDB_API_KEY``, ``model.hub_token`` -> ``HF_TOKEN``)."""
    parts = [p for p in re.split(r"[._-]", str(key).lower().lstrip("+~")) if p]
    for word, var in _SECRET_ENV_VARS:
        if word in parts:
            return var
    if "api" in parts or "wandb" in str(key).lower():
        return "WANDB_API_KEY"
    return "HF_TOKEN" if "token" in parts else "an environment variable read by the tool that needs it"


def secret_refusal(key: str) -> str:
    """One-line reason to refuse a credential in the config, pointing at the environment variable to use."""
    return (f"looks like a credential; credentials must not be in the config (it is saved in the run folder, "
            f".hydra/ and wandb): remove it and set {secret_env_var(key)} in the environment instead")


# override strings and folder names: "key=value" items whose key looks like a credential
_OVERRIDE_RE = re.compile(r"(?P<key>[+~]{0,2}[A-Za-z_][\w.\-]*)=(?P<value>\"[^\"]*\"|'[^']*'|[^,\s/\]\"']+)")
# YAML lines "  api_key: value"
_YAML_LINE_RE = re.compile(r"^(?P<head>[ \t]*(?:-[ \t]+)?(?P<key>[\w.\-]+)[ \t]*:[ \t]+)(?P<value>\S.*?)[ \t]*$",
                           re.MULTILINE)


def redact_text(text: str, values: Iterable[str] = (), marker: str = REDACTED) -> str:
    """``text`` with every credential removed: values of ``key=value`` items and ``key: value`` YAML lines whose
    key looks like a credential, and every whole-word occurrence of the given secret ``values`` (of 4+ characters;
    shorter ones are only caught by their key)."""
    def override(m: re.Match) -> str:
        return f"{m.group('key')}={marker}" if is_secret_key(m.group("key")) else m.group(0)

    def yaml_line(m: re.Match) -> str:
        if is_secret_key(m.group("key")) and m.group("value") not in ("null", "~", "''", '""'):
            return f"{m.group('head')}{marker}"
        return m.group(0)

    text = _OVERRIDE_RE.sub(override, text)
    text = _YAML_LINE_RE.sub(yaml_line, text)
    for v in sorted({str(v) for v in values if v is not None}, key=len, reverse=True):
        if len(v) >= 4:
            text = re.sub(rf"(?<![\w]){re.escape(v)}(?![\w])", marker, text)
    return text


def redact_name(name: str, values: Iterable[str] = ()) -> str:
    """A folder or run name (e.g. Hydra's ``override_dirname``) with credentials replaced by ``REDACTED``:
    ``"gkd.beta=0.5,+tracking.wandb.api_key=abc"`` -> ``"gkd.beta=0.5,+tracking.wandb.api_key=REDACTED"``."""
    return redact_text(name, values, marker=REDACTED_NAME)


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


def run_tags(precision: Optional[str] = None, beta_form: Optional[str] = None, experiment: Optional[str] = None,
             group: Optional[str] = None, extra: Sequence[Any] = ()) -> List[str]:
    """Tags a dashboard can filter on, in this order, without repeats or empties:
    ``original`` (``precision == "native"``, upstream arithmetic) or ``patched``; the precision; the β form; the
    experiment name; the group; then the user's ``tracking.wandb.tags``.
    ``run_tags("fp32", "paper", "smoke", "smoke")`` -> ``["patched", "fp32", "paper", "smoke"]``."""
    tags: List[str] = []
    if precision:
        tags.append("original" if precision == "native" else "patched")
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


def wandb_env(wandb_cfg: Mapping[str, Any], mode: str, run_dir: Path, run_name: str,
              job_type: str = "gkd-train", *, precision: Optional[str] = None, beta_form: Optional[str] = None,
              experiment: Optional[str] = None, fingerprint: Optional[str] = None) -> Dict[str, str]:
    """``WANDB_*`` variables that steer ms-swift's ``wandb.init`` (never contains a key).

    ``wandb_cfg``: ``tracking.wandb`` as a mapping (project, entity, group, tags). Sets WANDB_MODE, WANDB_DIR
    (``run_dir/wandb``), WANDB_NAME (credentials redacted), WANDB_JOB_TYPE, WANDB_RUN_GROUP, WANDB_TAGS
    (:func:`run_tags`), WANDB_RUN_ID (:func:`wandb_run_id`) and WANDB_RESUME=allow, WANDB_PROJECT/ENTITY when set.
    wandb 0.31 reads each of these in ``Settings.update_from_env_vars``; explicit ``wandb.init`` arguments win:
    HF's WandbCallback passes ``name=--run_name`` and ``project=$WANDB_PROJECT``, Megatron's passes ``name``,
    ``project`` and ``dir=--output_dir``.
    """
    env = {"WANDB_MODE": mode, "WANDB_DIR": str(Path(run_dir) / "wandb"), "WANDB_NAME": redact_name(str(run_name)),
           "WANDB_JOB_TYPE": job_type, "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
           "WANDB_RUN_ID": wandb_run_id(run_dir, fingerprint), "WANDB_RESUME": "allow"}
    for key, var in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY"), ("group", "WANDB_RUN_GROUP")):
        if wandb_cfg.get(key):
            env[var] = str(wandb_cfg[key])
    tags = run_tags(precision, beta_form, experiment, wandb_cfg.get("group"), list(wandb_cfg.get("tags") or []))
    if tags:
        env["WANDB_TAGS"] = ",".join(tags)
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
