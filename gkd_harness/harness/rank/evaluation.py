"""The held-out evaluation: the student against the teacher on a split training never sees (``monitor.eval``).

ms-swift runs its own evaluation loop on ``--val_dataset`` every ``--eval_steps`` steps (the launcher passes both,
``gkd_harness.harness.launcher.swift_argv``): the GKD trainer's ``prediction_step`` calls ``gkd_loss`` under ``torch.no_grad``.
The harness adds what that loop lacks:

- :class:`EvalTap` sits between the dtype boundary and the loss, so it sees the logits **as they reach the loss**.
  On a loss call without a graph (the evaluation loop) it adds the FP64 sums of :func:`eval_sums` and answers with
  the run's bare loss (the instrument's training counters are left alone); in training it passes the call on.
- :meth:`EvalTap.finish` turns the sums into the ``eval/*`` metrics (all-reduced over the ranks first, each TP
  group counted once) and resets them; the HF hook (:func:`install_hf_hooks`) adds them to the loop's metrics, so
  they are logged with ``eval_loss`` at the same step and reach ``metrics.jsonl`` and wandb through the harness
  callback. On Megatron the harness callback's ``on_eval_begin`` / ``on_eval_end`` reset and finish them.
- The harness callback asks for one more evaluation at the last step (``gkd_harness.harness.rank.callbacks``).

All metrics are token-weighted means over the active positions of the split: the generalized JSD at the run's
β, beta form and temperature; forward KL(T‖S) and reverse KL(S‖T) of the temperature-scaled distributions; and
the fraction of positions where the student's argmax equals the teacher's.

- **Full-vocabulary teacher**: the distributions over the whole vocabulary (vocabularies aligned as upstream does).
- **Top-k teacher** (``gkd.topk``): the divergences on the teacher's top-k support, both sides renormalised over
  those k ids, exactly as the loss sees them (the student's logits gathered at the teacher's ids, ``log_softmax``
  over k); positions whose k log-probs are all ``-inf`` are dropped, as upstream does. Top-1 agreement compares
  the student's argmax over the *whole* vocabulary with the teacher's top-1 id (known exactly from its top-k).
  These values are comparable between runs with the same k (original vs patched), not with full-vocabulary ones.
- **Megatron tensor parallelism** (TP > 1): the logits reach the loss sharded along the vocabulary. The
  log-softmax normalisers, the vocabulary sums and the argmax are reduced over the TP group (max, sum, and the
  lowest global id among the shards' maxima: ``torch.argmax``'s first-maximum rule), so every TP rank holds the
  full-vocabulary values; :meth:`EvalTap.finish` counts them once (TP rank 0's sums).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch

from gkd_harness.harness.contract import (
    CONTINUOUS,
    EVAL_FORWARD_KL,
    EVAL_JSD,
    EVAL_REVERSE_KL,
    EVAL_TOKENS,
    EVAL_TOP1_AGREEMENT,
    PAPER,
)
from gkd_harness.harness.rank.parallel_state import tensor_parallel_group
from gkd_harness.harness.store.captures import capture_rows

F64 = torch.float64
#: The order of the sums in :func:`eval_sums`'s vector.
SUM_FIELDS = (EVAL_JSD, EVAL_FORWARD_KL, EVAL_REVERSE_KL, EVAL_TOP1_AGREEMENT, EVAL_TOKENS)


class VocabShards:
    """Reductions over the vocabulary dimension of ``[N, V_local]`` rows: local when ``group`` is None, else over
    the tensor-parallel ``group`` whose rank ``rank`` holds global ids ``[rank·V_local, (rank+1)·V_local)``
    (Megatron's vocab-parallel output layer)."""

    def __init__(self, group=None, rank: int = 0):
        self.group, self.rank = group, rank

    def _reduce(self, x: torch.Tensor, op) -> torch.Tensor:
        if self.group is not None:
            import torch.distributed as dist

            dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=self.group)
        return x

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(x.sum(-1), "SUM")

    def log_softmax(self, x: torch.Tensor) -> torch.Tensor:
        m = self._reduce(x.max(-1, keepdim=True).values, "MAX")
        return x - m - self._reduce((x - m).exp().sum(-1, keepdim=True), "SUM").log()

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """Global ids ``[N]`` of the first maximum of each row over the whole vocabulary."""
        value, index = x.max(-1)
        if self.group is None:
            return index
        index = index + self.rank * x.shape[-1]
        best = self._reduce(value.clone(), "MAX")
        none = torch.full_like(index, torch.iinfo(index.dtype).max)
        return self._reduce(torch.where(value == best, index, none), "MIN")


