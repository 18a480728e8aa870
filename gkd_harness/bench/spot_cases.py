"""``gkd-bench`` spot-check rows at the seed's shapes (issue 22): V = 248,320, S = 512 with 448 active positions.

Groups (baseline first, as in :mod:`gkd_harness.bench.cases`):

* ``spot_wide``: full vocabulary, FP32 student / BF16 teacher logits ``[1, 512, V]``: ``loss`` (one harness
  ``fp32`` forward+backward, the trainer's normalisation) and ``check`` (one ``gkd_harness.harness.rank.instrument.spot_check``
  of that call, fp32 against fp64, ``monitor.spot_check.max_tokens`` positions).
* ``spot_topk_wide``: top-k mode with a full-vocabulary student (what a trainer hands the loss): FP32 student
  ``[1, 512, V]``, teacher top-64 BF16 log-probs with their global ids: ``loss`` and ``check``.

Goals (:data:`SPOT_GOALS`): the check's peak memory above the inputs ≤ the loss call's own; its time ≤ 3× a loss
call at full vocabulary and ≤ 0.5× in top-k mode. Not in the default groups (``--only spot_wide spot_topk_wide``);
with ``--quick`` the vocabulary is ``Sizes.quick().full_v`` with S = 32 (28 active). Torch-free at import.
"""

from __future__ import annotations

from typing import Dict, List

VOCAB = 248_320
SEQ = 512
ACTIVE = 448
TOPK = 64

SPOT_GROUPS: Dict[str, List[str]] = {"spot_wide": ["loss", "check"], "spot_topk_wide": ["loss", "check"]}


def spot_goals(goal_cls) -> tuple:
    """The goals of these rows as ``goal_cls(name, metric, limit, text)`` (``gkd_harness.bench.cli.Goal``)."""
    return (
        goal_cls(
            "spot_wide/check", "mem_ratio", 1.0, "spot check peak memory ÷ one loss fwd+bwd, full vocab V=248,320 ≤ 1"
        ),
        goal_cls("spot_wide/check", "time_ratio", 3.0, "spot check ÷ one loss fwd+bwd, full vocab V=248,320 ≤ 3"),
        goal_cls(
            "spot_topk_wide/check",
            "mem_ratio",
            1.0,
            "spot check peak memory ÷ one loss fwd+bwd, top-k 64 of V=248,320 ≤ 1",
        ),
        goal_cls(
            "spot_topk_wide/check", "time_ratio", 0.5, "spot check ÷ one loss fwd+bwd, top-k 64 of V=248,320 ≤ 0.5"
        ),
    )


def wide_inputs(topk: bool, device: str, seed: int = 0, vocab: int = VOCAB, seq: int = SEQ, active: int = ACTIVE):
    """``(student [1, S, V] fp32, TeacherOutput, labels [1, S])``: the first ``active`` positions are active.

    The student is a BF16-representable FP32 tensor (Megatron's upcast output); the teacher is
    ``student + 0.03·N(0, 1)`` in BF16, as full logits or as its top-``TOPK`` log-probs with global ids.
    Built row by row (no ``[S, V]`` temporary beyond the results).
    """
    import torch
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    from gkd_harness.bench.cases import TEACHER_NOISE

    g = torch.Generator().manual_seed(seed)
    student = torch.empty(1, seq, vocab, dtype=torch.float32)
    teacher = torch.empty(1, seq, vocab, dtype=torch.bfloat16) if not topk else None
    vals = torch.empty(1, seq, TOPK, dtype=torch.bfloat16) if topk else None
    ids = torch.empty(1, seq, TOPK, dtype=torch.long) if topk else None
    for i in range(seq):
        row = (torch.randn(vocab, generator=g) * 2).bfloat16().float()
        student[0, i] = row
        t_row = (row + TEACHER_NOISE * torch.randn(vocab, generator=g)).bfloat16()
        if topk:
            v, j = torch.topk(t_row.float().log_softmax(-1), TOPK)
            vals[0, i], ids[0, i] = v.bfloat16(), j
        else:
            teacher[0, i] = t_row
    labels = torch.full((1, seq), -100, dtype=torch.long)
    labels[0, :active] = 1
    labels = labels.to(device)
    if topk:
        to = TeacherOutput(topk_logprobs=vals.to(device), topk_indices=ids.to(device), labels=labels)
    else:
        to = TeacherOutput(full_logits=teacher.to(device), labels=labels)
    return student.to(device), to, labels


def build_spot_case(name: str, sizes, device: str):
    """The named ``gkd_harness.bench.cases.Case`` (``spot_wide/loss`` …) with its inputs on ``device``.

    ``sizes`` (``gkd_harness.bench.cases.Sizes``): ``spot_max_tokens`` caps the check; a ``full_v`` other than the default
    (``--quick``) selects the small shape.
    """
    from gkd_harness.bench.cases import BETA, TEMPERATURE, Case, Sizes, _loss_case, default_spot_max_tokens
    from gkd_harness.harness.contract import SPOT_LOSS
    from gkd_harness.harness.losses import make_gkd_loss, make_gkd_loss_terms
    from gkd_harness.harness.rank.instrument import spot_check

    group, variant = name.split("/", 1)
    if group not in SPOT_GROUPS or variant not in SPOT_GROUPS[group]:
        raise KeyError(name)
    shape = {} if sizes.full_v == Sizes().full_v else dict(vocab=sizes.full_v, seq=32, active=28)
    student, to, labels = wide_inputs(group == "spot_topk_wide", device, **shape)
    if variant == "loss":
        return _loss_case(name, make_gkd_loss("fp32", "paper"), student, to, labels)
    run_terms, ref_terms = make_gkd_loss_terms("fp32", "paper"), make_gkd_loss_terms("fp64", "paper")
    max_tokens = sizes.spot_max_tokens or default_spot_max_tokens()
    last: Dict = {}

    def check():
        last.update(spot_check(run_terms, ref_terms, student, to, labels, BETA, TEMPERATURE, max_tokens))
        return last

    def value() -> float:
        if not last:
            check()
        return float(last[SPOT_LOSS])

    return Case(
        name,
        check,
        value,
        note=f"gkd_harness.harness.rank.instrument.spot_check (fp32 vs fp64), max_tokens={max_tokens}",
    )
