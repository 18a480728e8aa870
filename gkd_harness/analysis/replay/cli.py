"""``gkd-replay``: the seed report's diagnostic as a tool.

Recomputes one set of loss inputs with the native (upstream), fp32 and fp64 variants and prints, per variant,
the per-position mean loss and the relative L2 error of d loss / d student logits against FP64.

Two sources of inputs:

* ``gkd-replay synthetic [--seed 0 --rows 3 --vocab 64 ...]``: the seed's recipe (student = BF16-rounded
  ``randn·scale`` held in ``--student-dtype``; teacher = student + ``randn·noise`` in ``--teacher-dtype``);
* ``gkd-replay PATH [PATH ...]``: capture files (``*.safetensors``) or folders searched recursively for
  ``captures/*.safetensors`` (a run folder or a whole sweep). Rows per capture, then the mean over ranks per
  (run, step), as in the seed table.

Exit status: 0 on success, 2 on unreadable or inconsistent input (the message names the file).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from gkd_harness.analysis.replay.seed_input import SEED_INPUT
from gkd_harness.harness.contract import BETA_FORMS, DTYPE_NAMES


def parser() -> argparse.ArgumentParser:
    """``gkd-replay``'s arguments (torch-free: ``--help`` and ``--version`` answer at once)."""
    from gkd_harness.harness.store.provenance import version_line

    p = argparse.ArgumentParser(prog="gkd-replay", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--version", action="version", version=version_line("gkd-replay"))
    p.add_argument("--verbose", action="store_true", help="print the Python traceback of unreadable input")
    p.add_argument("inputs", nargs="+", help="'synthetic', or capture files / run folders / sweep folders")
    p.add_argument(
        "--beta-form",
        choices=BETA_FORMS,
        default=None,
        help="β form to replay (default: the capture's, or paper for synthetic)",
    )
    g = p.add_argument_group("synthetic inputs (the seed recipe)")
    g.add_argument("--seed", type=int, default=SEED_INPUT.seed)
    g.add_argument("--rows", type=int, default=SEED_INPUT.rows)
    g.add_argument("--vocab", type=int, default=SEED_INPUT.vocab)
    g.add_argument("--scale", type=float, default=SEED_INPUT.scale)
    g.add_argument("--noise", type=float, default=SEED_INPUT.noise)
    g.add_argument("--student-dtype", choices=sorted(DTYPE_NAMES), default=SEED_INPUT.student_dtype)
    g.add_argument("--teacher-dtype", choices=sorted(DTYPE_NAMES), default=SEED_INPUT.teacher_dtype)
    g.add_argument("--beta", type=float, default=SEED_INPUT.beta)
    g.add_argument("--temperature", type=float, default=SEED_INPUT.temperature)
    g.add_argument("--topk", type=int, default=SEED_INPUT.topk)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    missing = [p for p in args.inputs if p != "synthetic" and not os.path.exists(p)]
    if missing:  # before torch and the variants are imported: refused at once
        print(f"gkd-replay: {missing[0]}: no such file or folder", file=sys.stderr)
        return 2
    from gkd_harness.analysis.replay.variants import (
        CaptureError,
        evaluate_variants,
        format_variant_table,
        replay_table,
        synthetic_inputs,
    )

    if args.inputs == ["synthetic"]:
        if not 0 <= args.beta <= 1:
            print(f"gkd-replay: --beta must lie in [0, 1], got {args.beta}", file=sys.stderr)
            return 2
        if not args.temperature > 0:
            print(f"gkd-replay: --temperature must be > 0, got {args.temperature}", file=sys.stderr)
            return 2
        if args.rows < 1 or args.vocab < 2 or (args.topk is not None and not 1 <= args.topk <= args.vocab):
            print("gkd-replay: need --rows >= 1, --vocab >= 2 and 1 <= --topk <= --vocab", file=sys.stderr)
            return 2
        s, t, labels = synthetic_inputs(
            args.seed, args.rows, args.vocab, args.scale, args.noise, args.student_dtype, args.teacher_dtype, args.topk
        )
        res = evaluate_variants(s, t, labels, args.beta, args.temperature, args.beta_form or SEED_INPUT.beta_form)
        print(
            f"synthetic seed={args.seed} rows={args.rows} vocab={args.vocab} student={args.student_dtype} "
            f"teacher={args.teacher_dtype} beta={args.beta} T={args.temperature} topk={args.topk} "
            f"beta_form={args.beta_form or SEED_INPUT.beta_form}"
        )
        print(format_variant_table(res))
        return 0
    try:
        per_capture, averaged = replay_table(args.inputs, args.beta_form)
    except CaptureError as e:
        if args.verbose:
            raise
        print(f"gkd-replay: {e}", file=sys.stderr)
        return 2
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.6e}".format):
        print("per capture:")
        print(per_capture.to_string(index=False))
        print("\nmean over ranks:")
        print(averaged.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
