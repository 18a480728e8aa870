"""The held-out evaluation's Megatron code path, as far as the CPU allows: ``EvalTap`` on 2 gloo ranks with ms-swift's
own vocab-parallel functions (``tests/harness/rank/eval_parallel_worker.py``, one torchrun job for every case), against
an FP64 full-vocabulary recomputation from the unsharded tensors.

- TP=2: the logits reach the tap sharded along the vocabulary. Before the fix the tap normalised each shard as if it
  were the whole vocabulary and the world-wide sum counted every position twice (``eval/tokens`` 2N).
- TP=2 with a top-k teacher (``vocab_parallel_topk``): before, nothing was recorded.
- TP=1 with 2 data-parallel ranks, each evaluating half of the rows: the sums are all-reduced once.

- The harness's real Megatron callback around one evaluation at TP=2 (``eval_megatron_callback_worker.py``): the run
  folder's record.

The argv half: experiment=precision_ab turns the evaluation on and needs its held-out split (below); its
``megatron rlhf`` argv with ``--val_dataset`` / ``--eval_steps`` is parsed by ms-swift's ``MegatronRLHFArguments``
in tests/harness/launcher/test_argv_contract.py (every preset point, 1 and 2 nodes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gkd_harness.harness.contract import EVAL_FORWARD_KL, EVAL_JSD, EVAL_REVERSE_KL, EVAL_TOKENS, EVAL_TOP1_AGREEMENT
from gkd_harness.harness.loss.reference import reference_jsd
from tests.two_ranks import run_two_ranks

WORKER = Path(__file__).with_name("eval_parallel_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[3]
B, S, V = 4, 9, 64

CASES = [
    dict(name="tp_full_paper", layout="tp", beta=0.5, beta_form="paper", temperature=0.9, precision="fp32"),
    dict(name="tp_full_continuous", layout="tp", beta=0.2, beta_form="continuous", temperature=1.0, precision="native"),
    dict(name="tp_full_forward_kl", layout="tp", beta=0.0, beta_form="paper", temperature=0.9, precision="fp32"),
    dict(name="tp_topk", layout="tp", beta=0.5, beta_form="paper", temperature=0.9, precision="fp32", topk=8),
    dict(name="dp_full", layout="dp", beta=0.5, beta_form="paper", temperature=0.9, precision="fp32"),
]


def _inputs() -> dict:
    """Student FP32, teacher BF16 (as the dtype boundary hands them to the tap), some inactive positions, and ties
    of the student's maximum across the two vocabulary shards (ids 3 and 40: the first one is the argmax)."""
    g = torch.Generator().manual_seed(20)
    student = torch.randn(B, S, V, generator=g) * 3
    teacher = (student + 0.8 * torch.randn(B, S, V, generator=g)).to(torch.bfloat16)
    labels = torch.randint(0, V, (B, S), generator=g)
    labels[0, :2] = -100
    labels[2, -3:] = -100
    for b, s in ((0, 5), (1, 2), (3, 7)):
        top = float(student[b, s].max()) + 1.0
        student[b, s, 3] = student[b, s, 40] = top
    teacher[0, 5, 3] = float(teacher[0, 5].max()) + 2.0  # teacher agrees with the first maximum
    teacher[1, 2, 40] = float(teacher[1, 2].max()) + 2.0  # teacher on the tied id of the other shard
    return {"student": student, "teacher": teacher, "labels": labels}


@pytest.fixture(scope="module")
def parallel_eval(tmp_path_factory):
    """Run every case on 2 gloo ranks; returns ``(inputs, [results of rank 0, results of rank 1])``."""
    inputs = _inputs()
    return inputs, run_two_ranks(WORKER, {"inputs": inputs, "cases": CASES}, tmp_path_factory.mktemp("eval_parallel"))


def _reference(inp: dict, case: dict, topk=None) -> dict:
    """FP64 token-weighted means over the whole vocabulary (or the teacher's top-k support ``topk = (values, ids)
    [B, S, k]``, renormalised), from the unsharded tensors with gkd_harness.harness.loss.reference; top-1 from the full rows'
    argmaxes."""
    keep = inp["labels"] != -100
    s, t = inp["student"][keep].double(), inp["teacher"][keep].double()
    beta, form, temp = case["beta"], case["beta_form"], case["temperature"]
    if topk is not None:
        vals, ids = topk[0][keep], topk[1][keep]
        s_d, t_d = torch.gather(s, -1, ids), vals
    else:
        s_d, t_d = s, t
    n = s.shape[0]
    return {
        EVAL_JSD: float(reference_jsd(s_d, t_d, beta, form, temp).sum()) / n,
        EVAL_FORWARD_KL: float(reference_jsd(s_d, t_d, 0.0, form, temp).sum()) / n,
        EVAL_REVERSE_KL: float(reference_jsd(s_d, t_d, 1.0, form, temp).sum()) / n,
        EVAL_TOP1_AGREEMENT: float((s.argmax(-1) == t.argmax(-1)).double().mean()),
        EVAL_TOKENS: float(n),
    }


def _check_topk(inp: dict, vals: torch.Tensor, ids: torch.Tensor, k: int) -> None:
    """The teacher's top-k handed to the tap is a true global top-k of the full teacher logits (BF16 ties at the
    k-th value may pick either id: the reference uses the ids the tap was given)."""
    assert torch.equal(torch.gather(inp["teacher"], -1, ids), vals)
    assert torch.equal(vals.sort(-1, descending=True).values, torch.topk(inp["teacher"], k, -1).values)


