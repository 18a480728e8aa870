"""Credentials: detect them in config trees, argv and overrides, and redact them from anything saved.

:func:`find_secret_keys` lists credential-looking keys (``api_key``, ``token``, ``secret``, ``password``, at any
depth) so validation can refuse them, :func:`secret_env_var` names the environment variable to use instead, and
:func:`redact` / :func:`redact_text` / :func:`redact_name` remove their values from anything saved (config trees,
text files, folder names). ``gkd_harness.harness.store.hydra_files.scrub_hydra_dir`` applies them to Hydra's own output files.

A value is a credential by its key (``hub_token``) or by its form, whatever key or flag holds it
(:func:`looks_like_credential`: a password in a URL ``scheme://user:password@host``, and the common token formats:
Hugging Face ``hf_...``, OpenAI-style ``sk-...``, wandb, GitHub ``ghp_...`` / ``github_pat_...``, GitLab
``glpat-...``, AWS ``AKIA...`` / ``ASIA...``, Slack ``xoxb-...``, Google, npm, PyPI, Stripe, JWTs, PEM keys):
``run.dataset=hf_...`` is refused and redacted as ``model.hub_token=hf_...`` is.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List

from gkd_harness.harness.config.flat import _as_mapping

# whole-name matches: api_key, WANDB_API_KEY, hub_token, token, secret, password (not max_tokens, token_budget)
_SECRET_RE = re.compile(r"(^|[._-])(\w*api_?key|\w*_?token|\w*secret|\w*password|\w*passwd)$", re.IGNORECASE)
REDACTED = "<redacted>"
#: What replaces a secret inside a file or folder name (no characters a shell or a file system would trip on).
REDACTED_NAME = "REDACTED"


#: credential-looking text whatever key or flag holds it, by form: a Hugging Face token (``hf_`` + 34 letters and
#: digits), an OpenAI-style key (``sk-...``), a wandb v1 key, GitHub tokens (classic ``ghp_`` / ``gho_`` / ``ghu_`` /
#: ``ghs_`` / ``ghr_`` and fine-grained ``github_pat_``), a GitLab token (``glpat-``), an AWS access key id
#: (``AKIA`` / ``ASIA`` + 16), Slack tokens (``xoxa-`` / ``xoxb-`` / ``xoxp-`` ...), a Google API key (``AIza``),
#: npm and PyPI tokens, a Stripe live key, a JSON web token, a PEM private key
_CREDENTIAL_TOKEN = "|".join(
    (
        r"hf_[A-Za-z0-9]{16,}",
        r"sk-[A-Za-z0-9_-]{16,}",
        r"wandb_v1_\w+",
        r"gh[pousr]_[A-Za-z0-9]{20,}",
        r"github_pat_[A-Za-z0-9_]{20,}",
        r"glpat-[A-Za-z0-9_-]{20,}",
        r"(?:AKIA|ASIA)[0-9A-Z]{16}",
        r"xox[abposr]-[A-Za-z0-9-]{10,}",
        r"AIza[0-9A-Za-z_-]{35}",
        r"npm_[A-Za-z0-9]{36}",
        r"pypi-[A-Za-z0-9_-]{50,}",
        r"[rs]k_live_[0-9A-Za-z]{20,}",
        r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        r"-----BEGIN[A-Z ]*PRIVATE KEY-----",
    )
)
#: a password in a URL's user part, whatever the scheme: ``https://user:PASSWORD@host/...`` (group ``secret``: the
#: ``user:password`` part; ``user@host`` alone, as in ``git@github.com``, is no credential)
_URL_PASSWORD = r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<secret>[^\s/?#@:]*:[^\s/?#@]+)@"
_CREDENTIAL_IN_TEXT_RE = re.compile(rf"(?<![\w-])(?:{_CREDENTIAL_TOKEN})(?![\w-])|{_URL_PASSWORD}")
#: a whole value of 40 hex digits: a wandb API key, but also a git commit (summary.json's provenance), so it counts
#: only where a flag's value is checked (``run.extra_args``), never when a config tree or a text is redacted
_HEX40_RE = re.compile(r"^[0-9a-f]{40}$")


def looks_like_credential(value: Any, hex40: bool = False) -> bool:
    """Is ``value`` (a string) a credential, or does it hold one? A token of a known form anywhere in it
    (``"hf_" + 34 alphanumerics``, ``sk-...``, ``ghp_...``, ``AKIA...``, ...) or a URL with a password
    (``https://user:pw@host``); with ``hex40`` also a whole value of 40 hex digits (a wandb key, as a flag's
    value)."""
    if not isinstance(value, str):
        return False
    return bool(_CREDENTIAL_IN_TEXT_RE.search(value) or (hex40 and _HEX40_RE.match(value.strip().strip("'\""))))


def _strings(value: Any) -> List[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


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
    if looks_like_credential(obj):
        return redact_text(obj)
    return obj


def find_secret_keys(tree: Any) -> List[str]:
    """Dotted keys (any depth, lists indexed as ``key.0``) whose name looks like a credential and whose value is
    set (``None`` / ``""`` are not credentials), or whose string value (or a string in its list) looks like one
    (:func:`looks_like_credential`). ``{"tracking": {"wandb": {"api_key": "x"}}, "run": {"dataset": "hf_..."}}``
    -> ``["tracking.wandb.api_key", "run.dataset"]``."""
    found: List[str] = []

    def walk(node: Any, prefix: str) -> None:
        mapping = _as_mapping(node)
        if mapping is not None:
            for k, v in mapping.items():
                key = f"{prefix}{k}"
                if (is_secret_key(str(k)) and _present(v)) or any(map(looks_like_credential, _strings(v))):
                    found.append(key)
                else:
                    walk(v, key + ".")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{prefix}{i}.")

    walk(tree, "")
    return found


def secret_values(tree: Any) -> List[str]:
    """The string forms of the values held under secret-looking keys, and of every credential-looking string
    (:func:`looks_like_credential`): what must never appear in a saved file."""
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
        elif looks_like_credential(node):
            values.append(node)

    walk(tree)
    return sorted(set(values), key=lambda s: (-len(s), s))


_FLAG_RE = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")


def secret_overrides(argv: Iterable[str]) -> List[str]:
    """Keys of command-line overrides (``key=value``, ``+key=value``, ``++key=value``, sweeps ``key=a,b``) that
    carry a credential: a credential-looking key with a value, a credential-looking value under any key
    (:func:`looks_like_credential`), or a credential flag inside a list value (``run.extra_args=[--hub_token,x]``):
    ``["+tracking.wandb.api_key=abc", "gkd.beta=0.5", "run.dataset=hf_..."]`` ->
    ``["tracking.wandb.api_key", "run.dataset"]``. Checked on ``sys.argv`` before Hydra runs, a credential is
    refused before Hydra prints, logs or saves it (folder names, .hydra/, multirun.yaml, the launcher's console
    lines)."""
    keys = []
    for arg in argv:
        key, sep, value = str(arg).partition("=")
        key = key.lstrip("+~")
        if not sep or key.startswith("-"):
            continue
        secret_key = is_secret_key(key) and value.strip("'\"") not in ("", "null")
        secret_flag = any(is_secret_key(m.replace("-", "_")) for m in _FLAG_RE.findall(value))
        if secret_key or secret_flag or looks_like_credential(value):
            keys.append(key)
    return keys


#: Where each kind of credential belongs instead of the config.
_SECRET_ENV_VARS = (
    ("wandb", "WANDB_API_KEY"),
    ("hf", "HF_TOKEN"),
    ("hub", "HF_TOKEN"),
    ("huggingface", "HF_TOKEN"),
    ("modelscope", "MODELSCOPE_API_TOKEN"),
)


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
    if not is_secret_key(key):
        return (
            "holds a value that looks like a credential (a token, or a password in a URL); credentials must not be "
            "in the config (it is saved in the run folder, .hydra/ and wandb): remove it, and give it to the tool "
            "that needs it through the environment instead (HF_TOKEN, WANDB_API_KEY, a ~/.netrc for a URL)"
        )
    return (
        f"looks like a credential; credentials must not be in the config (it is saved in the run folder, "
        f".hydra/ and wandb): remove it and set {secret_env_var(key)} in the environment instead"
    )


# override strings and folder names: "key=value" items whose key looks like a credential
_OVERRIDE_RE = re.compile(r"(?P<key>[+~]{0,2}[A-Za-z_][\w.\-]*)=(?P<value>\"[^\"]*\"|'[^']*'|[^,\s/\]\"']+)")
# YAML lines "  api_key: value"
_YAML_LINE_RE = re.compile(
    r"^(?P<head>[ \t]*(?:-[ \t]+)?(?P<key>[\w.\-]+)[ \t]*:[ \t]+)(?P<value>\S.*?)[ \t]*$", re.MULTILINE
)


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
    text = _CREDENTIAL_IN_TEXT_RE.sub(lambda m: f"{m['scheme']}{marker}@" if m["secret"] else marker, text)
    for v in sorted({str(v) for v in values if v is not None}, key=len, reverse=True):
        if len(v) >= 4:
            text = re.sub(rf"(?<![\w]){re.escape(v)}(?![\w])", marker, text)
    return text


def redact_name(name: str, values: Iterable[str] = ()) -> str:
    """A folder or run name (e.g. Hydra's ``override_dirname``) with credentials replaced by ``REDACTED``:
    ``"gkd.beta=0.5,+tracking.wandb.api_key=abc"`` -> ``"gkd.beta=0.5,+tracking.wandb.api_key=REDACTED"``."""
    return redact_text(name, values, marker=REDACTED_NAME)
