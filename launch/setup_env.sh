#!/usr/bin/env bash
# Creates .venv with gkd-harness and everything its CPU tests need. Idempotent.
#   bash launch/setup_env.sh            # then: . .venv/bin/activate
# torch is installed first and pinned: on a CPU machine an unpinned torch would pull a multi-GB CUDA build.
# On a GPU cluster install your CUDA torch first and then: pip install -e ".[gpu]" (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q "torch==2.13.0"
pip install -q -e ".[test,parallel-cpu]" "torch==2.13.0"
python - <<'PY'
import torch, swift, megatron.core, wandb, hydra
assert torch.__version__.endswith("+cpu"), f"expected the CPU torch, got {torch.__version__}"
print(f"gkd-harness env ready: torch {torch.__version__}, ms-swift {swift.__version__}, wandb {wandb.__version__}")
PY
