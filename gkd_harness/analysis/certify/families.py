"""The certificate's families: the required coverage the defect reports ask for, and the hard regimes.

Each family is a name, whether it is required (a failure fails the certificate; the hard regimes gate only with
``--strict``), a one-line description, and a function ``(form, quick) -> [Case]``. ``quick`` keeps a subset of
each grid (CI); the full grid runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, List

import numpy as np
import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.analysis.certify.cases import Case, make, problem, rows_case, seed_of, sharded_primitives
from gkd_harness.harness.contract import BETA_FORMS, PAPER


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    required: bool
    description: str
    build: Callable[[str, bool], List[Case]]
    #: the bound on the family's wall time in the candidate's child process: past it the child is killed and the
    #: certificate fails saying so (a hang, not a verdict on accuracy; generous: 100x an idle machine's time)
    limit_s: float = 300.0


def _pick(quick: bool, full, fast):
    return fast if quick else full


MODES = ["full", "topk"]
NEAR, FAR = 0.03, 1.0


def with_fp16(pairs):
    """``pairs`` and, beside each pair holding BF16, the same pair with FP16 (a fix that promotes only BF16 must
    fail wherever one that forgets BF16 would)."""
    out = list(pairs)
    for a, b in pairs:
        twin = (a.replace("bf16", "fp16"), b.replace("bf16", "fp16"))
        if twin not in out:
            out.append(twin)
    return out


# ------------------------------------------------------------------------------------------------ required
def mixed(form: str, quick: bool) -> List[Case]:
    betas = _pick(quick, [0.0, 0.1, 0.5, 0.9, 1.0], [0.0, 0.5, 1.0])
    temps = [1.0]  # T != 1 is a family of its own
    return [
        make(f"fp32/bf16 {m} {'near' if nz == NEAR else 'far'} b={b} T={t}", "fp32", "bf16", m, nz, b, t, form)
        for b, t, m, nz in itertools.product(betas, temps, MODES, [NEAR, FAR])
    ]


PAIRS = [
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp32", "fp32"),
    ("fp64", "fp64"),
    ("fp64", "bf16"),
    ("bf16", "fp32"),
    ("fp32", "fp16"),
]


def dtype_pairs(form: str, quick: bool) -> List[Case]:
    pairs = _pick(quick, PAIRS, [("bf16", "bf16"), ("fp32", "fp32"), ("fp64", "bf16")])
    betas = _pick(quick, [0.0, 0.5, 1.0], [0.5])
    out = [
        make(f"{a}/{b} {m} b={be}", a, b, m, NEAR, be, 1.0, form)
        for (a, b), be, m in itertools.product(pairs, betas, MODES)
    ]
    # An FP16 student at V = 32,768 under a 2^16 loss scale: most ∂JSD/∂z entries lie below FP16's smallest
    # subnormal until the scale multiplies them; the relative L2 (a few large entries dominate it) does not see
    # them come back 0, the zeroed-entries measure does (evaluate.zeroed).
    out += [
        make(
            f"fp16/fp16 full V=32768 loss x 2^16 b={be} T=0.9",
            "fp16",
            "fp16",
            "full",
            NEAR,
            be,
            0.9,
            form,
            loss_scale=2.0**16,
            batch=1,
            seq=8,
            masked_prefix=0,
            vocab=32768,
        )
        for be in betas
    ]
    return out


def near_identical(form: str, quick: bool) -> List[Case]:
    pairs = _pick(quick, with_fp16([("fp32", "bf16"), ("bf16", "bf16"), ("fp32", "fp32")]), [("fp32", "bf16")])
    betas = _pick(quick, [0.1, 0.5, 0.9], [0.5])
    return [
        make(f"{a}/{b} {m} noise=0.03 b={be}", a, b, m, NEAR, be, 1.0, form, seq=48)
        for (a, b), be, m in itertools.product(pairs, betas, MODES)
    ]


def different(form: str, quick: bool) -> List[Case]:
    pairs = _pick(quick, with_fp16([("fp32", "bf16"), ("bf16", "bf16"), ("fp32", "fp32")]), [("fp32", "bf16")])
    noises = _pick(quick, [1.0, 3.0], [1.0])
    return [
        make(f"{a}/{b} {m} noise={nz} b={be}", a, b, m, nz, be, 1.0, form)
        for (a, b), nz, be, m in itertools.product(pairs, noises, [0.5], MODES)
    ]


def betas(form: str, quick: bool) -> List[Case]:
    bs = _pick(quick, [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0], [0.0, 0.25, 0.5, 0.9, 1.0])
    return [
        make(f"{a}/{t} {m} b={b}", a, t, m, NEAR, b, 1.0, form)
        for (a, t), b, m in itertools.product(
            _pick(quick, with_fp16([("fp32", "bf16")]), [("fp32", "bf16")]), bs, _pick(quick, MODES, ["full"])
        )
    ]


def temperatures(form: str, quick: bool) -> List[Case]:
    # 0.5, 2 and 4 divide exactly in any binary format; 0.7, 0.9 and 1.5 round in BF16
    temps = _pick(quick, [0.5, 0.7, 0.9, 1.5, 2.0, 4.0], [0.9, 1.5])
    pairs = _pick(quick, with_fp16([("fp32", "bf16"), ("bf16", "bf16")]), [("fp32", "bf16")])
    return [
        make(f"{a}/{b} {m} T={t} b={be}", a, b, m, NEAR, be, t, form)
        for (a, b), t, be, m in itertools.product(pairs, temps, _pick(quick, [0.0, 0.5, 1.0], [0.5]), MODES)
    ]


def topk_and_full(form: str, quick: bool) -> List[Case]:
    ks = _pick(quick, [1, 4, 16, 64, 96], [1, 16, 96])
    out = [
        make(f"fp32/bf16 topk k={k} b={b}", "fp32", "bf16", "topk", NEAR, b, 1.0, form, topk=k)
        for k, b in itertools.product(ks, _pick(quick, [0.0, 0.5, 1.0], [0.5]))
    ]
    out += [
        make(f"fp32/bf16 full b={b}", "fp32", "bf16", "full", NEAR, b, 1.0, form)
        for b in _pick(quick, [0.0, 0.5, 1.0], [0.5])
    ]
    return out


def empty_masks(form: str, quick: bool) -> List[Case]:
    out = []
    for m, b in itertools.product(MODES, _pick(quick, [0.0, 0.5, 1.0], [0.5])):
        c = make(f"fp32/bf16 {m} all labels -100 b={b}", "fp32", "bf16", m, NEAR, b, 1.0, form, masked_prefix=24)
        out.append(c)
    # top-k rows whose teacher log-probs are all -inf are dropped (upstream's semantics), the rest kept
    for b in _pick(quick, [0.0, 0.5, 1.0], [0.5]):
        c = make(f"fp32/bf16 topk uncovered rows dropped b={b}", "fp32", "bf16", "topk", NEAR, b, 1.0, form)
        lp = c.teacher.topk_logprobs.clone()
        lp[0, 5] = float("-inf")
        lp[1, 9] = float("-inf")
        c.teacher = TeacherOutput(topk_logprobs=lp, topk_indices=c.teacher.topk_indices, labels=c.labels)
        c.ref = dict(teacher_topk=(lp, c.teacher.topk_indices))
        out.append(c)
    return out


def chunking(form: str, quick: bool) -> List[Case]:
    out = [
        make(f"fp32/bf16 full 600 positions (> chunk 512) b={b}", "fp32", "bf16", "full", NEAR, b, 1.0, form, seq=303)
        for b in _pick(quick, [0.0, 0.5, 1.0], [0.5])
    ]
    for cs in _pick(quick, [1, 7, 64], [7]):
        out.append(
            make(
                f"fp32/bf16 full chunk_size={cs} b=0.5",
                "fp32",
                "bf16",
                "full",
                NEAR,
                0.5,
                1.0,
                form,
                kwargs={"chunk_size": cs},
            )
        )
    return out


def vocab_mismatch(form: str, quick: bool) -> List[Case]:
    sizes = _pick(quick, [(96, 104), (104, 96)], [(96, 104), (104, 96)])
    return [
        make(
            f"{a}/{t} student V={vs} teacher V={vt} b={b}",
            a,
            t,
            "full",
            NEAR,
            b,
            1.0,
            form,
            vocab=vs,
            teacher_vocab=vt,
        )
        for (a, t), (vs, vt), b in itertools.product(
            _pick(quick, with_fp16([("fp32", "bf16")]), [("fp32", "bf16")]), sizes, _pick(quick, [0.0, 0.5, 1.0], [0.5])
        )
    ]


def teacher_labels(form: str, quick: bool) -> List[Case]:
    """Self-distillation (ms-swift's OPSD): the teacher scored another prompt, so ``teacher_output.labels`` mark
    other positions than the student's labels, the same count (the response tokens). Here the student's first 3
    positions are masked and the teacher's last 3: student row p+3 pairs with teacher row p. A loss that selects
    the teacher's rows with the student's labels pairs each student row with the teacher's row at its own
    position instead."""
    out = []
    for (a, b), m, nz, be in itertools.product(
        _pick(quick, with_fp16([("fp32", "bf16"), ("bf16", "bf16"), ("fp32", "fp32")]), [("fp32", "bf16")]),
        MODES,
        _pick(quick, [NEAR, FAR], [NEAR]),
        _pick(quick, [0.0, 0.5, 1.0], [0.5]),
    ):
        c = make(
            f"{a}/{b} {m} {'near' if nz == NEAR else 'far'} teacher labels 3 positions earlier b={be}",
            a,
            b,
            m,
            nz,
            be,
            1.0,
            form,
        )
        t_labels = torch.roll(c.labels, -3, dims=1)  # the masked prefix of 3 becomes a masked suffix
        t = c.teacher
        c.teacher = TeacherOutput(
            full_logits=t.full_logits, topk_logprobs=t.topk_logprobs, topk_indices=t.topk_indices, labels=t_labels
        )
        c.ref = {**c.ref, "teacher_labels": t_labels}
        out.append(c)
    return out


def memory(form: str, quick: bool) -> List[Case]:
    """Repeated calls (evaluate._memory_check): tensors alive and the process's RSS after ``calls`` calls with
    backward, against upstream's own growth on the same calls. A loss that keeps what it returns (a module-level
    list of totals, a cache keyed by call) grows with every training step."""
    return [
        make(
            f"fp32/bf16 {m} {n} calls with backward b=0.5",
            "fp32",
            "bf16",
            m,
            NEAR,
            0.5,
            1.0,
            form,
            batch=1,
            seq=256,
            vocab=4096,
            topk=64,
            masked_prefix=0,
            check="memory",
            calls=n,
        )
        for m, n in [("full", 12)]  # each measurement collects the garbage: the costliest case per call
    ]


#: Report 001's numpy example (paper, continuous) at 4 decimals: its table is the objective's signature.
REPORT_001 = {
    0.0: (1.9262, 1.9262),
    0.001: (0.0019, 1.9069),
    0.1: (0.1454, 1.0605),
    0.5: (0.3492, 0.3492),
    0.9: (0.1474, 1.0635),
    0.999: (0.0020, 2.0119),
    1.0: (2.0450, 2.0450),
}


def _report_001_rows():
    rng = np.random.default_rng(7)
    z = rng.normal(0, 1.5, 300)
    w = rng.normal(0, 1.5, 300) + 0.3
    w[:3] += 2.0
    return torch.tensor(z, dtype=torch.float32)[None], torch.tensor(w, dtype=torch.float32)[None]


def pinned(form: str, quick: bool) -> List[Case]:
    """TRL's ``TestGeneralizedJSDLoss`` pins (via gkd_loss: every position active, TRL's batchmean = sum / B
    with B = 1 here) and the β defect's table (docs/defects.md)."""
    out = []
    ones = torch.ones(1, 5)
    out.append(
        rows_case(
            "TRL uniform distributions -> 0", ones, ones, 0.5, 1.0, form, check="pinned", expected=0.0, abs_tol=5e-6
        )
    )
    s = torch.log(torch.tensor([[0.1, 0.9]]))
    t = torch.log(torch.tensor([[0.9, 0.1]]))
    for b in (0.0, 1.0):
        p, q = (t, s) if b == 0 else (s, t)  # β=0: KL(T‖S), β=1: KL(S‖T)
        exact = float((p.double().softmax(-1) * (p.double().log_softmax(-1) - q.double().log_softmax(-1))).sum())
        out.append(
            rows_case(f"TRL edge case b={b:g} = KL", s, t, b, 1.0, form, check="pinned", expected=exact, abs_tol=5e-6)
        )
    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    out.append(
        rows_case(
            "TRL beta 0 and 1 differ", a, c, 0.0, 1.0, form, check="differ", other=rows_case("", a, c, 1.0, 1.0, form)
        )
    )
    out.append(
        rows_case(
            "TRL temperature 1 and 2 differ",
            a,
            c,
            0.5,
            1.0,
            form,
            check="differ",
            other=rows_case("", a, c, 0.5, 2.0, form),
        )
    )
    out.append(
        rows_case(
            "TRL b=0.1 not symmetric", a, c, 0.1, 1.0, form, check="differ", other=rows_case("", c, a, 0.1, 1.0, form)
        )
    )
    out.append(
        rows_case(
            "TRL b=0.5 symmetric bit for bit",
            a,
            c,
            0.5,
            1.0,
            form,
            check="symmetric",
            other=rows_case("", c, a, 0.5, 1.0, form),
        )
    )
    same = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    out.append(
        rows_case("TRL identical inputs -> 0", same, same, 0.5, 1.0, form, check="pinned", expected=0.0, abs_tol=5e-7)
    )
    z, w = _report_001_rows()
    col = 0 if form == PAPER else 1
    for b in _pick(quick, sorted(REPORT_001), [0.0, 0.1, 0.5, 1.0]):
        out.append(
            rows_case(
                f"the β defect, docs/defects.md table b={b:g}",
                z,
                w,
                b,
                1.0,
                form,
                check="pinned",
                expected=REPORT_001[b][col],
                abs_tol=5e-5,
            )
        )
    return out


