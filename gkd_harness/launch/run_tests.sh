#!/usr/bin/env bash
# The test command (README, CI): the main suite in .venv, then the vLLM CPU lane in .venv-vllm.
#   bash launch/run_tests.sh [pytest args for the main suite]   # after the gate: ruff check, ruff format --check, mypy
#   bash launch/run_tests.sh --fast [pytest args]   # the fast lane: everything but the slow end-to-end trainings
#                                                   # and the multi-process gloo tests (-m "$FAST"); no vLLM lane
# The lane runs when .venv-vllm exists (bash launch/setup_vllm_cpu.sh builds it); with GKD_REQUIRE_VLLM_LANE=1
# (set by CI) a missing lane is an error instead of a note. CI runs the full suite (no --fast).
set -uo pipefail
cd "$(dirname "$0")/.."
FAST="not slow and not parallel and not vllm"
fast=0
args=()
for a in "$@"; do
    if [ "$a" = "--fast" ]; then fast=1; else args+=("$a"); fi
done
export HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
py=.venv/bin/python
[ -x "$py" ] || py=python
# the entry points (gkd-train, gkd-analyze, ...) the tests start are those of .venv, from a fresh shell too
[ -d .venv/bin ] && export PATH="$PWD/.venv/bin:$PATH"
# The gate first: lint, format and types (pyproject's [tool.ruff] and [tool.mypy]); a failure stops here.
"$py" -m ruff check . && "$py" -m ruff format --check . && "$py" -m mypy || { echo "run_tests: the lint/type gate failed (ruff check, ruff format --check, mypy)" >&2; exit 1; }
if [ "$fast" = 1 ]; then
    # two workers (pytest-xdist; GKD_FAST_WORKERS to change), one torch thread each unless OMP_NUM_THREADS is set
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$py" -m pytest --durations=15 -n "${GKD_FAST_WORKERS:-2}" -m "$FAST" \
        ${args[@]+"${args[@]}"}
    rc=$?
    echo "run_tests: fast lane (-m \"$FAST\"); the full suite is bash launch/run_tests.sh"
    exit "$rc"
fi
# the whole suite on 2 pytest-xdist workers as well (GKD_WORKERS to change; 1 runs it in one process): the slow and
# the parallel (torchrun, gloo) tests pass side by side; one torch thread per worker unless OMP_NUM_THREADS is set
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$py" -m pytest --durations=15 -n "${GKD_WORKERS:-2}" ${args[@]+"${args[@]}"}   # the 15 slowest close the report
rc=$?
if [ -x .venv-vllm/bin/python ]; then
    PATH="$PWD/.venv-vllm/bin:$PATH" .venv-vllm/bin/python -m pytest -m vllm tests/vllm -p no:cacheprovider
    lane=$?
    [ "$lane" -ne 0 ] && rc=$lane
elif [ "${GKD_REQUIRE_VLLM_LANE:-0}" = "1" ]; then
    echo "run_tests: .venv-vllm is missing; run bash launch/setup_vllm_cpu.sh" >&2
    rc=1
else
    echo "run_tests: vLLM CPU lane not run (no .venv-vllm; bash launch/setup_vllm_cpu.sh builds it)"
fi
exit "$rc"
