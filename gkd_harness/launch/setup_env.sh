#!/usr/bin/env bash
# Creates .venv with gkd-harness and everything its CPU tests need. Idempotent.
#   bash launch/setup_env.sh            # then: . .venv/bin/activate
# torch is installed first and pinned, the CPU-only build preferred (launch/torch_choice.py); a CUDA build is
# accepted where no CPU build is at hand (it runs on a CPU too). A rerun repairs a broken venv.
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
# a venv whose python no longer runs (moved, its base python upgraded, half-created) is made afresh
if ! .venv/bin/python -c "import pip" >/dev/null 2>&1; then
    python3 -m venv --clear .venv
fi
. .venv/bin/activate
# torch first: the CPU-only build where pip can get one, else the registry's build (one line says so and its
# size); a torch that does not import is reinstalled. The logic and its order: launch/torch_choice.py
python launch/torch_choice.py install
# -qq: errors only (the README's main command stays short); pip still fails loudly
pip install -qq -e ".[test,parallel-cpu]" "torch==2.13.0"
python launch/torch_choice.py check
# The table of ms-swift's flags that run.extra_args is checked against in milliseconds (harness/config/swift_flags.py),
# built once per installed version; megatron rlhf's only where its classes import (they need Transformer Engine)
python -W ignore -m gkd_harness.harness.launcher.extra_args >/dev/null 2>&1 \
    || echo "setup_env: the table of ms-swift's flags could not be built; the first run.extra_args check builds it" >&2
if python -c "import importlib.util as u, sys; sys.exit(u.find_spec('transformer_engine') is None)"; then
    python -W ignore -m gkd_harness.harness.launcher.extra_args --megatron >/dev/null 2>&1 || true
fi
python -W ignore - <<'PY'   # -W ignore: megatron's Transformer-Engine/Apex notices are expected on a CPU
import logging
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # a CUDA torch: "No CUDA runtime is found"
import torch, swift, megatron.core, wandb, hydra
print(f"gkd-harness env ready: torch {torch.__version__}, ms-swift {swift.__version__}, wandb {wandb.__version__}")
PY