def injected(form: str, quick: bool) -> List[Case]:
    """ms-swift's Megatron trainer passes its own ``gather_fn`` / ``log_softmax_fn`` / ``kl_div_fn`` by keyword
    (vocab-parallel, even at TP = 1): the candidate must accept and *call* them. Checked by behaviour: the
    vocabulary is split over 2 ranks (threads of this process with an all-reduce), each rank's candidate call sees
    only its shard, and the stand-ins (gkd_harness.analysis.certify.evaluate.shard_primitives) normalise over the whole
    vocabulary held by both. A candidate that ignores one normalises its own shard and fails, naming it."""
    return [
        make(f"{a}/{b} {m} 2 vocab-parallel ranks b={be}", a, b, m, NEAR, be, t, form, check="sharded")
        for (a, b), be, m, t in itertools.product(
            _pick(quick, [("fp32", "fp32"), ("fp32", "bf16")], [("fp32", "bf16")]),
            _pick(quick, [0.0, 0.5, 0.9, 1.0], [0.0, 0.5]),
            MODES,
            _pick(quick, [1.0, 0.9], [0.9]),
        )
    ]


def scaled_backward(form: str, quick: bool) -> List[Case]:
    """A BF16 student's gradient of ``total / num_valid`` with num_valid not a power of two (60, 3): rounded once
    to BF16 (``tolerances.ONE_ROUNDING_GRAD_FACTOR`` x the rounding of the FP64 gradient). The other families
    divide by num_valid too, under the looser ``LOW_PRECISION_GRAD_FACTOR``."""
    from gkd_harness.harness.loss.tolerances import ONE_ROUNDING_GRAD_FACTOR

    out = []
    for (a, b), m, (seq, masked), be in itertools.product(
        _pick(quick, [("bf16", "bf16"), ("bf16", "fp32")], [("bf16", "bf16")]),
        MODES,
        [(33, 3), (2, 0)] if not quick else [(33, 3)],
        _pick(quick, [0.0, 0.5, 1.0], [0.5]),
    ):
        n = 2 * (seq - masked) if masked else 2 * seq
        if seq == 2:  # num_valid = 3: one masked position
            n = 3
        c = make(
            f"{a}/{b} {m} total/{n} b={be}",
            a,
            b,
            m,
            NEAR,
            be,
            0.9,
            form,
            seq=seq,
            masked_prefix=masked,
            grad_factor=ONE_ROUNDING_GRAD_FACTOR,
            vocab=4096 if m == "full" else 96,
            topk=64,
        )
        if seq == 2:
            c.labels[0, 0] = -100
            if c.teacher.labels is not None:
                c.teacher.labels = c.labels
        out.append(c)
    return out


