"""The loss measurements of ``gkd-bench``: inputs, the variants compared, and one forward+backward each.

Every case builds the same deterministic inputs from a seed (so separate worker processes see identical tensors)
and exposes ``step()``, one forward and backward of the loss normalised like the trainers do
(``total / num_valid``), with the gradient w.r.t. the student logits computed and then dropped.

Groups (the first case of each group is its baseline):

* ``topk``: teacher top-k log-probs ``[1, N, K]`` BF16 with their ids, student logits FP32 (a BF16 model output
  upcast, as Megatron's Float16Module delivers it). The student vocabulary is ``K`` (ids are a random permutation
  per row), so the gather and its backward scatter stay as small as the loss itself and the ratios measure the
  loss arithmetic, not a common ``[N, V]`` scatter. Variants: upstream ms-swift ``gkd_loss`` (native), the
  harness ``fp32`` paper and continuous variants, TRL's ``GKDTrainer.generalized_jsd_loss`` on the gathered
  tensors, and a naive variant that upcasts the whole input tensors to FP32 before calling upstream.
* ``full``: full-vocabulary BF16 student and teacher logits ``[1, N, V]``: upstream, harness ``fp32``, naive
  whole-tensor upcast.
* ``spot_topk`` / ``spot_full``: one harness ``fp32`` loss forward+backward on the group's inputs (baseline) and
  one FP64 spot check (loss and logit gradient in the run's precision and in FP64 on at most ``max_tokens``
  positions).
* ``wide``: the ``full`` inputs at the seed's vocabulary (V = 248,320): upstream and ``fp32``.
* the scaling groups (``--only scale``, :data:`SIZED_GROUPS`): ``full`` at 4× and 16× its N (N = 2,048 and 8,192
  at the default sizes) and ``topk`` at k = 8 and k = 512: upstream and ``fp32``. A case whose estimated peak
  memory does not fit the device (:func:`memory_guard`) is reported as not run, with the estimate.

:func:`loss_rows` measures these loss rows in the calling process on any device (the GPU proof imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from gkd_harness.harness.contract import (
    SPOT_GRAD_REL_L2,
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    SPOT_SIGN_MISMATCH,
)

BETA = 0.5
TEMPERATURE = 0.9
TEACHER_NOISE = 0.03


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one benchmark run."""

    topk_n: int = 16384
    topk_k: int = 64
    full_n: int = 512
    full_v: int = 151936
    spot_max_tokens: int = 256  # configs/monitor/default.yaml (see default_spot_max_tokens)
    mega_n: int = 128  # the Megatron call path (gkd_harness.bench.megatron), at V = full_v
    teacher_noise: float = TEACHER_NOISE  # full-vocabulary teacher = student + N(0, noise²), in BF16

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(topk_n=1024, topk_k=64, full_n=16, full_v=8192, spot_max_tokens=8, mega_n=8)


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def topk_inputs(sizes: Sizes, device: str, seed: int = 0):
    """Top-k mode inputs.

    Returns:
        ``(student [1, N, K] fp32, TeacherOutput(topk_logprobs [1, N, K] bf16, topk_indices [1, N, K] int64,
        labels [1, N]), labels [1, N])``; every position active.
    """
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    g = torch.Generator().manual_seed(seed)
    n, k = sizes.topk_n, sizes.topk_k
    student = (torch.randn(1, n, k, generator=g) * 2).bfloat16().float()
    teacher_logits = student + TEACHER_NOISE * torch.randn(1, n, k, generator=g)
    ids = torch.argsort(torch.rand(1, n, k, generator=g), dim=-1)
    # Slot j holds the teacher's log-prob of token ids[j], the token the gather picks from the student.
    teacher_lp = torch.gather(torch.log_softmax(teacher_logits, dim=-1), -1, ids).bfloat16()
    labels = torch.zeros(1, n, dtype=torch.long)
    to = TeacherOutput(topk_logprobs=teacher_lp.to(device), topk_indices=ids.to(device), labels=labels.to(device))
    return student.to(device), to, labels.to(device)


