"""Captures under Megatron TP=2 (2 gloo ranks, ms-swift's real vocab-parallel functions): one whole capture per
call, written by the TP group's first rank, that ``gkd-replay`` replays to the spot check's values.

The worker (``capture_tp_worker.py``) makes one instrumented loss call per case on vocabulary shards. Here, in
the test process:

* exactly one file per call (``step1_rank0``): never a shard saved as if it were the whole (before the fix, each
  rank saved its shard, and a top-k capture carried global ids beyond its shard's width);
* the capture equals the full, unsharded inputs (top-k: the student gathered at the teacher's global top-k ids;
  full vocabulary: the shards concatenated);
* ``gkd-replay`` exits 0 on it, its FP64 row equals the independent FP64 reference of the full tensors, and it
  matches the logged ``spot/*`` values: top-k, the same numbers (the same ``[n, K]`` arithmetic on the same
  values); full vocabulary, FP32 within the loss tolerance and both gradients within it (the spot check ran on
  shards with the vocab-parallel primitives, the replay on whole rows), native negative in both.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from gkd_harness.analysis.replay.variants import replay_table
from gkd_harness.harness.loss.reference import reference_gkd
from gkd_harness.harness.loss.tolerances import GRAD_REL_L2_FP32_STUDENT, loss_tol
from gkd_harness.harness.store.captures import load_capture
from tests.conftest import entry_point
from tests.two_ranks import run_two_ranks

pytestmark = [pytest.mark.parallel, pytest.mark.timeout(900)]

WORKER = Path(__file__).with_name("capture_tp_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[3]
BETA, T, K, VOCAB = 0.5, 0.9, 16, 1024
CASES = [
    dict(
        name=f"{teacher}_{precision}",
        teacher=teacher,
        topk=K,
        precision=precision,
        beta_form="paper",
        beta=BETA,
        temperature=T,
    )
    for teacher in ("topk", "full")
    for precision in ("fp32", "native")
]


def _inputs() -> dict:
    """FP32 student (BF16-representable) ``[2, 8, V]``, BF16 near-copy teacher, labels with masked prompts."""
    g = torch.Generator().manual_seed(2222)
    student = (torch.randn(2, 8, VOCAB, generator=g) * 2).bfloat16().float()
    teacher = (student + 0.05 * torch.randn(2, 8, VOCAB, generator=g)).bfloat16()
    labels = torch.randint(0, VOCAB, (2, 8), generator=g)
    labels[0, :3] = -100
    labels[1, :2] = -100
    labels[1, -1] = -100
    return dict(student=student, teacher=teacher, labels=labels)


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=path)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """``(inputs, work folder, [results of rank 0, rank 1])`` of one 2-rank job over every case."""
    work = tmp_path_factory.mktemp("capture_tp")
    inputs = _inputs()
    return inputs, work, run_two_ranks(WORKER, {"inputs": inputs, "cases": CASES}, work, timeout=600)


def _spot(logs: dict, key: str) -> float:
    v = logs[key]
    return float(v["value"] if isinstance(v, dict) else v)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_tp2_capture_is_whole_and_replays_to_the_spot_check(tp_run, case):
    inputs, work, ranks = tp_run
    r0, r1 = ranks[0][case["name"]], ranks[1][case["name"]]
    run_dir = work / case["name"]
    files = sorted(p.name for p in (run_dir / "captures").iterdir())
    assert files == ["step1_rank0.safetensors"], files  # one capture, by TP rank 0; no shard files

    student, labels = inputs["student"], inputs["labels"]
    active = labels != -100
    cap = load_capture(run_dir / "captures" / files[0])
    assert cap["meta"]["tp_size"] == "2" and cap["meta"]["rows_active"] == str(int(active.sum()))
    if case["teacher"] == "topk":
        assert torch.equal(r0["topk_ids"], r1["topk_ids"])
        ids, vals = r0["topk_ids"], r0["topk_vals"]
        assert cap["meta"]["format"] == "topk_gathered" and cap["meta"]["student_vocab"] == str(VOCAB)
        assert torch.equal(cap["vocab_ids"], ids[active])  # global ids, across both shards
        assert bool((ids[active] >= VOCAB // 2).any() and (ids[active] < VOCAB // 2).any())
        assert torch.equal(cap["student_logits"][0], torch.gather(student, -1, ids)[active])
        assert torch.equal(cap["teacher_output"].topk_logprobs[0], vals[active])
        ref_total, ref_n, _ = reference_gkd(student, labels, BETA, T, "paper", teacher_topk=(vals, ids))
    else:
        assert cap["meta"]["format"] == "rows"
        assert torch.equal(cap["student_logits"][0], student[active])  # the two shards, whole
        assert torch.equal(cap["teacher_output"].full_logits[0], inputs["teacher"][active])
        ref_total, ref_n, _ = reference_gkd(student, labels, BETA, T, "paper", teacher_full=inputs["teacher"])

    proc = subprocess.run(
        [entry_point("gkd-replay"), str(run_dir)],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "step1_rank0.safetensors" in proc.stdout and "rank1" not in proc.stdout

    per_capture, _ = replay_table([str(run_dir)])
    row = {r.variant: r for r in per_capture.itertuples()}
    logs = r0["logs"]
    assert r0["n"] == r1["n"] == ref_n == int(row["fp64"].num_valid)
    # the FP64 replay is the independent FP64 reference of the whole, unsharded call, and the spot check's FP64
    ref = ref_total / ref_n
    assert row["fp64"].loss == pytest.approx(ref, rel=1e-9)
    assert _spot(logs, "spot/loss_fp64") == pytest.approx(ref, rel=1e-9)
    # the run's variant replayed from the capture gives the spot check's values
    run = row[case["precision"]]
    spot_loss, spot_grad = _spot(logs, "spot/loss"), _spot(logs, "spot/grad_rel_l2")
    if case["teacher"] == "topk":  # the spot check's [n, K] arithmetic, on the same values: the same numbers
        assert run.loss == pytest.approx(spot_loss, rel=1e-12, abs=0)
        assert run.grad_rel_l2 == pytest.approx(spot_grad, rel=1e-9, abs=0)
    elif case["precision"] == "fp32":  # the spot check ran on shards with the vocab-parallel primitives
        assert abs(run.loss - spot_loss) * ref_n <= loss_tol(ref_total, ref_n)
        assert run.grad_rel_l2 <= GRAD_REL_L2_FP32_STUDENT and spot_grad <= GRAD_REL_L2_FP32_STUDENT
    else:  # native's error depends on the arithmetic (shards vs whole rows); the defect shows in both
        assert run.loss < 0 and spot_loss < 0
        assert run.grad_rel_l2 > GRAD_REL_L2_FP32_STUDENT and spot_grad > GRAD_REL_L2_FP32_STUDENT