def identity(form: str, quick: bool, pairs=()) -> List[Case]:
    """Bit-identity with the installed ms-swift on the dtype pairs the candidate declares unchanged."""
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
    out = []
    for pair in pairs:
        sd, td = (short.get(x.strip(), x.strip()) for x in pair.split("/"))
        for be, t, m in itertools.product(
            _pick(quick, [0.0, 0.1, 0.5, 1.0], [0.0, 0.5]), _pick(quick, [0.9, 1.0], [0.9]), MODES
        ):
            out.append(
                make(f"{sd}/{td} {m} b={be} T={t} vs upstream", sd, td, m, NEAR, be, t, form, seq=303, check="identity")
            )
    return out


def contract(form: str, quick: bool) -> List[Case]:
    """What ms-swift's callers rely on besides the value (evaluate._contract_check): the return types, the graph
    (empty partitions included), bit-identical repeats, the value under ``no_grad`` / ``inference_mode``, and
    exceptions that reach the caller (a label-count mismatch; one raised by an injected primitive). Every call of
    every family also checks that the inputs and the global torch state are left as they were."""
    out = []
    for (a, b), m in itertools.product(_pick(quick, [("fp32", "bf16"), ("bf16", "bf16")], [("fp32", "bf16")]), MODES):
        out.append(
            make(
                f"{a}/{b} {m}: return, graph, repeat, no_grad",
                a,
                b,
                m,
                NEAR,
                0.5,
                0.9,
                form,
                check="contract",
                contract="call",
            )
        )
        out.append(
            make(
                f"{a}/{b} {m} empty partition (every label -100): return, graph",
                a,
                b,
                m,
                NEAR,
                0.5,
                0.9,
                form,
                masked_prefix=24,
                check="contract",
                contract="call",
            )
        )
    mismatch = make(
        "fp32/bf16 full label count mismatch raises",
        "fp32",
        "bf16",
        "full",
        NEAR,
        0.5,
        1.0,
        form,
        check="contract",
        contract="mismatch",
    )
    t_labels = mismatch.labels.clone()
    t_labels[0, -1] = -100
    mismatch.teacher = TeacherOutput(full_logits=mismatch.teacher.full_logits, labels=t_labels)
    out.append(mismatch)
    for m, prim in (("full", "log_softmax_fn"), ("topk", "gather_fn")):
        out.append(
            make(
                f"fp32/bf16 {m} an error in {prim} reaches the caller",
                "fp32",
                "bf16",
                m,
                NEAR,
                0.5,
                1.0,
                form,
                check="contract",
                contract=f"raising {prim}",
            )
        )
    return out


