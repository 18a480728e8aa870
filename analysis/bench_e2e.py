"""``gkd-bench`` group ``e2e``: step time of a tiny real ``gkd-train`` run, monitoring on vs off (same seed)."""
from __future__ import annotations

from typing import Dict


def measure_e2e(monitor_on: bool, quick: bool, work_dir: str) -> Dict:
    try:
        import harness.train  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"gkd-train is not available yet (harness.train: {e})") from e
    raise NotImplementedError("e2e measurement not wired yet")
