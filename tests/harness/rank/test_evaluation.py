"""The held-out evaluation (gkd_harness.harness.rank.evaluation): the FP64 metrics against the independent reference (full
vocabulary and top-k teacher), the tap's routing and the held-out split's disjointness. The real runs, recomputed
from their saved final students, are the shared short outcome sweep's (tests/analysis/test_outcome_sweep.py); the
TP=2 computation on 2 gloo ranks is tests/harness/rank/test_evaluation_parallel.py."""

import json

import pytest
import torch

from gkd_harness.harness.contract import (
    EVAL_FORWARD_KL,
    EVAL_JSD,
    EVAL_REVERSE_KL,
    EVAL_TOKENS,
    EVAL_TOP1_AGREEMENT,
    VALIDATION_FILE,
)
from gkd_harness.harness.fixtures.embedded import generate_messages, held_out_rows, prepare_validation
from gkd_harness.harness.loss.reference import reference_jsd
from gkd_harness.harness.rank.evaluation import EvalTap, eval_sums, metrics_from_sums


def _teacher(full_logits, labels):
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    return TeacherOutput(full_logits=full_logits, labels=labels)


def _case(seed=0, b=2, s=7, v=33, teacher_dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(b, s, v, generator=g) * 3
    teacher = (student + 0.3 * torch.randn(b, s, v, generator=g)).to(teacher_dtype)
    labels = torch.randint(0, v, (b, s), generator=g)
    labels[0, :3] = -100
    labels[1, -2:] = -100
    return student, teacher, labels


def _reference(student, teacher, labels, beta, temperature, form):
    """Token-weighted means from gkd_harness.harness.loss.reference (FP64, written from the formulas)."""
    s, t = student[labels != -100], teacher[labels != -100]
    n = s.shape[0]
    return {
        EVAL_JSD: float(reference_jsd(s, t, beta, form, temperature).sum()) / n,
        EVAL_FORWARD_KL: float(reference_jsd(s, t, 0.0, form, temperature).sum()) / n,  # KL(T||S)
        EVAL_REVERSE_KL: float(reference_jsd(s, t, 1.0, form, temperature).sum()) / n,  # KL(S||T)
        EVAL_TOP1_AGREEMENT: sum(
            int(a == b) for a, b in zip(s.double().argmax(-1).tolist(), t.double().argmax(-1).tolist())
        )
        / n,
        EVAL_TOKENS: float(n),
    }


@pytest.mark.parametrize(
    "beta,form", [(0.5, "paper"), (0.2, "paper"), (0.2, "continuous"), (0.0, "paper"), (1.0, "paper")]
)
def test_eval_metrics_against_independent_fp64_reference(beta, form):
    student, teacher, labels = _case()
    got = metrics_from_sums(eval_sums(student, _teacher(teacher, labels), labels, beta, 0.9, form))
    ref = _reference(student, teacher, labels, beta, 0.9, form)
    assert got[EVAL_TOKENS] == ref[EVAL_TOKENS] == 9
    for key in (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL):
        assert got[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-15), key
    assert got[EVAL_TOP1_AGREEMENT] == ref[EVAL_TOP1_AGREEMENT]


def test_sums_accumulate_as_a_token_weighted_mean():
    a, b = _case(seed=1), _case(seed=2, b=3, s=5)
    sums = sum(eval_sums(st, _teacher(te, la), la, 0.5, 1.0, "paper") for st, te, la in (a, b))
    got = metrics_from_sums(sums)
    ra, rb = _reference(*a, 0.5, 1.0, "paper"), _reference(*b, 0.5, 1.0, "paper")
    n = ra[EVAL_TOKENS] + rb[EVAL_TOKENS]
    assert got[EVAL_JSD] == pytest.approx(
        (ra[EVAL_JSD] * ra[EVAL_TOKENS] + rb[EVAL_JSD] * rb[EVAL_TOKENS]) / n, rel=1e-12
    )


def test_tap_evaluates_only_calls_without_a_graph():
    calls = []

    def inner(*a, **k):
        calls.append("inner")
        return torch.tensor(1.0), torch.tensor(1)

    def bare(*a, **k):
        calls.append("bare")
        return torch.tensor(2.0), torch.tensor(1)

    tap = EvalTap(inner, bare, "paper")
    student, teacher, labels = _case()
    out = tap(student.requires_grad_(True), _teacher(teacher, labels), labels, 0.5, 0.9)
    assert calls == ["inner"] and tap.sums is None and float(out[0]) == 1.0
    with torch.no_grad():
        out = tap(student.detach(), _teacher(teacher, labels), labels, 0.5, 0.9)
    assert calls == ["inner", "bare"] and float(out[0]) == 2.0
    got = tap.finish()
    assert got[EVAL_JSD] == pytest.approx(
        _reference(student.detach(), teacher, labels, 0.5, 0.9, "paper")[EVAL_JSD], rel=1e-12
    )
    assert tap.sums is None and tap.finish() == {}  # reset after each evaluation


def _topk_teacher(teacher, labels, k):
    """ms-swift's own top-k conversion (``TeacherOutput.to_topk``, what the HF trainer does with gkd.topk)."""
    return _teacher(teacher, labels).to_topk(k)


def _topk_reference(student, teacher, labels, k, beta, temperature, form):
    """FP64 token-weighted means on the teacher's top-k support, renormalised (the loss's view), written
    independently: ids from the full teacher rows, the student gathered there, reference_jsd over the k columns;
    top-1 from the full rows' argmaxes."""
    s, t = student[labels != -100].double(), teacher[labels != -100].double()
    vals, ids = torch.topk(t, k, -1)
    s_k = torch.gather(s, -1, ids)
    n = s.shape[0]
    return {
        EVAL_JSD: float(reference_jsd(s_k, vals, beta, form, temperature).sum()) / n,
        EVAL_FORWARD_KL: float(reference_jsd(s_k, vals, 0.0, form, temperature).sum()) / n,
        EVAL_REVERSE_KL: float(reference_jsd(s_k, vals, 1.0, form, temperature).sum()) / n,
        EVAL_TOP1_AGREEMENT: float((s.argmax(-1) == t.argmax(-1)).double().mean()),
        EVAL_TOKENS: float(n),
    }


@pytest.mark.parametrize(
    "beta,form,k", [(0.5, "paper", 4), (0.2, "continuous", 8), (0.0, "paper", 4), (1.0, "paper", 33)]
)
def test_topk_teacher_eval_on_the_renormalised_support_against_fp64(beta, form, k):
    """A top-k teacher (gkd.topk): the divergences on the teacher's k ids, both sides renormalised as the loss sees
    them, and top-1 over the full vocabulary. Before: the tap logged a warning and recorded nothing."""
    student, teacher, labels = _case(seed=3)
    tap = EvalTap(None, lambda *a, **kw: (torch.tensor(0.0), torch.tensor(1)), form)
    with torch.no_grad():
        tap(student, _topk_teacher(teacher, labels, k), labels, beta, 0.9)
    got = tap.finish()
    ref = _topk_reference(student, teacher, labels, k, beta, 0.9, form)
    assert got[EVAL_TOKENS] == ref[EVAL_TOKENS] == 9
    for key in (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL):
        assert got[key] == pytest.approx(ref[key], rel=1e-12, abs=1e-15), key
    assert got[EVAL_TOP1_AGREEMENT] == ref[EVAL_TOP1_AGREEMENT]
    if k == teacher.shape[-1]:  # the whole vocabulary as "top-k": the full-vocabulary values
        full = _reference(student, teacher, labels, beta, 0.9, form)
        assert got[EVAL_JSD] == pytest.approx(full[EVAL_JSD], rel=1e-12)


def test_topk_positions_without_a_covered_id_are_dropped_as_upstream_does():
    student, teacher, labels = _case(seed=4)
    t_out = _topk_teacher(teacher, labels, 4)
    t_out.topk_logprobs = t_out.topk_logprobs.float()
    t_out.topk_logprobs[0, 4] = float("-inf")  # an active position (labels[0, 3:] active)
    got = metrics_from_sums(eval_sums(student, t_out, labels, 0.5, 1.0, "paper"))
    keep = labels != -100
    keep[0, 4] = False
    assert got[EVAL_TOKENS] == 8
    ref = _topk_reference(student[None][:, keep], teacher[None][:, keep], labels[None][:, keep], 4, 0.5, 1.0, "paper")
    assert got[EVAL_JSD] == pytest.approx(ref[EVAL_JSD], rel=1e-12)


def test_held_out_split_is_disjoint_from_training(tmp_path):
    train = generate_messages(64, 0)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    path = prepare_validation(tmp_path / "train.jsonl", 32, seed=0)
    assert path.name == VALIDATION_FILE.format(n=32)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    prompts = [r["messages"][1]["content"] for r in rows]
    assert len(rows) == 32 and len(set(prompts)) == 32
    assert not set(prompts) & {r["messages"][1]["content"] for r in train}
    assert not {json.dumps(r) for r in rows} & {json.dumps(r) for r in train}
    assert rows == held_out_rows(train, 32, 0)  # deterministic
    assert prepare_validation(tmp_path / "train.jsonl", 32, seed=0).read_text() == path.read_text()
