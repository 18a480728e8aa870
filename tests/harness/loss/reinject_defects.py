"""Coverage of the loss tests (issue 30): every defect an earlier version of the loss had, re-injected into a
scratch worktree of this commit, must make ``tests/harness/loss`` fail. Nothing here asserts; it prints a table.

    python tests/harness/loss/reinject_defects.py [NAME ...]   # default: every defect below

Per defect: ``git worktree add --detach /tmp/reinject-NAME HEAD``, the one-place patch of :data:`DEFECTS` applied
there (the file must still contain the fixed code: a patch that no longer applies is reported as such), then
``pytest tests/harness/loss`` run from the worktree with ``PYTHONPATH`` pointing into it (the venv's editable
install points at the main tree), without test_candidate.py (loading candidates, no loss arithmetic) and, except
for ``injected-textbook`` and ``unequal-vocab-textbook``, without the 2-rank test_losses_parallel.py; the worktree is removed afterwards. The
commit that fixed each defect is named beside it (``git log -- harness/loss harness/losses.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
V, C, S = "harness/loss/variants.py", "harness/loss/chunked.py", "harness/loss/stable.py"
_FUSED = "    if fused:\n"

#: name -> (fixed in, what the defect was, [(file, fixed code, defective code)])
DEFECTS = {
    "promote-after-temperature": (
        "e001a75 (upstream)",
        "BF16 logits divided by T in BF16, then promoted (docs/defects.md)",
        [
            (
                C,
                "    y = x.to(cd)\n    if y is x:",
                "    if temperature is not None:\n        return (x / temperature).to(cd)\n    y = x.to(cd)\n    if y is x:",
            ),
            (
                C,
                "    s = s.to(cdtype)\n    t = t.to(cdtype)\n    if align_vocab",
                "    if temperature is not None:\n        s, t, temperature = s / temperature, t / temperature, None\n"
                "    s = s.to(cdtype)\n    t = t.to(cdtype)\n    if align_vocab",
            ),
        ],
    ),
    "beta-rounded-bf16": (
        "e001a75 (upstream)",
        "β rounded to the student's dtype (bf16(0.999) = 1)",
        [
            (
                V,
                "    cd = compute_dtype(precision, s_logits.dtype, t_logits.dtype)\n    width",
                "    beta = float(torch.tensor(beta, dtype=s_logits.dtype))\n"
                "    cd = compute_dtype(precision, s_logits.dtype, t_logits.dtype)\n    width",
            )
        ],
    ),
    "textbook-fp32": (
        "4bb5ca6",
        "fp32 = promote, then the textbook formula (the loss before issue 13)",
        [
            (V, _FUSED, _FUSED.replace("if fused:", 'if fused and precision == "fp64":')),
            (C, "    stable = precision == FP32 and log_softmax_fn", "    stable = False and log_softmax_fn"),
        ],
    ),
    "kappa-logsumexp": (
        "4bb5ca6",
        "κ formed as max + log Σ (logits ±1e4 gave 9997.878, exact 1e4)",
        [
            (
                S,
                "    return (m_t - m_s) + (s_log.gather(-1, j_s) - t_top), j_s",
                "    return torch.logsumexp(zt, -1, keepdim=True) - torch.logsumexp(zs, -1, keepdim=True), j_s",
            )
        ],
    ),
    "shifted-rows": (
        "4bb5ca6",
        "rows with |κ| > 8 took d from t − s, rounded at ulp(|κ|)",
        [(S, "_KAPPA_MAX = 8.0", '_KAPPA_MAX = float("inf")')],
    ),
    "beta-endpoint-direct-form": (
        "4bb5ca6",
        "β near an endpoint: 1 + u cancels in ψ (no direct form)",
        [
            (
                S,
                "    if beta in (0.0, 1.0):\n        return math.inf, -math.inf",
                "    if True:\n        return math.inf, -math.inf",
            )
        ],
    ),
    "fp16-row-scale": (
        "4bb5ca6",
        "FP16 ∂JSD/∂z stored unscaled: underflows before the loss scale reaches it",
        [(C, "if need and s.dtype == torch.float16 else None", "if False else None")],
    ),
    "partial-inf-nan": (
        "4bb5ca6",
        "0·(−inf) = NaN on partially −inf top-k rows",
        [
            (S, "    return torch.where(w == 0, 0.0, w * v)", "    return w * v"),
            (S, "    return torch.where(w == 0, 0.0, d)", "    return d"),
            (C, "        kl_div_fn = _safe_kl", "        pass"),
        ],
    ),
    "argmax-zero-sum": (
        "ca203f4",
        "gradient at the argmax of nearly one-hot rows from p·h − p·Σp·h (cancels)",
        [
            (
                S,
                "        ph.scatter_(-1, j_s, torch.where(top, others[:, None].neg(), at_j))",
                "        ph.scatter_(-1, j_s, at_j)",
            ),
        ],
    ),
    "disjoint-h-minus-c": (
        "c33893e",
        "h − Σp·h cancels where the teacher's share vanishes (confident on different tokens)",
        [(S, "            shifted = on_sh.mask if on_sh.any else None", "            shifted = None")],
    ),
    "injected-textbook": (
        "c33893e",
        "injected (Megatron) primitives took the textbook formula (identical rows < 0)",
        [
            (
                V,
                _FUSED,
                _FUSED.replace(
                    "if fused:",
                    'if fused and (precision == "fp64" or (log_softmax_fn is default_log_softmax and kl_div_fn is '
                    "default_kl_div)):",
                ),
            )
        ],
    ),
    "fp64-textbook": (
        "c33893e",
        "the fp64 variant (spot check, gkd-replay reference) was the textbook formula in FP64",
        [(V, _FUSED, _FUSED.replace("if fused:", 'if fused and precision != "fp64":'))],
    ),
    "blocks-from-chunk-size": (
        "54a05dd",
        "fused row blocks from chunk_size (FP32 chunks of 256 rows: ~1.5 GB at N=512, V=151,936)",
        [
            (
                V,
                "            rows = block_rows(n, width, s_logits.device)",
                "            rows = _rows_per_chunk(n, chunk_size, s_logits.element_size(), 4)",
            )
        ],
    ),
    "unequal-vocab-textbook": (
        "issue 46",
        "a student narrower than the teacher (upstream's alignment) left the fused path: on the injected "
        "(Megatron) primitives the textbook formula (gradient 1.9e-3 … 5.1e-3 from FP64 on disagreeing rows)",
        [(V, "(align_vocab and s_logits.shape[-1] < t_logits.shape[-1])", "False")],
    ),
    "double-rounding": (
        "b0ff85d",
        "BF16 ∂JSD/∂z rounded in forward, then scaled by 1/num_valid (rounded twice)",
        [
            (
                C,
                "            if need and torch.finfo(s.dtype).bits",
                "            if False and torch.finfo(s.dtype).bits",
            )
        ],
    ),
}


def inject(tree: Path, name: str) -> None:
    for rel, fixed, defective in DEFECTS[name][2]:
        p = tree / rel
        src = p.read_text()
        if fixed not in src:
            raise LookupError(f"{rel}: the fixed code is gone ({fixed.strip()[:60]!r})")
        p.write_text(src.replace(fixed, defective, 1))


def run(name: str) -> str:
    tree = Path(f"/tmp/reinject-{name}")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(tree), "HEAD"],
        check=True,
        capture_output=True,
    )
    try:
        try:
            inject(tree, name)
        except LookupError as e:
            return f"patch does not apply: {e}"
        env = dict(
            os.environ,
            PYTHONPATH=str(tree),
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
            HF_HUB_OFFLINE="1",
            WANDB_MODE="offline",
        )
        probe = (
            "import gkd_harness.harness, gkd_harness.analysis; "
            "print(gkd_harness.harness.__file__, gkd_harness.analysis.__file__)"
        )
        where = subprocess.run(
            [sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True
        ).stdout.split()
        if not where or not all(w.startswith(str(tree)) for w in where):
            return f"the worktree's packages are not the ones imported: {where}"
        args = [
            sys.executable,
            "-m",
            "pytest",
            "tests/harness/loss",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            "--ignore=tests/harness/loss/test_candidate.py",
        ]
        if name not in ("injected-textbook", "unequal-vocab-textbook"):
            args.append("--ignore=tests/harness/loss/test_losses_parallel.py")
        out = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True).stdout
        failed = sorted(
            {
                m.split("::")[0].rsplit("/", 1)[-1] + "::" + m.split("::")[1].split("[")[0]
                for m in re.findall(r"^FAILED (\S+)", out, re.M)
            }
        )
        return f"{out.strip().splitlines()[-1]}: " + ", ".join(failed)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def main(names) -> None:
    print("| defect | fixed in | what it was | tests/harness/loss on the re-injected tree |\n|---|---|---|---|")
    for name in names or DEFECTS:
        t0 = time.time()
        fixed_in, what, _ = DEFECTS[name]
        print(f"| {name} | {fixed_in} | {what} | {run(name)} ({time.time() - t0:.0f} s) |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
