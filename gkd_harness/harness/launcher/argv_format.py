"""How a config value is spelled on ms-swift's command line."""

from __future__ import annotations

from typing import Any


def cli_value(value: Any) -> str:
    """``True`` -> ``"true"``, ``False`` -> ``"false"``, anything else -> ``str(value)`` (ms-swift parses booleans
    from ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
