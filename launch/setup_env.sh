#!/usr/bin/env bash
# Creates .venv with gkd-harness and everything its CPU tests need. Idempotent.
#   bash launch/setup_env.sh            # then: . .venv/bin/activate
# torch is installed first and pinned: on a CPU machine an unpinned torch would pull a multi-GB CUDA build.
# On a GPU cluster install your CUDA torch first and then: pip install -e ".[gpu]" (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Headless Chromium renders the sign-off report in tests/analysis/test_report_browser.py (Debian package)
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
            || echo "setup_env: could not install chromium (the report's browser test needs it)" >&2
    else
        echo "setup_env: install Debian's chromium package for the report's browser test" >&2
    fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# -qq: errors only (the README's main command stays short); pip still fails loudly
pip install -qq "torch==2.13.0"
pip install -qq -e ".[test,parallel-cpu]" "torch==2.13.0"
python -W ignore - <<'PY'   # -W ignore: megatron's Transformer-Engine/Apex notices are expected on a CPU
import torch, swift, megatron.core, wandb, hydra
assert torch.__version__.endswith("+cpu"), f"expected the CPU torch, got {torch.__version__}"
print(f"gkd-harness env ready: torch {torch.__version__}, ms-swift {swift.__version__}, wandb {wandb.__version__}")
PY