LOCAL = VocabShards()


def tensor_parallel() -> VocabShards:
    """The :class:`VocabShards` of this process's Megatron TP group (TP > 1), else the local one."""
    group, rank, size = tensor_parallel_group()
    return LOCAL if size == 1 else VocabShards(group, rank)


def _kl_rows(p_log: torch.Tensor, q_log: torch.Tensor, vocab: VocabShards) -> torch.Tensor:
    """KL(P‖Q) per row ``[N, V] -> [N]`` in FP64 (a term with P = 0 is 0)."""
    p = p_log.exp()
    return vocab.sum(torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)))


def _jsd(ls, lt, fkl, rkl, beta, beta_form, vocab):
    if beta == 0:
        return fkl
    if beta == 1:
        return rkl
    lm = torch.logaddexp(ls + math.log1p(-beta), lt + math.log(beta))  # log((1-β)·S + β·T)
    kl_t, kl_s = _kl_rows(lt, lm, vocab), _kl_rows(ls, lm, vocab)
    if beta_form == PAPER:
        return beta * kl_t + (1 - beta) * kl_s
    if beta_form == CONTINUOUS:
        return (1 - beta) * kl_t + beta * kl_s
    raise ValueError(f"loss.beta_form: unknown {beta_form!r}")


def divergences(
    s_logits: torch.Tensor,
    t_logits: torch.Tensor,
    beta: float,
    beta_form: str,
    temperature: float,
    vocab: VocabShards = LOCAL,
) -> Dict[str, torch.Tensor]:
    """Per-position FP64 values for logits ``[N, V]`` (a vocabulary shard of each under ``vocab``'s TP group):
    ``jsd``, ``forward_kl``, ``reverse_kl`` (each ``[N]``) and ``top1`` (``[N]`` 1.0 where the argmaxes agree)."""
    ls = vocab.log_softmax(s_logits.detach().to(F64) / temperature)
    lt = vocab.log_softmax(t_logits.detach().to(F64) / temperature)
    fkl, rkl = _kl_rows(lt, ls, vocab), _kl_rows(ls, lt, vocab)
    top1 = (vocab.argmax(s_logits.detach()) == vocab.argmax(t_logits.detach())).to(F64)
    return {"jsd": _jsd(ls, lt, fkl, rkl, beta, beta_form, vocab), "forward_kl": fkl, "reverse_kl": rkl, "top1": top1}


def topk_divergences(
    s_logits: torch.Tensor,
    s_topk: torch.Tensor,
    t_topk_logprobs: torch.Tensor,
    t_topk_ids: torch.Tensor,
    beta: float,
    beta_form: str,
    temperature: float,
    vocab: VocabShards = LOCAL,
) -> Dict[str, torch.Tensor]:
    """As :func:`divergences` for a top-k teacher: the divergences between the student's logits at the teacher's
    ids ``s_topk [N, k]`` and the teacher's ``t_topk_logprobs [N, k]``, both renormalised over the k ids (the
    loss's view); top-1 compares the student's argmax over its (sharded) full rows ``s_logits [N, V]`` with the
    teacher's top-1 id."""
    ls = torch.log_softmax(s_topk.detach().to(F64) / temperature, -1)
    lt = torch.log_softmax(t_topk_logprobs.detach().to(F64) / temperature, -1)
    fkl, rkl = _kl_rows(lt, ls, LOCAL), _kl_rows(ls, lt, LOCAL)
    t_top = t_topk_ids.gather(-1, t_topk_logprobs.argmax(-1, keepdim=True)).squeeze(-1)
    top1 = (vocab.argmax(s_logits.detach()) == t_top.to(s_logits.device)).to(F64)
    return {"jsd": _jsd(ls, lt, fkl, rkl, beta, beta_form, LOCAL), "forward_kl": fkl, "reverse_kl": rkl, "top1": top1}


