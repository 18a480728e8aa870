"""Which torch ``launch/setup_env.sh`` installs, and whether the one it got is usable (stdlib only: it runs in the
venv before torch is there).

    python launch/torch_choice.py install   # the CPU-only build where pip can get one, else the registry's build
    python launch/torch_choice.py check     # one line on the torch the venv has; exit 1 with a fix if none imports

The CPU-only build is preferred (about 0.2 GB instead of about 5 GB of CUDA libraries), but any build that imports
is accepted: a CUDA build of torch runs on a CPU. The order of attempts:

1. ``torch==PIN`` already importable in the venv: kept (a rerun changes nothing that works);
2. ``torch==PIN+cpu`` from the indexes pip is configured with (a local wheel, a CPU index the user set up);
3. ``torch==PIN+cpu`` from PyTorch's CPU index (one quick try, so a machine without it does not wait long);
4. ``torch==PIN`` from the registry: whatever build it serves (on Linux PyPI that is a CUDA build).

A torch that is installed but does not import (a half-finished earlier run) is reinstalled (``--force-reinstall``).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

PIN = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
FIX_HINT = (
    "fix: rm -rf .venv && bash launch/setup_env.sh; or install a torch for this platform into the venv "
    f"first (.venv/bin/pip install torch=={PIN} --index-url {CPU_INDEX}) and rerun"
)
# distributions that come with a CUDA build of torch (their size is reported with torch's)
_TORCH_FAMILY = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|pytorch-triton.*)$")


def build_of(version: str) -> str:
    """The kind of build a torch version string names: ``cpu`` (``2.13.0+cpu``), ``cuda`` (``2.13.0+cu130``),
    ``rocm`` (``2.13.0+rocm6.4``), ``xpu``, or ``registry`` (no local tag: the registry's default build, CUDA on
    Linux x86-64, CPU on macOS)."""
    _, sep, local = version.partition("+")
    if not sep:
        return "registry"
    if local == "cpu" or local.startswith("cpu"):
        return "cpu"
    if re.fullmatch(r"cu\d+", local):
        return "cuda"
    if local.startswith("rocm"):
        return "rocm"
    if local.startswith("xpu"):
        return "xpu"
    return local


def describe(version: str, size_bytes: Optional[int], cuda_built: Optional[str] = None) -> str:
    """The one line setup_env prints about the torch it got: silent praise for the CPU build, and for any other
    build what it is and how much disk it takes (it works on a CPU all the same)."""
    build = build_of(version)
    size = "" if size_bytes is None else f", {size_bytes / 1e9:.1f} GB with its libraries"
    if build == "cpu":
        return f"torch {version} (CPU-only build{size})"
    cuda = f" (CUDA {cuda_built})" if cuda_built else ""
    return (
        f"torch {version}{cuda}: no CPU-only build was available, so the registry's build is used{size}; "
        "it runs on a CPU too"
    )


def torch_family_size() -> Optional[int]:
    """Bytes on disk of the installed torch and the CUDA/triton distributions that come with it (None when torch
    is not installed)."""
    total, found = 0, False
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not _TORCH_FAMILY.match(name):
            continue
        found = found or name == "torch"
        for f in dist.files or ():
            try:
                total += Path(str(f.locate())).stat().st_size
            except OSError:
                pass
    return total if found else None


def attempts(pin: str = PIN) -> list[list[str]]:
    """The pip argument lists tried in order (each is ``pip install`` plus these), the CPU-only build first."""
    return [
        [f"torch=={pin}+cpu"],
        [f"torch=={pin}+cpu", "--extra-index-url", CPU_INDEX, "--retries", "1", "--timeout", "15"],
        [f"torch=={pin}"],
    ]


def _pip(args: Sequence[str], quiet: bool = False) -> int:
    """``pip install -qq args``; ``quiet`` also hides pip's errors (a CPU build that is not there is expected)."""
    return subprocess.call(
        [sys.executable, "-m", "pip", "install", "-qq", *args], stderr=subprocess.DEVNULL if quiet else None
    )


def _import_probe() -> tuple[Optional[str], str]:
    """(torch version or None, the error) from a fresh interpreter, so a broken install cannot take this one down."""
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if p.returncode == 0:
        return p.stdout.strip().splitlines()[-1], ""
    lines = (p.stderr or p.stdout).strip().splitlines()
    return None, (lines[-1] if lines else f"exit {p.returncode}")


def install(
    pin: str = PIN,
    pip: Callable[[Sequence[str], bool], int] = _pip,
    probe: Callable[[], tuple[Optional[str], str]] = _import_probe,
    installed: Optional[Callable[[], bool]] = None,
) -> int:
    """Installs torch by :func:`attempts` unless a working ``torch==pin`` is there; returns 0, or 1 when no
    attempt gave an importable torch. ``pip(args, quiet)`` runs ``pip install`` with the given args (``quiet``
    for the CPU attempts, whose failure is expected where no CPU build is at hand); ``probe`` reports the
    importable version; ``installed`` whether a torch distribution is there at all (one that does not import is
    reinstalled with ``--force-reinstall``)."""
    version, _ = probe()
    if version is not None and version.partition("+")[0] == pin:
        return 0
    repair = version is None and (installed or (lambda: _installed("torch")))()
    tries = attempts(pin)
    for i, args in enumerate(tries):
        extra = ["--force-reinstall", "--no-deps"] if repair else []
        quiet = i < len(tries) - 1  # only the last attempt's errors are worth showing
        if pip([*args, *extra], quiet) == 0:
            if repair:  # --no-deps reinstalled torch only; bring its requirements back too
                pip(list(args), quiet)
            return 0
    return 1


def _installed(name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def check() -> int:
    """Prints one line on the venv's torch unless it is the CPU build; 1 with the error and a fix when torch does not import."""
    try:
        import torch  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001 - any import failure means the same fix
        print(f"setup_env: torch cannot be imported ({type(e).__name__}: {e}); {FIX_HINT}", file=sys.stderr)
        return 1
    version = str(torch.__version__)
    if build_of(version) != "cpu":  # the CPU build needs no word: the closing line names its version
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        print(f"setup_env: {describe(version, torch_family_size(), cuda)}")
    return 0


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["install"]:
        rc = install()
        if rc:
            print(f"setup_env: no torch=={PIN} could be installed; {FIX_HINT}", file=sys.stderr)
        return rc
    if argv[:1] == ["check"]:
        return check()
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
