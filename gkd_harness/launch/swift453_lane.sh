#!/usr/bin/env bash
# The ms-swift 4.5.3 lane: a 3-step HF run with the fp32 loss in .venv-swift453 (launch/setup_swift453.sh builds it),
# the oldest ms-swift the harness is tested with (harness/launcher/swift_version.py). Exit 0 when the run completed
# on ms-swift 4.5.3 with 3 loss calls and no negative one; else the reason, and 1.
#   bash launch/swift453_lane.sh            (GKD_SWIFT453_VENV=/path to use another venv)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GKD_SWIFT453_VENV:-$ROOT/.venv-swift453}"
[[ -x "$VENV/bin/gkd-train" ]] || { echo "swift453 lane: $VENV has no gkd-train; run bash launch/setup_swift453.sh" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
t0=$(date +%s)
(cd "$WORK" && PATH="$VENV/bin:$PATH" GKD_OUTPUT_ROOT="$WORK/out" \
    gkd-train run.max_steps=3 loss=fp32 run.output_dir="$WORK/run" >"$WORK/train.log" 2>&1)
rc=$?
"$VENV/bin/python" - "$WORK/run" "$rc" <<'PY'
import json, sys
from pathlib import Path

run, rc = Path(sys.argv[1]), int(sys.argv[2])
try:
    summary = json.loads((run / "summary.json").read_text())
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
except (OSError, ValueError, IndexError) as e:
    sys.exit(f"swift453 lane: FAIL: gkd-train exited {rc} and left no readable run folder ({e})")
got = (rc, summary.get("status"), summary.get("versions", {}).get("ms-swift"), last.get("gkd/loss_calls_total"),
       last.get("gkd/neg_loss_calls_total"))
want = (0, "completed", "4.5.3", 3.0, 0.0)
line = ("exit {}, status {}, ms-swift {}, loss calls {}, negative calls {}".format(*got))
if got != want:
    err = (summary.get("error") or "").strip().splitlines()
    sys.exit(f"swift453 lane: FAIL: {line}" + (f"; error: {err[-1]}" if err else ""))
print(f"swift453 lane: ok: {line}, spot grad error {last.get('spot/grad_rel_l2'):.1e}")
PY
ok=$?
[[ $ok -ne 0 ]] && tail -n 20 "$WORK/train.log" >&2
echo "swift453 lane: $(( $(date +%s) - t0 ))s"
exit $ok