def active_rows(
    student_logits: torch.Tensor, teacher_output, labels: torch.Tensor, sharded: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The active positions as the loss pairs them (``gkd_harness.harness.store.captures.capture_rows``, as the spot check and
    captures do): student ``[B, S, V]`` rows where ``labels != -100``, teacher ``full_logits`` ``[B, S', V']`` rows
    where its own labels are; vocabularies aligned as upstream does (the shorter side takes the other side's logits
    for the extra ids). Returns ``([N, V*], [N, V*])``. With ``sharded`` (TP > 1) the rows are vocabulary shards,
    which cannot be aligned: their widths must agree."""
    s_ids, t_ids, _ = capture_rows(teacher_output, labels, None)
    t_full = teacher_output.full_logits
    s = student_logits.reshape(-1, student_logits.shape[-1])[s_ids]
    t = t_full.reshape(-1, t_full.shape[-1])[t_ids]
    vs, vt = s.shape[-1], t.shape[-1]
    if vs != vt and sharded:
        raise ValueError(f"eval: student and teacher vocabulary shards differ under tensor parallelism ({vs} vs {vt})")
    if vs < vt:
        s = torch.cat([s, t[:, vs:].to(s.dtype)], -1)
    elif vt < vs:
        t = torch.cat([t, s[:, vt:].to(t.dtype)], -1)
    return s, t


def eval_sums(
    student_logits,
    teacher_output,
    labels,
    beta: float,
    temperature: float,
    beta_form: str,
    vocab: VocabShards = LOCAL,
    gather_fn: Optional[Callable] = None,
) -> torch.Tensor:
    """FP64 ``[5]`` sums over one loss call's active positions, in :data:`SUM_FIELDS` order (the last is the
    count). ``teacher_output`` is ms-swift's ``TeacherOutput``: ``full_logits``, or ``topk_logprobs`` /
    ``topk_indices`` (the student is then gathered at the ids with ``gather_fn``, the call's own: TP-aware under
    Megatron); and the shifted ``labels``. Under TP (``vocab``) the logits are this rank's vocabulary shard."""
    topk = getattr(teacher_output, "full_logits", None) is None
    if topk:  # the pairing drops positions with no covered id, as upstream does
        s_ids, t_rows, _ = capture_rows(teacher_output, labels, None)
        k = teacher_output.topk_indices.shape[-1]
        s = student_logits.reshape(-1, student_logits.shape[-1])[s_ids]
        t_lp = teacher_output.topk_logprobs.reshape(-1, k)[t_rows]
        t_ids = teacher_output.topk_indices.reshape(-1, k)[t_rows]
    else:
        s, t = active_rows(student_logits, teacher_output, labels, sharded=vocab.group is not None)
    if s.shape[0] == 0:
        return torch.zeros(len(SUM_FIELDS), dtype=F64, device=student_logits.device)
    if topk:
        from swift.rlhf_trainers.gkd_loss import default_gather  # the loss's own default

        s_k = (gather_fn or default_gather)(s.detach(), t_ids)
        d = topk_divergences(s, s_k, t_lp, t_ids, beta, beta_form, temperature, vocab)
    else:
        d = divergences(s, t, beta, beta_form, temperature, vocab)
    return torch.stack(
        [
            d["jsd"].sum(),
            d["forward_kl"].sum(),
            d["reverse_kl"].sum(),
            d["top1"].sum(),
            d["jsd"].new_tensor(float(s.shape[0])),
        ]
    )