def full_inputs(sizes: Sizes, device: str, seed: int = 0):
    """Full-vocabulary inputs: ``(student [1, N, V] bf16, TeacherOutput(full_logits [1, N, V] bf16), labels)``."""
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    g = torch.Generator().manual_seed(seed)
    n, v = sizes.full_n, sizes.full_v
    student = torch.empty(1, n, v, dtype=torch.bfloat16)
    teacher = torch.empty(1, n, v, dtype=torch.bfloat16)
    for i in range(n):  # row by row: no [N, V] fp32 temporary
        row = torch.randn(v, generator=g) * 2
        student[0, i] = row.bfloat16()
        teacher[0, i] = (row + sizes.teacher_noise * torch.randn(v, generator=g)).bfloat16()
    labels = torch.zeros(1, n, dtype=torch.long)
    to = TeacherOutput(full_logits=teacher.to(device), labels=labels.to(device))
    return student.to(device), to, labels.to(device)


# ---------------------------------------------------------------------------
# Loss callables with the gkd_loss signature (student_logits, teacher_output, labels, beta, temperature)
# ---------------------------------------------------------------------------


def _upstream():
    from swift.rlhf_trainers.gkd_loss import gkd_loss

    return gkd_loss


def _harness(precision: str, beta_form: str = "paper"):
    from gkd_harness.harness.losses import make_gkd_loss

    return make_gkd_loss(precision, beta_form)


def _naive_upcast():
    """Upcast the whole input tensors to FP32 first, then upstream's arithmetic."""
    from swift.rlhf_trainers.gkd_loss import TeacherOutput, gkd_loss

    def loss(student_logits, teacher_output, labels, beta, temperature):
        up = lambda x: None if x is None else x.float()  # noqa: E731
        to = TeacherOutput(
            full_logits=up(teacher_output.full_logits),
            topk_logprobs=up(teacher_output.topk_logprobs),
            topk_indices=teacher_output.topk_indices,
            labels=teacher_output.labels,
        )
        return gkd_loss(student_logits.float(), to, labels, beta, temperature)

    return loss


def _trl():
    """TRL's ``GKDTrainer.generalized_jsd_loss`` on the student logits gathered at the teacher's top-k ids."""
    import os
    import warnings

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental.gkd.gkd_trainer import GKDTrainer

    def loss(student_logits, teacher_output, labels, beta, temperature):
        s = torch.gather(student_logits, -1, teacher_output.topk_indices)
        mean = GKDTrainer.generalized_jsd_loss(
            s, teacher_output.topk_logprobs, labels=labels, beta=beta, temperature=temperature, reduction="batchmean"
        )
        num_valid = (labels != -100).sum()
        return mean * num_valid, num_valid  # back to (total, num_valid) like gkd_loss

    return loss