#: Vocabulary sizes users run: Qwen2/2.5/3 (151,936) and Gemma 3 (262,144 is Gemma's; 248,320 the issue's second).
PRODUCTION_VOCABS = (151_936, 248_320)


def production(form: str, quick: bool) -> List[Case]:
    """The sizes users run, a few rows each, with grad and under ``no_grad`` (the evaluation path, value only):
    2 positions at V = 151,936 and 248,320; 5,000 active positions (more than 4,096) at V = 32; top-k (k = 16) over
    16,384 positions. FP32 student, BF16 teacher, near-identical distributions (where the defect goes negative)."""
    out = []
    for gm in _pick(quick, ["grad", "no_grad"], ["grad", "no_grad"]):
        judge = gm == "grad"
        for v in PRODUCTION_VOCABS:
            out.append(
                make(
                    f"fp32/bf16 full V={v:,} 2 positions {gm} b=0.5",
                    "fp32",
                    "bf16",
                    "full",
                    NEAR,
                    0.5,
                    1.0,
                    form,
                    batch=1,
                    seq=2,
                    masked_prefix=0,
                    vocab=v,
                    grad_mode=gm,
                    judge_grad=judge,
                )
            )
        out.append(
            make(
                f"fp32/bf16 full 5,000 positions V=32 {gm} b=0.5",
                "fp32",
                "bf16",
                "full",
                NEAR,
                0.5,
                1.0,
                form,
                batch=1,
                seq=5000,
                masked_prefix=0,
                vocab=32,
                grad_mode=gm,
                judge_grad=judge,
            )
        )
        out.append(
            make(
                f"fp32/bf16 topk k=16 16,384 positions {gm} b=0.5",
                "fp32",
                "bf16",
                "topk",
                NEAR,
                0.5,
                1.0,
                form,
                batch=2,
                seq=8192,
                masked_prefix=0,
                vocab=64,
                topk=16,
                grad_mode=gm,
                judge_grad=judge,
            )
        )
    return out


