#!/usr/bin/env bash
# GPU validation for gkd-harness, for whoever has one CUDA machine (H100/H200). Budget: < 8 minutes
# (per-check timeouts 45+180+60+90+90 s = 7.75 min worst case). Not yet run on a GPU: tune the timeouts and
# GKD_CHECK_STEPS (default 8) on the first real run.
#
#   bash launch/gpu_check.sh                 # run everything, print the table, exit 1 if a check FAILs
#   bash launch/gpu_check.sh --dry-run       # print the commands only
#   WHEELHOUSE=/path/to/wheels bash launch/gpu_check.sh --install   # offline install of the [gpu] extras first
#
# Checks (each bounded by `timeout`; a failing check never stops the next one):
#   repro         the seed report's synthetic repro on CUDA: upstream jsd_loss negative, fp32 == FP64
#   megatron/*    tiny Megatron-backend GKD in BF16, TP1, loss=original and loss=fp32 (one 2-point sweep, no cast
#                 by the harness): the dtypes that arrive at the loss are FP32 student (Float16Module) / BF16
#                 teacher; fp32 has zero negative calls, original is expected to have some
#   hf_bf16       tiny HF-backend GKD with both models in BF16 on CUDA (loss=fp32)
#   vllm_colocate tiny on-policy GKD with a colocated vLLM engine (rollout=vllm_colocate, lmbda=1)
#   bench         gkd-bench --device cuda (loss time and peak memory, upstream vs patched; the loss groups only,
#                 set GKD_CHECK_BENCH_ARGS to change) -> performance.md
# Output: $GKD_CHECK_DIR (default outputs/gpu_check/<timestamp>): checks.jsonl, one log per check, run folders.
set -u -o pipefail

DRY=0; INSTALL=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --install) INSTALL=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
OUT="${GKD_CHECK_DIR:-outputs/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)}"
CHECKS="$OUT/checks.jsonl"
STEPS="${GKD_CHECK_STEPS:-8}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline
export GKD_OUTPUT_ROOT="$OUT/runs"
T0=$(date +%s)

if [[ $INSTALL == 1 ]]; then
  : "${WHEELHOUSE:?set WHEELHOUSE to a folder filled by 'pip download' (see docs/cluster.md)}"
  run_install=("$PY" -m pip install --no-index --find-links "$WHEELHOUSE" -e ".[gpu,bench]")
  echo "+ ${run_install[*]}"; [[ $DRY == 1 ]] || "${run_install[@]}" || exit 1
fi

mkdir -p "$OUT"
[[ $DRY == 1 ]] || : > "$CHECKS"

# check NAME TIMEOUT_S EXPECT_JSON GROUP_DIR -- command...
#   GROUP_DIR: folder holding the run folders the command writes ("-" when it writes none); every run folder
#   under it becomes one table row judged against EXPECT_JSON.
check() {
  local name=$1 limit=$2 expect=$3 group_dir=$4; shift 5
  echo "+ [$name] timeout ${limit}s: $*"
  [[ $DRY == 1 ]] && return 0
  local t=$(date +%s) rc=0
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  local wall=$(( $(date +%s) - t ))
  echo "  [$name] rc=$rc in ${wall}s (log: $OUT/$name.log)"
  if [[ $group_dir == "-" ]]; then
    printf '{"check": "%s", "rc": %d, "wall_s": %d, "detail": "%s"}\n' "$name" "$rc" "$wall" \
      "$(tail -n 3 "$OUT/$name.log" | tr -d '"\\' | tr '\n' ' ' | cut -c1-150)" >>"$CHECKS"
  else
    printf '{"check": "%s", "rc": %d, "wall_s": %d, "group_dir": "%s", "expect": %s}\n' \
      "$name" "$rc" "$wall" "$group_dir" "$expect" >>"$CHECKS"
  fi
}

echo "== gkd-harness GPU check -> $OUT"
[[ $DRY == 1 ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# 1. seed repro on CUDA (seconds)
echo "+ [repro] $PY -m launch.gpu_check repro --device cuda"
if [[ $DRY == 0 ]]; then
  timeout 45 "$PY" -m launch.gpu_check repro --device cuda --out "$CHECKS" >"$OUT/repro.log" 2>&1 \
    || printf '{"check": "repro_failed", "rc": 1, "detail": "see %s"}\n' "$OUT/repro.log" >>"$CHECKS"
fi

COMMON=("run.max_steps=$STEPS" tracking.wandb.mode=offline monitor.spot_check.every_n_steps=2)

# 2. tiny Megatron backend, TP1, original vs fp32: one 2-point sweep, both points at once on the GPU
check megatron 180 '{"student_dtype": "float32", "teacher_dtype": "bfloat16", "neg_calls": "by_precision"}' \
  "$GKD_OUTPUT_ROOT/multirun/gpu_check_megatron" -- \
  gkd-train -m hydra/launcher=submitit_local "${COMMON[@]}" model=tiny backend=megatron backend.tensor_model_parallel_size=1 backend.nproc_per_node=1 \
  model.torch_dtype=bfloat16 model.student_dtype=null model.teacher_dtype=null \
  gkd.beta=0.5 gkd.temperature=0.9 gkd.topk=64 tracking.wandb.group=gpu_check_megatron loss=original,fp32

# 3. tiny HF backend under BF16 (both models BF16 on CUDA), patched loss
check hf_bf16 60 '{"teacher_dtype": "bfloat16", "neg_calls": "zero"}' "$GKD_OUTPUT_ROOT/runs/gpu_check_hf_bf16" -- \
  gkd-train "${COMMON[@]}" model=tiny backend=hf loss=fp32 model.torch_dtype=bfloat16 model.student_dtype=bfloat16 model.teacher_dtype=bfloat16 \
  tracking.wandb.group=gpu_check_hf_bf16

# 4. on-policy GKD with a colocated vLLM engine
check vllm_colocate 90 '{"neg_calls": "zero"}' "$GKD_OUTPUT_ROOT/runs/gpu_check_vllm" -- \
  gkd-train "${COMMON[@]}" model=tiny_vllm backend=hf loss=fp32 rollout=vllm_colocate gkd.lmbda=1.0 \
  tracking.wandb.group=gpu_check_vllm

# 5. performance benchmark on CUDA
check bench 90 '{}' - -- gkd-bench --device cuda ${GKD_CHECK_BENCH_ARGS:---only topk full spot_topk spot_full} --out "$OUT/performance.md"

[[ $DRY == 1 ]] && exit 0
echo
echo "== gkd-harness GPU check: $(( $(date +%s) - T0 ))s total, folder $OUT"
"$PY" -m launch.gpu_check table "$CHECKS"
