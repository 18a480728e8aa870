"""The ms-swift versions the harness is tested with, and the check ``gkd-train`` makes before launch.

Tested: 4.5.x (CI's lane, ``launch/setup_swift453.sh``: ms-swift 4.5.3, the version the seed bug report ran) and
4.6.x (the main environment). ``pyproject.toml``'s ``ms-swift`` requirement is this range
(``tests/harness/launcher/test_swift_version.py`` checks the two agree).

What differs between them and how the argv handles it (``gkd_harness.harness.launcher.swift_argv``: every such argument is
set explicitly, so both versions get the same run):

* ``dataloader_persistent_workers`` (HF): 4.5.x keeps its default ``True`` with ``--dataloader_num_workers 0``,
  and torch's DataLoader then raises "persistent_workers option needs num_workers > 0"; 4.6.0 resets it
  (``swift/trainers/arguments.py``). The HF argv passes ``--dataloader_persistent_workers false`` with
  ``--dataloader_num_workers 0`` on both.
* ``calculate_per_token_loss`` (Megatron): 4.5.x leaves it ``False`` for GKD and its trainer returns the
  CP-reduced mean (``cp_reduce``); 4.6.x forces it ``True`` and returns the sum (``megatron_args.py``,
  ``megatron/trainers/gkd_trainer.py``). Each version's trainer matches its own value, so the argv passes that
  value explicitly (:func:`version_args`): ``false`` on 4.5.x, ``true`` on 4.6.x and later.

Outside the range ``gkd-train`` stops before launch with one line naming ``run.allow_untested_swift`` (exit 2);
``run.allow_untested_swift=true`` goes on, and the run folder's ``summary.json`` (``versions``), the wandb config
and the sign-off report record the version either way (``gkd_harness.harness.store.provenance.package_versions``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Optional

#: major.minor series of ms-swift the harness is tested with (one home: pyproject's requirement is checked against it)
TESTED_SWIFT_SERIES = ("4.5", "4.6")
SWIFT_DIST = "ms-swift"
ALLOW_KEY = "run.allow_untested_swift"


def installed_swift_version() -> Optional[str]:
    """The installed ms-swift distribution's version, or None when it is not installed."""
    try:
        return version(SWIFT_DIST)
    except PackageNotFoundError:
        return None


def series(ver: str) -> str:
    """``"4.5.3"`` -> ``"4.5"`` (major.minor; a pre-release or local tag is ignored)."""
    parts = ver.split("+")[0].split(".")
    digits = ["".join(ch for ch in p if ch.isdigit()) or "0" for p in parts[:2]]
    return ".".join(digits + ["0"] * (2 - len(digits)))


def is_tested(ver: str) -> bool:
    return series(ver) in TESTED_SWIFT_SERIES


def untested_problem(ver: Optional[str], allow_untested: bool) -> Optional[str]:
    """The one-line refusal for ``ver`` (None when it is tested, or allowed by ``run.allow_untested_swift``)."""
    if ver is None:
        return (
            f"{SWIFT_DIST} is not installed: pip install 'gkd-harness' (it requires {SWIFT_DIST} "
            f"{' or '.join(s + '.x' for s in TESTED_SWIFT_SERIES)})"
        )
    if is_tested(ver) or allow_untested:
        return None
    tested = " and ".join(s + ".x" for s in TESTED_SWIFT_SERIES)
    return (
        f"{SWIFT_DIST} {ver} is installed; the harness is tested with {tested}: install one of them, or set "
        f"{ALLOW_KEY}=true to run on {ver} anyway"
    )


def version_args(ver: Optional[str], megatron: bool) -> list[str]:
    """The arguments whose ms-swift default differs between the tested series, set explicitly for ``ver`` (the
    installed version when None)."""
    ver = installed_swift_version() if ver is None else ver
    if not megatron:
        return ["--dataloader_num_workers", "0", "--dataloader_persistent_workers", "false"]
    per_token = ver is None or series(ver) != "4.5"
    return ["--calculate_per_token_loss", "true" if per_token else "false"]


def check_swift_version(allow_untested: bool, ver: Optional[str] = None) -> Optional[str]:
    """Raise :class:`~gkd_harness.harness.config.schema.ConfigError` naming :data:`ALLOW_KEY` for an untested (or missing)
    ms-swift; returns the installed version. ``ver`` defaults to the installed distribution's."""
    from gkd_harness.harness.config.schema import ConfigError

    ver = installed_swift_version() if ver is None else ver
    problem = untested_problem(ver, allow_untested)
    if problem:
        raise ConfigError(ALLOW_KEY, problem)
    return ver