def _proto(precision: str, beta_form: str = "paper"):
    """``make_gkd_loss`` of a candidate ``losses.py`` named by ``$GKD_BENCH_PROTO`` (``gkd-bench --proto``)."""
    import importlib.util
    import os
    import sys

    path = os.environ["GKD_BENCH_PROTO"]
    spec = importlib.util.spec_from_file_location("gkd_bench_proto_losses", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.make_gkd_loss(precision, beta_form)


LOSSES: Dict[str, Callable[[], Callable]] = {
    "proto_fp32": lambda: _proto("fp32", "paper"),
    "proto_continuous": lambda: _proto("fp32", "continuous"),
    "upstream": _upstream,
    "fp32": lambda: _harness("fp32", "paper"),
    "continuous": lambda: _harness("fp32", "continuous"),
    "fp64": lambda: _harness("fp64", "paper"),
    "trl": _trl,
    "naive_upcast": _naive_upcast,
}

# ---------------------------------------------------------------------------
# Spot check
# ---------------------------------------------------------------------------


def _capped(student_logits, teacher_output, labels, max_tokens: int):
    """The first ``max_tokens`` active positions as ``[1, m, ...]`` tensors (copies of those rows only)."""
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    mask = labels != -100
    s = student_logits[mask][:max_tokens].unsqueeze(0)
    t = teacher_output.select(teacher_output.labels != -100 if teacher_output.labels is not None else mask)
    sel = lambda x: None if x is None else x[:max_tokens].unsqueeze(0)  # noqa: E731
    to = TeacherOutput(
        full_logits=sel(t.full_logits),
        topk_logprobs=sel(t.topk_logprobs),
        topk_indices=sel(t.topk_indices),
        labels=sel(t.labels),
    )
    return s, to, sel(labels[mask])


def spot_check_fp64(
    student_logits,
    teacher_output,
    labels,
    beta: float,
    temperature: float,
    max_tokens: int,
    precision: str = "fp32",
    beta_form: str = "paper",
) -> Dict[str, float]:
    """One FP64 spot check: the run's loss and d loss/d student logits against FP64 on <= max_tokens positions.

    Used when ``gkd_harness.harness.rank.instrument`` provides no spot-check function. Returns the ``spot/*`` values.
    """
    from gkd_harness.harness.losses import make_gkd_loss

    s, to, lab = _capped(student_logits.detach(), teacher_output, labels, max_tokens)
    out = {}
    for key, prec in (("run", precision), ("fp64", "fp64")):
        x = s.detach().requires_grad_(True)
        total, nv = make_gkd_loss(prec, beta_form)(x, to, lab, beta, temperature)
        loss = total / nv.clamp(min=1)
        (grad,) = torch.autograd.grad(loss, x)
        out[key] = (loss.detach().double(), grad.double())
    (l_run, g_run), (l_64, g_64) = out["run"], out["fp64"]
    abs_err = (l_run - l_64).abs().item()
    return {
        SPOT_LOSS: l_run.item(),
        SPOT_LOSS_FP64: l_64.item(),
        SPOT_LOSS_ABS_ERR: abs_err,
        SPOT_LOSS_REL_ERR: abs_err / max(abs(l_64.item()), 1e-30),
        SPOT_GRAD_REL_L2: ((g_run - g_64).norm() / g_64.norm().clamp(min=1e-300)).item(),
        SPOT_SIGN_MISMATCH: float((l_run.item() < 0) != (l_64.item() < 0)),
    }


def resolve_spot_check(precision: str = "fp32", beta_form: str = "paper") -> tuple[Callable, str]:
    """The spot-check function to time: the e2e helper's ``gkd_harness.harness.rank.instrument.spot_check`` (what a training run
    calls) if it exists, else the local FP64 variant. Returns ``(fn, description)``; ``fn`` has
    :func:`spot_check_fp64`'s signature."""
    try:
        from gkd_harness.harness.rank.instrument import spot_check
    except ImportError:
        return (
            spot_check_fp64,
            "gkd_harness.bench.cases.spot_check_fp64 (gkd_harness.harness.rank.instrument.spot_check not available)",
        )
    from gkd_harness.harness.losses import make_gkd_loss_terms

    run_terms, ref_terms = make_gkd_loss_terms(precision, beta_form), make_gkd_loss_terms("fp64", beta_form)

    def fn(student_logits, teacher_output, labels, beta, temperature, max_tokens):
        return spot_check(run_terms, ref_terms, student_logits, teacher_output, labels, beta, temperature, max_tokens)

    return fn, f"gkd_harness.harness.rank.instrument.spot_check ({precision} vs fp64)"


def default_spot_max_tokens() -> int:
    """``monitor.spot_check.max_tokens`` of ``configs/monitor/default.yaml`` (256 if unreadable)."""
    from pathlib import Path

    try:
        import yaml

        cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/monitor/default.yaml").read_text())
        return int(cfg["spot_check"]["max_tokens"])
    except Exception:
        return 256


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------


@dataclass
class Case:
    """One measurement: a zero-argument ``step`` (one fwd+bwd or one spot check) and its loss value."""

    name: str
    step: Callable[[], object]
    value: Callable[[], float]
    reference: Optional[Callable[[], float]] = None
    note: str = ""


def _loss_case(name: str, loss_fn: Callable, student, to, labels, ref_fn: Optional[Callable] = None) -> Case:

    def run(grad: bool = True):
        x = student.detach().requires_grad_(grad)
        total, nv = loss_fn(x, to, labels, BETA, TEMPERATURE)
        loss = total / nv
        if grad:
            loss.backward()
            del x
        return loss.detach()

    def value() -> float:
        with torch.no_grad():
            return float(run(grad=False))

    ref = None
    if ref_fn is not None:

        def ref() -> float:
            with torch.no_grad():
                total, nv = ref_fn(student.detach(), to, labels, BETA, TEMPERATURE)
                return float((total / nv).double())

    return Case(name, run, value, ref)


def build_case(name: str, sizes: Sizes, device: str) -> Case:
    """Build the named case (``group/variant``) with its inputs on ``device``."""
    group, variant = name.split("/", 1)
    if group == "mega_tp1":
        step, value = tp1_case(variant, sizes, device)
        return Case(name, step, value, note="TP=1 vocab-parallel primitives (F.log_softmax, textbook KL), in-process")
    kind, sizes = group_kind_sizes(group, sizes)
    if kind in ("topk", "full"):
        student, to, labels = (topk_inputs if kind == "topk" else full_inputs)(sizes, device)
        ref = LOSSES["fp64"]() if variant == BASELINES[group].split("/")[1] and group in ("topk", "full") else None
        return _loss_case(name, LOSSES[variant](), student, to, labels, ref)
    if group in ("spot_topk", "spot_full"):
        student, to, labels = (topk_inputs if group == "spot_topk" else full_inputs)(sizes, device)
        if variant == "loss":
            return _loss_case(name, LOSSES["fp32"](), student, to, labels)
        fn, desc = resolve_spot_check()
        last = {}

        def check():
            last.update(fn(student, to, labels, BETA, TEMPERATURE, sizes.spot_max_tokens))
            return last

        def value() -> float:
            if not last:
                check()
            return float(last[SPOT_LOSS])

        return Case(name, check, value, note=f"{desc}, max_tokens={sizes.spot_max_tokens}")
    raise KeyError(name)


#: Loss groups measured at other sizes than their kind's: ``group -> (kind, overrides of the run's Sizes)``.
#: ``wide`` is the seed's vocabulary; ``small_v`` / ``small_n`` small shapes; the rest make the scaling table (N × 4,
#: × 16 of ``full_n``; k = 8, 512).
SIZED_GROUPS: Dict[str, tuple] = {
    "wide": ("full", lambda s: {"full_v": 248320}),
    "full_n4": ("full", lambda s: {"full_n": s.full_n * 4}),
    "full_n16": ("full", lambda s: {"full_n": s.full_n * 16}),
    "topk_k8": ("topk", lambda s: {"topk_k": 8}),
    "topk_k512": ("topk", lambda s: {"topk_k": 512}),
    # small shapes, where fixed per-block costs weigh most: a 32k vocabulary (Llama-2, Mistral) at N = 128, and
    # the seed's full vocabulary at N = 16 (a short micro-batch)
    "small_v": ("full", lambda s: {"full_n": 128, "full_v": 32768}),
    "small_n": ("full", lambda s: {"full_n": 16}),
    # issue 46: the 32k vocabulary with a nearer copy of the student as teacher (N(0, 0.003²) in BF16: most
    # teacher logits are the student's own BF16 value), and the seed's vocabulary at N = 64
    "small_v_copy": ("full", lambda s: {"full_n": 128, "full_v": 32768, "teacher_noise": 0.003}),
    "small_n64": ("full", lambda s: {"full_n": 64}),
}
SMALL_GROUPS = ("small_v", "small_n", "small_v_copy", "small_n64")
SCALE_GROUPS = ("full_n4", "full_n16", "topk_k8", "topk_k512")


def group_kind_sizes(group: str, sizes: Sizes) -> tuple:
    """``(kind, sizes)`` of a loss group: ``kind`` is ``topk``/``full``/``spot_topk``/``spot_full``, ``sizes`` the
    run's sizes with the group's overrides applied."""
    import dataclasses

    if group in SIZED_GROUPS:
        kind, over = SIZED_GROUPS[group]
        return kind, dataclasses.replace(sizes, **over(sizes))
    return group, sizes


def case_shape(name: str, sizes: Sizes) -> Dict[str, int]:
    """The problem size of a loss case: ``{"n", "v"}`` (full vocabulary) or ``{"n", "k"}`` (top-k)."""
    kind, sz = group_kind_sizes(name.split("/")[0], sizes)
    if kind.endswith("topk"):
        return {"n": sz.topk_n, "k": sz.topk_k}
    if kind.startswith("mega_"):
        return {"n": sz.mega_n, "v": sz.full_v}
    return {"n": sz.full_n, "v": sz.full_v}


#: Peak memory above the inputs per element of one ``[N, V]`` BF16 tensor, full vocabulary, measured with
#: gkd-bench (CPU, N = 512, V = 151,936: upstream 1,929 MiB, naive 4,451 MiB, fp32 ~450 MiB), with a margin.
#: Upstream keeps every 512-row chunk's activations for backward, so it grows with N like the others.
_FULL_BYTES_PER_ELEMENT = {"upstream": 28, "naive_upcast": 64, "fp32": 8, "continuous": 8, "fp64": 64}


def memory_guard(name: str, sizes: Sizes, device: str, available: Optional[int] = None) -> Optional[str]:
    """Why a full-vocabulary case would not fit (a sentence), or None when it fits or is not a full-vocab loss case.

    Estimate: the two BF16 inputs plus :data:`_FULL_BYTES_PER_ELEMENT` per element of one ``[N, V]`` tensor;
    it must stay under 3/4 of the memory available now (``MemAvailable`` on a CPU, free device memory on CUDA).
    """
    group, variant = name.split("/", 1)
    kind, sz = group_kind_sizes(group, sizes)
    if kind != "full" or variant not in _FULL_BYTES_PER_ELEMENT:
        return None
    elems = sz.full_n * sz.full_v
    need = 2 * 2 * elems + _FULL_BYTES_PER_ELEMENT[variant] * elems
    if available is None:
        available = _available_bytes(device)
    if available is None or need <= 0.75 * available:
        return None
    return (
        f"not run: needs ~{need / 2**30:.1f} GiB (inputs + estimated peak), "
        f"{available / 2**30:.1f} GiB available on {device}"
    )


def _available_bytes(device: str) -> Optional[int]:
    if str(device).startswith("cuda"):
        return int(torch.cuda.mem_get_info()[0])
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


LOSS_CASES = {
    "topk": ["upstream", "fp32", "continuous", "trl", "naive_upcast"],
    "full": ["upstream", "fp32", "naive_upcast"],
    "spot_topk": ["loss", "check"],
    "spot_full": ["loss", "check"],
    **{g: ["upstream", "fp32"] for g in SIZED_GROUPS},
    "mega_tp1": ["upstream", "fp32"],  # gkd_harness.bench.megatron (mega_tp2 runs 2 ranks: gkd-bench only)
}
BASELINES = {g: f"{g}/{v[0]}" for g, v in LOSS_CASES.items()}


def nan_to_none(x: float) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


# ---------------------------------------------------------------------------
# In-process loss rows (the GPU proof imports this)
# ---------------------------------------------------------------------------

#: The groups :func:`loss_rows` measures by default: the goal rows, the seed's vocabulary and the scaling table.
LOSS_ROW_GROUPS = ("topk", "full", "wide", "mega_tp1") + SCALE_GROUPS


def loss_rows(
    device: str = "cuda", groups=LOSS_ROW_GROUPS, sizes: Optional[Sizes] = None, warmup: int = 2, reps: int = 5
) -> list:
    """gkd-bench's loss rows measured in this process on ``device`` (no worker processes, so it runs wherever
    ``gkd_harness.bench.cases`` imports, e.g. a bare CUDA node).

    Each case: ``warmup`` untimed forward+backward calls, ``reps`` timed ones (CUDA synchronised), then one more
    for the peak memory (``torch.cuda.max_memory_allocated`` above the level before the call on CUDA; on a CPU
    the process's peak resident set, which only rises, so CPU peaks here are upper bounds; ``gkd-bench``
    measures them in fresh processes). Sizes default to :class:`Sizes` on CUDA and :meth:`Sizes.quick` on a CPU.

    Returns:
        one dict per case, in order: ``case`` (``group/variant``), ``shape`` (``{"n", "v"}`` or ``{"n", "k"}``),
        ``ms`` (median), ``ms_all``, ``peak_mib``, ``loss``, and against the group's upstream row ``time_ratio``
        and ``mem_ratio``; ``skipped`` (a reason) instead of figures for a case that does not fit
        (:func:`memory_guard`) or whose package is absent (TRL); ``error`` for a case that failed.
    """
    import gc
    import statistics

    from gkd_harness.bench import measure as bm

    if sizes is None:
        sizes = Sizes() if str(device).startswith("cuda") else Sizes.quick()
    rows = []
    for group in groups:
        base = None
        for variant in LOSS_CASES[group]:
            name = f"{group}/{variant}"
            row = {"case": name, "shape": case_shape(name, sizes)}
            reason = memory_guard(name, sizes, device)
            if reason:
                rows.append({**row, "skipped": reason})
                continue
            try:
                case = build_case(name, sizes, device)
                times = bm.time_calls(case.step, device, warmup, reps)["wall_s"]
                peak = (
                    bm.cuda_peak_mib(case.step) if str(device).startswith("cuda") else bm.peak_rss_delta_mib(case.step)
                )
                row.update(
                    ms=statistics.median(times) * 1e3,
                    ms_all=[t * 1e3 for t in times],
                    peak_mib=peak,
                    loss=nan_to_none(case.value()),
                )
            except ModuleNotFoundError as e:  # a package absent on a bare image (TRL)
                row["skipped"] = f"{type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001 - one failed case is a row, not the end of the proof
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            finally:
                case = None
                gc.collect()
                if str(device).startswith("cuda"):
                    torch.cuda.empty_cache()
            if variant == LOSS_CASES[group][0]:
                base = row
            elif base is not None and "ms" in row and "ms" in base:
                row["time_ratio"] = row["ms"] / base["ms"]
                if row.get("peak_mib") and base.get("peak_mib"):
                    row["mem_ratio"] = row["peak_mib"] / base["peak_mib"]
            rows.append(row)
    return rows


# ------------------------------------------------------------------ the loss on Megatron's call path (mega_tp1)
#: The Megatron-path groups and their variants (the first is the baseline).
MEGATRON_CASES = {"mega_tp1": ["upstream", "fp32"], "mega_tp2": ["upstream", "fp32"]}


def megatron_inputs(n: int, v: int, seed: int = 0):
    """``(student [1, n, v] fp32, teacher [1, n, v] bf16, labels [1, n])``, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(seed)
    student = torch.empty(1, n, v, dtype=torch.float32)
    teacher = torch.empty(1, n, v, dtype=torch.bfloat16)
    for i in range(n):  # row by row: no second [N, V] fp32 temporary
        row = (torch.randn(v, generator=g) * 2).bfloat16().float()
        student[0, i] = row
        teacher[0, i] = (row + TEACHER_NOISE * torch.randn(v, generator=g)).bfloat16()
    return student, teacher, torch.zeros(1, n, dtype=torch.long)


def tp1_log_softmax(x: torch.Tensor) -> torch.Tensor:
    """``vocab_parallel_log_softmax`` at TP=1."""
    return torch.nn.functional.log_softmax(x, dim=-1)


def tp1_kl_div(input_log: torch.Tensor, target_log: torch.Tensor) -> torch.Tensor:
    """``vocab_parallel_kl_div`` at TP=1 (its all-reduce skipped)."""
    return (torch.exp(target_log) * (target_log - input_log)).sum(dim=-1)


def megatron_variant_loss(variant: str) -> Callable:
    """The ``gkd_loss`` of a bench variant (``LOSSES``)."""
    return LOSSES[variant]()


def megatron_step(
    loss_fn: Callable, student, teacher_output, labels, log_softmax_fn, kl_div_fn
) -> Callable[[], object]:
    """One forward + backward of ``total / num_valid`` with the injected primitives, as the Megatron trainer calls."""

    def step():
        x = student.detach().requires_grad_(True)
        total, nv = loss_fn(
            x, teacher_output, labels, BETA, TEMPERATURE, log_softmax_fn=log_softmax_fn, kl_div_fn=kl_div_fn
        )
        loss = total / nv
        loss.backward()
        return loss.detach()

    return step


def tp1_case(variant: str, sizes: Sizes, device: str = "cpu"):
    """``(step, value)`` of ``mega_tp1/<variant>`` in this process, inputs on ``device``."""
    from swift.rlhf_trainers.gkd_loss import TeacherOutput

    student, teacher, labels = (x.to(device) for x in megatron_inputs(sizes.mega_n, sizes.full_v))
    to = TeacherOutput(full_logits=teacher, labels=labels)
    step = megatron_step(megatron_variant_loss(variant), student, to, labels, tp1_log_softmax, tp1_kl_div)
    return step, lambda: float(step())