# ------------------------------------------------------------------------------------------------ hard regimes
def _levels(scale: float, seed: int, rows: int = 16, vocab: int = 64):
    g = torch.Generator().manual_seed(seed)
    bs = torch.randint(0, 2, (rows, vocab), generator=g).float() * 2 - 1
    bt = torch.where(torch.rand(rows, vocab, generator=g) < 0.2, -bs, bs)
    return scale * bs + 2 * torch.randn(rows, vocab, generator=g), scale * bt + 2 * torch.randn(
        rows, vocab, generator=g
    )


def extreme_logits(form: str, quick: bool) -> List[Case]:
    out = []
    for scale, b in itertools.product(_pick(quick, [1e2, 1e3, 1e4], [1e3, 1e4]), _pick(quick, [0.0, 0.5, 1.0], [0.5])):
        s, t = _levels(scale, seed_of("levels", scale))
        out.append(rows_case(f"logits +-{scale:g} b={b}", s, t, b, 1.0, form))
    s, t = torch.tensor([[1e4, 1e4, -1e4, -1e4]]), torch.tensor([[-1e4, 1e4, 1e4, -1e4]])
    out.append(rows_case("issue repro s=[1e4,1e4,-1e4,-1e4] b=0 (exact 1e4)", s, t, 0.0, 1.0, form))
    return out


