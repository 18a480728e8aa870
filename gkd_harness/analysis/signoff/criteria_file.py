"""The sign-off criteria file, typed: a dataclass schema for ``configs/signoff/default.yaml``.

The YAML is the only home of the default values; the dataclasses give types and structure (no defaults here).
:func:`load_criteria` reads the shipped file, merges a user's file over it, and builds one frozen
:class:`SignoffCriteria`. Unknown keys, missing keys, wrong types and out-of-range values raise
:class:`~gkd_harness.analysis.sweep.records.UnusableInput` with one line naming the file and the full key, e.g.
``c.yaml: criteria key 'spot_tolerance.loss_rtol' must be a number >= 0, got -1``.

The shipped file is found next to the installed package (``importlib.resources`` on the ``configs``
package the wheel ships, ``gkd_harness.configs``), else in the source checkout.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Tuple

from gkd_harness.analysis.sweep.records import UnusableInput
from gkd_harness.harness.config.text import shown_value
from gkd_harness.harness.config.user_files import UserFileError, check_yaml, read_text

__all__ = [
    "SignoffCriteria",
    "CRITERIA_NAMES",
    "default_criteria_text",
    "load_criteria",
    "criteria_from_dict",
    "criteria_changes",
]

#: Packages that may hold the config tree (the wheel ships ``configs/`` as ``gkd_harness.configs``).
_CONFIG_PACKAGES = ("gkd_harness.configs", "configs")
_REPO_FILE = Path(__file__).resolve().parents[1] / "configs" / "signoff" / "default.yaml"


def _ge(x: float) -> dict:
    return {"min": x}


@dataclass(frozen=True)
class NoNegativePatched:
    enabled: bool
    required: bool
    max_negative_calls: int = field(metadata=_ge(0))


@dataclass(frozen=True)
class NoNonfinite:
    enabled: bool
    required: bool
    max_nonfinite_calls: int = field(metadata=_ge(0))
    metrics: Tuple[str, ...] = field(metadata={"nonempty": True})


@dataclass(frozen=True)
class SpotTolerance:
    enabled: bool
    required: bool
    loss_rtol: float = field(metadata=_ge(0))
    loss_atol: float = field(metadata=_ge(0))
    grad_rel_l2_max: float = field(metadata=_ge(0))
    param_grad_rel_l2_max: Optional[float] = field(metadata=_ge(0))
    max_sign_mismatches: int = field(metadata=_ge(0))
    min_checks_per_run: int = field(metadata=_ge(0))


@dataclass(frozen=True)
class OriginalShowsDefect:
    enabled: bool
    required: bool
    require: Literal["all", "any"]


@dataclass(frozen=True)
class BetaFormsUnchanged:
    enabled: bool
    required: bool
    betas: Tuple[float, ...] = field(metadata={"min": 0, "max": 1, "nonempty": True})
    rtol: float = field(metadata=_ge(0))
    atol: float = field(metadata=_ge(0))
    metrics: Tuple[str, ...] = field(metadata={"nonempty": True})


@dataclass(frozen=True)
class PrecisionsUnchangedInFp32:
    enabled: bool
    required: bool
    rtol: float = field(metadata=_ge(0))
    atol: float = field(metadata=_ge(0))
    metrics: Tuple[str, ...] = field(metadata={"nonempty": True})


@dataclass(frozen=True)
class NoFailedRuns:
    enabled: bool
    required: bool
    allow_incomplete: bool


@dataclass(frozen=True)
class PatchedNotWorse:
    enabled: bool
    required: bool
    margin: float = field(metadata=_ge(0))


@dataclass(frozen=True)
class CandidateCertified:
    enabled: bool
    required: bool
    quick: bool
    strict: bool


@dataclass(frozen=True)
class ReportSettings:
    first_steps: int = field(metadata=_ge(1))
    beta_curve_betas: Tuple[float, ...] = field(metadata={"min": 0, "max": 1, "nonempty": True})
    max_curve_panels: int = field(metadata=_ge(1))


@dataclass(frozen=True)
class SignoffCriteria:
    """The whole criteria file. Criteria sections are evaluated in this order."""

    no_negative_patched: NoNegativePatched
    no_nonfinite: NoNonfinite
    spot_tolerance: SpotTolerance
    original_shows_defect: OriginalShowsDefect
    beta_forms_unchanged: BetaFormsUnchanged
    precisions_unchanged_in_fp32: PrecisionsUnchangedInFp32
    no_failed_runs: NoFailedRuns
    patched_not_worse: PatchedNotWorse
    candidate_certified: CandidateCertified
    report: ReportSettings

    def to_dict(self) -> dict:
        """Plain nested dict (lists, not tuples), as the YAML writes it."""
        return _plain(dataclasses.asdict(self))


#: The criteria sections (each has ``enabled`` and ``required``), in evaluation order.
CRITERIA_NAMES = tuple(
    name
    for name, tp in typing.get_type_hints(SignoffCriteria).items()
    if dataclasses.is_dataclass(tp) and name != "report"
)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# ---------------------------------------------------------------------------
# building the typed object
# ---------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin is typing.Union:
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin in (tuple, Tuple):
        inner = args[0]
        if typing.get_origin(inner) is Literal:
            return f"a list of values in {_describe(inner)}"
        return "a list of " + {float: "numbers", int: "integers", str: "strings"}.get(inner, _describe(inner))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _bounds(meta: dict) -> str:
    parts = []
    if "min" in meta:
        parts.append(f">= {meta['min']:g}")
    if "max" in meta:
        parts.append(f"<= {meta['max']:g}")
    return (" " + " and ".join(parts)) if parts else ""


class _BadValue(Exception):
    pass


def _scalar(v: Any, tp: Any, meta: dict) -> Any:
    """Check one scalar against ``tp`` and the range in ``meta``; returns the value (ints widen to float)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        if v not in args:
            raise _BadValue
        return v
    if tp is bool:
        if not isinstance(v, bool):
            raise _BadValue
        return v
    if tp is str:
        if not isinstance(v, str):
            raise _BadValue
        return v
    if tp in (int, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (tp is int and not isinstance(v, int)):
            raise _BadValue
        if not math.isfinite(v) or ("min" in meta and v < meta["min"]) or ("max" in meta and v > meta["max"]):
            raise _BadValue
        return float(v) if tp is float else v
    raise TypeError(f"unsupported schema type {tp!r}")  # pragma: no cover - a schema bug


def _value(v: Any, tp: Any, meta: dict, key: str, src: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    try:
        if origin is typing.Union and type(None) in args:
            if v is None:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return _scalar(v, inner, meta)
        if origin in (tuple, Tuple):
            if not isinstance(v, (list, tuple)) or (meta.get("nonempty") and not v):
                raise _BadValue
            return tuple(_scalar(x, args[0], meta) for x in v)
        return _scalar(v, tp, meta)
    except _BadValue:
        want = _describe(tp) + _bounds(meta)
        if origin in (tuple, Tuple) and meta.get("nonempty"):
            want = "a non-empty " + want[2:] if want.startswith("a ") else want
        raise UnusableInput(f"{src}: criteria key {key!r} must be {want}, got {shown_value(v)}") from None


def _build(cls: type, data: Any, prefix: str, src: str) -> Any:
    where = prefix[:-1] if prefix else "(top level)"
    if not isinstance(data, dict):
        raise UnusableInput(f"{src}: criteria key {where!r} must be a mapping, got {shown_value(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls, globalns=vars(sys.modules[__name__]))
    for k in data:
        if k not in fields:
            raise UnusableInput(
                f"{src}: unknown criteria key {shown_value(prefix + str(k))} (known: {', '.join(fields)})"
            )
    values = {}
    for name, f in fields.items():
        key = prefix + name
        if name not in data:
            raise UnusableInput(f"{src}: criteria key {key!r} missing")
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            values[name] = _build(tp, data[name], key + ".", src)
        else:
            values[name] = _value(data[name], tp, dict(f.metadata), key, src)
    return cls(**values)


def criteria_from_dict(data: Any, src: str = "criteria") -> SignoffCriteria:
    """A complete criteria mapping (every key present) -> :class:`SignoffCriteria`, validated."""
    return _build(SignoffCriteria, data, "", src)


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------


def default_criteria_text() -> tuple:
    """``(where, text)`` of the shipped ``configs/signoff/default.yaml``: from the installed config package
    (``gkd_harness.configs``, the wheel's copy of ``configs/``) when there is one, else from the source
    checkout next to ``analysis/``."""
    from importlib.resources import files

    for package in _CONFIG_PACKAGES:
        try:
            res = files(package).joinpath("signoff").joinpath("default.yaml")  # one part a call: Python 3.10
            if res.is_file():
                return str(res), res.read_text()
        except (ModuleNotFoundError, TypeError, ValueError, OSError):
            continue
    try:
        return str(_REPO_FILE), _REPO_FILE.read_text()
    except OSError as e:
        raise UnusableInput(f"the default criteria file configs/signoff/default.yaml cannot be read ({e})") from None


def _parse_yaml(text: str, src: str) -> dict:
    """YAML text -> dict with YAML 1.2 floats (``1e-4`` is a number, as in Hydra's configs)."""
    import yaml
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.create(text), resolve=False) if text.strip() else {}
    except (yaml.YAMLError, ValueError) as e:
        raise UnusableInput(f"criteria file {src}: not valid YAML ({str(e).splitlines()[0]})") from None
    except Exception as e:  # omegaconf's own errors (a scalar or list at the top level)
        raise UnusableInput(f"criteria file {src}: expected a mapping ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise UnusableInput(f"criteria file {src}: expected a mapping")
    return data


def _merge(base: dict, override: dict) -> dict:
    """``override`` over ``base``, mapping by mapping (unknown keys are kept: the schema rejects them)."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = _merge(base[k], v) if isinstance(base.get(k), dict) and isinstance(v, dict) else v
    return out


def load_criteria(
    path: Optional[Path] = None, plan: Optional[dict] = None, plan_src: str = "the plan"
) -> SignoffCriteria:
    """The shipped criteria, with the values the sweep's plan declares (``plan``: the experiment preset's
    ``hydra.callbacks.sweep_status.plan``, recorded in ``sweep_manifest.json``) merged over them, and the file at
    ``path`` (if any) over both; validated and typed (an unknown or bad key of the plan is named like a file's)."""
    src, text = default_criteria_text()
    data = _parse_yaml(text, src)
    if plan:
        if not isinstance(plan, dict):
            raise UnusableInput(f"{plan_src}: the declared criteria ('signoff') must be a mapping")
        data = _merge(data, plan)
        src = plan_src
    cfg = criteria_from_dict(data, src)
    if path is None:
        return cfg
    try:  # a regular file of bounded size, alias-free YAML (harness/config/user_files.py, issue 48 item 6)
        user_text = read_text(path)
        check_yaml(user_text, path)
    except FileNotFoundError:
        raise UnusableInput(f"criteria file {path} does not exist") from None
    except UserFileError as e:
        raise UnusableInput(f"criteria file {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UnusableInput(f"criteria file {path} cannot be read ({e})") from None
    return criteria_from_dict(_merge(data, _parse_yaml(user_text, str(path))), str(path))


def _flat(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def criteria_changes(cfg: SignoffCriteria, base: SignoffCriteria) -> list:
    """``[(key, base value, cfg value)]`` for every key (dotted, e.g. ``spot_tolerance.loss_rtol``) whose value in
    ``cfg`` differs from ``base``, in the file's order: each changed threshold or switch."""
    old, new = _flat(base.to_dict()), _flat(cfg.to_dict())
    return [(k, old[k], v) for k, v in new.items() if old.get(k) != v]