@pytest.mark.parallel  # one torchrun job, 2 gloo ranks
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_eval_on_two_ranks_matches_the_fp64_full_vocabulary_reference(parallel_eval, case):
    inputs, ranks = parallel_eval
    topk = ranks[0][case["name"]].get("topk")
    if case.get("topk"):
        _check_topk(inputs, *topk, case["topk"])
        assert all(torch.equal(a, b) for a, b in zip(topk, ranks[1][case["name"]]["topk"]))
    ref = _reference(inputs, case, topk)
    assert ref[EVAL_TOKENS] == B * S - 5
    for rank, results in enumerate(ranks):
        got = results[case["name"]]["metrics"]
        assert got[EVAL_TOKENS] == ref[EVAL_TOKENS], (rank, got)  # each position once (TP ranks not double-counted)
        for key in (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL):
            assert got[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-15), (rank, key)
        assert got[EVAL_TOP1_AGREEMENT] == ref[EVAL_TOP1_AGREEMENT], rank


def test_the_cross_shard_tie_is_resolved_to_the_first_maximum():
    """The inputs' ties are real ties, so the top-1 check above exercises the TP argmax's first-maximum rule."""
    inp = _inputs()
    for b, s in ((0, 5), (1, 2), (3, 7)):
        row = inp["student"][b, s]
        assert row[3] == row[40] == row.max() and int(row.argmax()) == 3
    assert int(inp["teacher"][0, 5].argmax()) == 3 and int(inp["teacher"][1, 2].argmax()) == 40


# ------------------------------------------------------------------- the harness's Megatron callback, end to end
CALLBACK_WORKER = Path(__file__).with_name("eval_megatron_callback_worker.py")


@pytest.mark.parallel  # a torchrun job, 2 gloo ranks
def test_megatron_callback_records_the_tp_reduced_evaluation(tmp_path):
    """One evaluation through the plugin as installed and the harness's real Megatron callback (``on_eval_begin``,
    the dtype boundary and EvalTap on TP=2 shards, ``on_eval_end``'s collective, ``on_log``) on 2 gloo ranks: the last
    rank's ``metrics.jsonl`` holds one record at the iteration, equal to the FP64 full-vocabulary reference. Before,
    these hooks had never run."""
    import json

    from gkd_harness.harness.contract import METRICS_FILE, SETTINGS_ENV
    from tests.harness.rank.test_plugin import settings

    inputs = _inputs()
    case = dict(beta=0.5, beta_form="paper", temperature=0.9)
    torch.save({**inputs, "beta": case["beta"], "temperature": case["temperature"], "iteration": 4}, tmp_path / "in.pt")
    path = tmp_path / "settings.json"
    (tmp_path / "run").mkdir()  # gkd-train makes the run folder before ms-swift starts
    settings(tmp_path / "run", overrides=["monitor.eval.every_n_steps=2", "gkd.beta=0.5", "gkd.temperature=0.9"]).write(
        path
    )
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        WANDB_MODE="disabled",
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        **{SETTINGS_ENV: str(path)},
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        str(CALLBACK_WORKER),
        str(tmp_path / "in.pt"),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / METRICS_FILE).read_text().splitlines() if x.strip()]
    assert len(rows) == 1 and rows[0]["step"] == 4, rows
    ref = _reference(inputs, case)
    got = rows[0]
    assert got[EVAL_TOKENS] == ref[EVAL_TOKENS]
    for key in (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL):
        assert got[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-15), key
    assert got[EVAL_TOP1_AGREEMENT] == ref[EVAL_TOP1_AGREEMENT]


# ---------------------------------------------------------------------------------- experiment=precision_ab's argv
def test_precision_ab_requires_its_held_out_split_before_anything_starts(capsys):
    """The held-out evaluation is on in experiment=precision_ab (patched_not_worse is required there): without
    monitor.eval.dataset the SLURM dry run (gkd-train's own validation) is one line naming it, exit 2."""
    from gkd_harness.launch.slurm import main

    rc = main(["experiment=precision_ab", "run.dataset=x/y"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "monitor.eval.dataset" in err, err


def test_precision_ab_eval_flags_reach_megatron_rlhf(tmp_path):
    """With it, every node's ``megatron rlhf`` argv carries ms-swift's own evaluation flags (``--val_dataset``,
    ``--eval_steps``); tests/harness/launcher/test_argv_contract.py parses these argvs with ms-swift's
    ``MegatronRLHFArguments`` for every preset point on 1 and 2 nodes."""
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.launch.slurm import node_plan

    cfg, run_dir = point_config(
        ["experiment=precision_ab", "run.dataset=x/y", "monitor.eval.dataset=x/z"], run_dir=tmp_path / "run"
    )
    for node, nodes in ((0, 1), (0, 2), (1, 2)):
        argv = node_plan(cfg, run_dir, node, nodes, 8).argv
        assert argv[:2] == ["megatron", "rlhf"]
        assert argv[argv.index("--val_dataset") + 1] == "x/z"
        assert argv[argv.index("--eval_steps") + 1] == str(cfg.monitor.eval.every_n_steps) == "50"