def beta_endpoints(form: str, quick: bool) -> List[Case]:
    return [
        make(f"{a}/{b} {m} b={be:g}", a, b, m, nz, be, 0.9, form)
        for (a, b), be, m, nz in itertools.product(
            _pick(quick, [("fp32", "bf16"), ("fp32", "fp32")], [("fp32", "bf16")]),
            _pick(quick, [1e-6, 1e-3, 0.999, 1 - 1e-6], [1e-6, 1 - 1e-6]),
            MODES,
            [NEAR, 8.0],
        )
    ]


def fp16_loss_scale(form: str, quick: bool) -> List[Case]:
    """FP16 students under a 2^16 loss scale: besides the relative L2, no entry whose scaled FP64 gradient is at
    least FP16's smallest subnormal may come back 0 (``evaluate.zeroed``, every FP16/BF16 student)."""
    return [
        make(f"fp16/fp16 {m} loss x 2^16 b={b}", "fp16", "fp16", m, NEAR, b, 1.0, form, loss_scale=2.0**16)
        for b, m in itertools.product(_pick(quick, [0.0, 0.5, 1.0], [0.5]), MODES)
    ]


def partial_inf(form: str, quick: bool) -> List[Case]:
    out = []
    for b in _pick(quick, [0.0, 0.5, 0.9], [0.5]):
        c = make(f"fp32/bf16 topk trailing -inf log-probs b={b}", "fp32", "bf16", "topk", NEAR, b, 1.0, form)
        lp = c.teacher.topk_logprobs.clone()
        lp[0, 5, 10:] = float("-inf")
        lp[1, 7, 1:] = float("-inf")
        c.teacher = TeacherOutput(topk_logprobs=lp, topk_indices=c.teacher.topk_indices, labels=c.labels)
        c.ref = dict(teacher_topk=(lp, c.teacher.topk_indices))
        out.append(c)
    return out


def confident_disagreement(form: str, quick: bool) -> List[Case]:
    out = []
    for b, sc in itertools.product(_pick(quick, [0.0, 0.5, 1.0], [0.5]), _pick(quick, [10.0, 30.0], [30.0])):
        g = torch.Generator().manual_seed(seed_of("confident", b, sc))
        s = torch.randn(16, 64, generator=g) * sc
        t = torch.randn(16, 64, generator=g) * sc
        out.append(rows_case(f"independent logits std {sc:g} b={b}", s, t, b, 1.0, form))
    return out