def metrics_from_sums(sums) -> Dict[str, float]:
    """The ``eval/*`` metrics (means; ``eval/tokens`` the count) from :func:`eval_sums` totals."""
    values = [float(v) for v in sums]
    n = values[-1]
    out = {name: (v / n if n else math.nan) for name, v in zip(SUM_FIELDS[:-1], values[:-1])}
    out[EVAL_TOKENS] = n
    return out


class EvalTap:
    """The loss the dtype boundary calls: in training ``inner`` (the instrument or the bare loss); on a loss call
    without a graph (ms-swift's evaluation loop) it accumulates :func:`eval_sums` and returns ``bare``'s loss.

    ``bare``: the run's loss variant, uninstrumented; ``beta_form``: the run's ``loss.beta_form``.
    """

    def __init__(self, inner: Callable, bare: Callable, beta_form: str):
        self.inner, self.bare, self.beta_form = inner, bare, beta_form
        self.sums: Optional[torch.Tensor] = None

    @staticmethod
    def evaluating(student_logits: torch.Tensor) -> bool:
        return not torch.is_grad_enabled() and not student_logits.requires_grad

    def __call__(self, student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        if not self.evaluating(student_logits):
            return self.inner(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)
        from gkd_harness.harness.rank.instrument import loss_kwargs

        gather = loss_kwargs(args, kwargs).get("gather_fn")
        add = eval_sums(
            student_logits,
            teacher_output,
            labels,
            float(beta),
            float(temperature),
            self.beta_form,
            tensor_parallel(),
            gather,
        )
        self.sums = add if self.sums is None else self.sums + add.to(self.sums.device)
        return self.bare(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)

    def finish(self, group=None) -> Dict[str, float]:
        """The ``eval/*`` metrics of the evaluation since the last call, summed over the ranks of ``group`` (a
        collective: every rank calls it), then reset. ``{}`` when no rank saw an evaluated position.

        Under TP > 1 every rank of a TP group holds the same (TP-reduced) sums: only TP rank 0's are counted."""
        import torch.distributed as dist

        sums = self.sums
        self.sums = None
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            device = sums.device if sums is not None else _collective_device()
            if sums is None or tensor_parallel().rank != 0:
                sums = torch.zeros(len(SUM_FIELDS), dtype=F64, device=device)
            dist.all_reduce(sums, group=group)
        if sums is None or float(sums[-1]) == 0:
            return {}
        return metrics_from_sums(sums.tolist())


def _collective_device() -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def find_tap(loss: Callable) -> Optional[EvalTap]:
    """The :class:`EvalTap` behind the installed loss (the dtype boundary's ``loss``), if any."""
    inner = getattr(loss, "loss", loss)
    return inner if isinstance(inner, EvalTap) else None


def install_hf_hooks(tap: EvalTap) -> bool:
    """Wrap the HF GKD trainer's ``evaluation_loop`` so its metrics carry the ``eval/*`` values of the pass."""
    from swift.rlhf_trainers.gkd_trainer import GKDTrainer

    if getattr(GKDTrainer.evaluation_loop, "_gkd_harness", False):
        return False
    original = GKDTrainer.evaluation_loop

    def evaluation_loop(self, *args, **kwargs):
        tap.sums = None
        output = original(self, *args, **kwargs)
        output.metrics.update(tap.finish())
        return output

    setattr(evaluation_loop, "_gkd_harness", True)
    GKDTrainer.evaluation_loop = evaluation_loop
    return True


__all__ = [
    "SUM_FIELDS",
    "VocabShards",
    "LOCAL",
    "tensor_parallel",
    "divergences",
    "topk_divergences",
    "active_rows",
    "eval_sums",
    "metrics_from_sums",
    "EvalTap",
    "find_tap",
    "install_hf_hooks",
]
