#!/usr/bin/env bash
# Create the ms-swift 4.5.3 lane's environment (.venv-swift453): the version the seed bug report ran, next to the
# main venv's 4.6.x, so CI proves a run on both ends of the tested range (harness/launcher/swift_version.py).
#
#   bash launch/setup_swift453.sh                  (env at <repo>/.venv-swift453)
#   GKD_SWIFT453_VENV=/path bash launch/setup_swift453.sh
#
# torch is chosen as setup_env.sh chooses it (launch/torch_choice.py: the CPU-only build first) and stays on every
# pip command line; ms-swift 4.5.3 imports msgspec without declaring it. A stamp file records the package set; a
# second run with the same set only re-installs the project (editable, --no-deps) and re-checks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GKD_SWIFT453_VENV:-$ROOT/.venv-swift453}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

PKGS=("torch==2.13.0" "ms-swift==4.5.3" msgspec)
STAMP="$VENV/.gkd-swift453-stamp"
WANT="$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "[setup_swift453] $VENV is up to date ($WANT)"
else
  t0=$(date +%s)
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" "$ROOT/launch/torch_choice.py" install
  # the project with its dependencies (ms-swift pinned to 4.5.3 here), torch kept at the chosen build
  "$VENV/bin/python" -m pip install -qq "${PKGS[@]}" -e "$ROOT"
  "$VENV/bin/python" "$ROOT/launch/torch_choice.py" check
  echo "$WANT" > "$STAMP"
  echo "[setup_swift453] installed in $(( $(date +%s) - t0 )) s"
fi

# Always (cheap): the project itself, editable, without touching dependencies.
"$VENV/bin/python" -m pip install -qq -e "$ROOT" --no-deps "torch==2.13.0"

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
v = md.version("ms-swift")
assert v == "4.5.3", f"ms-swift {v} in the 4.5.3 lane"
print(f"[setup_swift453] ok: torch {torch.__version__}, ms-swift {v}")
PY