def _shifted(scale: float, seed: int, rows: int = 16, vocab: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Near-identical rows whose logits carry a row offset of ``+scale`` (student) and ``-scale`` (teacher), as
    tests/harness/loss/test_losses_regimes.py's: ``t - s`` rounds at ulp(2·scale), the log-softmaxes do not."""
    g = torch.Generator().manual_seed(seed)
    base = 2 * torch.randn(rows, vocab, generator=g)
    off = scale * torch.where(torch.rand(rows, 1, generator=g) < 0.5, -1.0, 1.0)
    return base + off, base + 0.03 * torch.randn(rows, vocab, generator=g) - off


def shifted_logits(form: str, quick: bool) -> List[Case]:
    """Student and teacher logits offset by a large per-row constant (±300, ±1e4 with opposite signs): softmax
    does not see it, so any correct formula (textbook FP32 included: ``x - max`` is exact there) stays within
    tolerance; a loss that forms ``t - s`` for the log-ratio loses it at ulp(2·offset). β exact in BF16: the
    failures are in the gradient, which the value-based causes (gkd_harness.analysis.certify.causes) must not claim."""
    return [
        rows_case(f"row offset +-{sc:g} b={b}", s, t, b, 1.0, form)
        for sc, b in itertools.product(
            _pick(quick, [300.0, 1e4], [1e4]), _pick(quick, [0.0, 0.25, 0.5, 0.75, 1.0], [0.25, 1.0])
        )
        for s, t in [_shifted(sc, seed_of("shifted", sc))]
    ]


def one_hot_rows(form: str, quick: bool) -> List[Case]:
    """Near-identical distributions (teacher = student + 0.03 noise, BF16; the loss tests' generator) divided by
    T = 1e-3 in FP32 beforehand and judged at T = 1 on exactly those tensors: scaled logits of thousands, nearly
    one-hot rows. At the argmax the gradient ``p·h − p·Σ p·h`` cancels (p ≈ 1): it must come from the other
    entries' zero-sum instead (reverse KL and β within 1e-6 of an endpoint show it)."""
    out = []
    for be, seed_form in itertools.product(_pick(quick, [0.0, 1e-6, 0.5, 1 - 1e-6, 1.0], [1e-6, 1.0]), BETA_FORMS):
        s, t, labels, _ = problem(
            "fp32", "bf16", "full", NEAR, seed_of("temp", ("fp32", "bf16"), 1e-3, be, seed_form, True)
        )
        rows = labels != -100
        out.append(
            rows_case(
                f"fp32/bf16 logits / 1e-3 at T=1 b={be:g} (seed {seed_form})",
                s[rows].float() / 1e-3,
                t.full_logits[rows].float() / 1e-3,
                be,
                1.0,
                form,
            )
        )
    return out


def vocab_parallel(form: str, quick: bool) -> List[Case]:
    lsf, kdf = sharded_primitives(2)
    return [
        make(
            f"{a}/{b} 2 vocab shards b={be}",
            a,
            b,
            "full",
            NEAR,
            be,
            1.0,
            form,
            kwargs={"log_softmax_fn": lsf, "kl_div_fn": kdf},
        )
        for (a, b), be in itertools.product(
            _pick(quick, [("fp32", "bf16"), ("fp32", "fp32")], [("fp32", "bf16")]), _pick(quick, [0.0, 0.5, 1.0], [0.5])
        )
    ]


def confident_rows(vocab: int = 151_936, delta: float = 0.9, seed: int = 0):
    """``(student [1, V] FP32, teacher [1, V] BF16)``: the student spread over its top three tokens (12.5, 12.45,
    12.4), the teacher confident on a fourth (12.5) with the student's three ``delta`` ± 0.1 below; the rest
    N(0, 0.5²). At T = 0.05 (|z|/T ≈ 250) the teacher's share of the student's tokens is e^-14 … e^-20: h is near its
    limit there, and the continuous form's ``h − c`` is a difference of two near-equal terms (issue 37, item 16)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, vocab, generator=g) * 0.5
    t = torch.randn(1, vocab, generator=g) * 0.5
    s[0, :3] = torch.tensor([12.5, 12.45, 12.4])
    t[0, 3] = 12.5
    t[0, :3] = torch.tensor([12.5 - delta, 12.5 - delta + 0.1, 12.5 - delta - 0.1])
    return s.bfloat16().float(), t.bfloat16()


def confident_near_one(form: str, quick: bool) -> List[Case]:
    """Confidently disagreeing rows at V = 151,936 and T = 0.05, β ∈ {0.98, 0.99, 0.999} (:func:`confident_rows`).
    Upstream's formula in FP32 is 1e-2 … 2 (rel L2) from FP64 here in either form: a hard regime."""
    out = []
    for be, delta in itertools.product(_pick(quick, [0.98, 0.99, 0.999], [0.99]), [0.9]):
        s, t = confident_rows(delta=delta)
        c = rows_case(f"fp32/bf16 V=151,936 T=0.05 teacher {delta:g} above b={be:g}", s, t, be, 0.05, form)
        out.append(c)
    return out


REQUIRED_FAMILIES = [
    Family("mixed FP32/BF16 (the defect)", True, "FP32 student, BF16 teacher; near-identical and different", mixed),
    Family(
        "dtype pairs",
        True,
        "bf16/bf16, fp16/fp16, fp32/fp32, fp64/fp64, fp64/bf16, bf16/fp32, fp32/fp16; "
        "fp16/fp16 at V = 32,768 under loss × 2^16 (no representable gradient entry zeroed)",
        dtype_pairs,
    ),
    Family("near-identical distributions", True, "teacher = student + 0.03 noise", near_identical),
    Family("different distributions", True, "teacher = student + 1 or 3 noise", different),
    Family("beta 0, 0.5, 1 and interior", True, "β ∈ {0, 0.1, 0.25, 0.5, 0.75, 0.9, 1}", betas),
    Family("temperature T != 1", True, "T ∈ {0.5 … 4}", temperatures),
    Family("top-k and full vocabulary", True, "k ∈ {1, 4, 16, 64, V} and the full vocabulary", topk_and_full),
    Family("empty masks", True, "every label -100; top-k rows all -inf (dropped)", empty_masks),
    Family("chunking", True, "600 positions (> chunk 512); chunk_size 1, 7, 64", chunking),
    Family("vocab mismatch", True, "student and teacher vocabularies differ (upstream's alignment)", vocab_mismatch),
    Family(
        "teacher labels at other positions",
        True,
        "self-distillation: teacher_output.labels mark other positions than the student's, the same count",
        teacher_labels,
    ),
    Family(
        "memory across repeated calls",
        True,
        "tensors alive and RSS after 12 calls with backward (full vocabulary), against upstream's growth on the same calls",
        memory,
    ),
    Family("pinned (TRL style)", True, "TRL's generalized_jsd pins; the β defect's table (docs/defects.md)", pinned),
    Family(
        "the contract",
        True,
        "0-dim total at least as wide as the student, on its device, in the graph (empty partitions too); num_valid "
        "a tensor; repeat bit-identical; no_grad / inference_mode values; exceptions propagate; inputs and global "
        "torch state (default dtype, RNG, grad mode, deterministic flags) left as they were",
        contract,
    ),
    Family(
        "production sizes",
        True,
        "V = 151,936 and 248,320; 5,000 positions; top-k over 16,384 positions; with grad and under no_grad",
        production,
    ),
    Family("shifted logits", True, "student and teacher rows offset by ±300 or ±1e4 (opposite signs)", shifted_logits),
    Family(
        "injected primitives (2 vocab-parallel ranks)",
        True,
        "gather_fn / log_softmax_fn / kl_div_fn by keyword, as Megatron passes them; each rank holds half the "
        "vocabulary, so a candidate that does not call them is wrong",
        injected,
    ),
]

HARD_FAMILIES = [
    Family("extreme logits", False, "logits of ±1e2 … ±1e4 at T = 1", extreme_logits),
    Family("beta near an endpoint", False, "β ∈ {1e-6, 1e-3, 0.999, 1 − 1e-6}", beta_endpoints),
    Family(
        "FP16 under loss scaling",
        False,
        "FP16 student, loss × 2^16; no representable gradient entry zeroed",
        fp16_loss_scale,
    ),
    Family("partially -inf top-k rows", False, "some (not all) teacher log-probs −inf", partial_inf),
    Family("confident disagreement", False, "independent logits of std 10 and 30", confident_disagreement),
    Family(
        "nearly one-hot rows (logits / 1e-3)",
        False,
        "near-identical distributions divided by T = 1e-3 "
        "beforehand (scaled logits of thousands), β ∈ {0, 1e-6, 0.5, 1 − 1e-6, 1}",
        one_hot_rows,
    ),
    Family("vocab-parallel primitives", False, "log-softmax / KL over 2 vocabulary shards", vocab_parallel),
    Family(
        "confident rows near beta 1 (T = 0.05, V = 151,936)",
        False,
        "student and teacher confident on different tokens, |z|/T ≈ 250, β ∈ {0.98, 0.99, 0.999}",
        confident_near_one,
    ),
    Family(
        "BF16 gradient of total / num_valid",
        False,
        "a BF16 student's gradient under a non-power-of-two scale (num_valid 60 and 3) is rounded once",
        scaled_backward,
    ),
]

IDENTITY_FAMILY = "upstream identity (declared)"


def identity_family(pairs) -> Family:
    return Family(
        IDENTITY_FAMILY,
        True,
        f"bit-identical to the installed ms-swift on {', '.join(pairs)}",
        lambda form, quick: identity(form, quick, pairs),
    )


__all__ = ["Family", "REQUIRED_FAMILIES", "HARD_FAMILIES", "identity_family", "IDENTITY_FAMILY"]
