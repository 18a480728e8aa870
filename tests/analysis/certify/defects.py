"""Candidate files for the certificate's tests: the worked example (examples/candidates/good_promote_first.py, a
correct promote-first fix) or the installed upstream ``gkd_loss.py``, with one edit each, of a kind a pull request
could contain. :func:`write` returns the file's path."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[3]
GOOD = REPO / "examples" / "candidates" / "good_promote_first.py"

_VALIDATE = "    teacher_output.validate()\n"
_CALLER_PROMOTE = (
    "        s_logits, t_logits = _promote(s_active, t_active.full_logits)  # before alignment and temperature\n"
)
_JSD_LOOP = (
    "        s_log = log_softmax_fn(s_logits[start:end])\n        t_log = log_softmax_fn(t_logits[start:end])\n\n"
    "        if beta == 0:\n            jsd = kl_div_fn(s_log, t_log)\n        elif beta == 1:\n"
    "            jsd = kl_div_fn(t_log, s_log)\n        else:\n"
    "            m_log = torch.logsumexp(torch.stack([s_log + log_1_minus_beta, t_log + log_beta]), dim=0)\n"
    "            jsd = beta_t * kl_div_fn(m_log, t_log) + (1 - beta_t) * kl_div_fn(m_log, s_log)\n"
)

#: name -> (base, [(old, new), ...]); base "good" or "upstream".
EDITS: Dict[str, Tuple[str, List[Tuple[str, str]]]] = {
    # issue 30, reproduction 1: a "stabilising" in-place shift of the caller's teacher logits
    "in_place_teacher_shift": (
        "good",
        [
            (
                _VALIDATE,
                _VALIDATE
                + (
                    "    if teacher_output.full_logits is not None:\n"
                    "        teacher_output.full_logits.sub_(teacher_output.full_logits.amax(dim=-1, keepdim=True))\n"
                ),
            )
        ],
    ),
    # reproduction 2: F.log_softmax and its own KL where ms-swift passes log_softmax_fn / kl_div_fn
    "ignores_primitives": (
        "good",
        [
            (
                _JSD_LOOP,
                _JSD_LOOP.replace("log_softmax_fn(", "F.log_softmax(")
                .replace("[start:end])", "[start:end], dim=-1)")
                .replace("kl_div_fn(", "_own_kl("),
            ),
            (
                "def default_gather(",
                "def _own_kl(a, b):\n    return (b.exp() * (b - a)).sum(-1)\n\n\ndef default_gather(",
            ),
        ],
    ),
    # reproduction 3: the first bug report's wording: promote both sides right before `/ temperature`, after
    # upstream's _align_vocab
    "report_wording": (
        "good",
        [
            (
                _CALLER_PROMOTE,
                "        s_logits, t_logits = s_active, t_active.full_logits\n"
                "        s_logits, t_logits = _align_vocab(s_logits, t_logits)\n",
            ),
            (
                "    s_logits = s_logits / temperature\n",
                "    s_logits, t_logits = _promote(s_logits, t_logits)\n    s_logits = s_logits / temperature\n",
            ),
        ],
    ),
    # β as a BF16 tensor
    "beta_bf16": (
        "good",
        [
            (
                "        beta_t = torch.tensor(beta, dtype=s_logits.dtype, device=s_logits.device)\n",
                "        beta_t = torch.tensor(beta, dtype=torch.bfloat16, device=s_logits.device)"
                ".to(s_logits.dtype)\n",
            )
        ],
    ),
    # the total divided by num_valid inside the loss
    "mean_not_sum": (
        "good",
        [("    return total, num_valid\n", "    return total / max(int(num_valid), 1), num_valid\n")],
    ),
    # num_valid counts every position
    "wrong_num_valid": (
        "good",
        [("    return total, num_valid\n", "    return total, torch.tensor(int(labels.numel()))\n")],
    ),
}


_PROMOTE = "    dtype = torch.float32\n"
_EXTRACT = "    s_active, t_active, num_valid = extract_active(student_logits, teacher_output, labels)\n"
_SIGNATURE = (
    "def gkd_loss(\n"
    "    student_logits: torch.Tensor,\n"
    "    teacher_output: TeacherOutput,\n"
    "    labels: torch.Tensor,\n"
    "    beta: float,\n"
    "    temperature: float,\n"
    "    gather_fn: Callable = default_gather,\n"
    "    log_softmax_fn: Callable = default_log_softmax,\n"
    "    kl_div_fn: Callable = default_kl_div,\n"
    "    chunk_size: int = 512,\n"
    ") -> Tuple[torch.Tensor, torch.Tensor]:\n"
)
_CALL_ARGS = (
    "student_logits, teacher_output, labels, beta, temperature, gather_fn, log_softmax_fn, kl_div_fn, chunk_size"
)
_CALLER_PROMOTE_LINE = (
    "        s_logits, t_logits = _promote(s_active, t_active.full_logits)  # before alignment and temperature\n"
)

#: Issue 37's classes: each a one-change copy of the good worked example, of a kind a pull request could contain.
#: name -> (base, edits, the family that must fail, the recognised cause or None).
ISSUE_37: Dict[str, Tuple[str, List[Tuple[str, str]], str, object]] = {
    # sizes
    "no_promotion_over_4096_positions": (
        "good",
        [
            (
                _PROMOTE,
                "    if tensors[0].dim() == 2 and tensors[0].shape[0] > 4096:\n        return tensors\n" + _PROMOTE,
            )
        ],
        "production sizes",
        None,
    ),
    "no_promotion_over_65536_vocab": (
        "good",
        [(_PROMOTE, "    if tensors[0].shape[-1] > 65536:\n        return tensors\n" + _PROMOTE)],
        "production sizes",
        None,
    ),
    "drops_positions_over_1024": (
        "good",
        [
            (
                _EXTRACT,
                _EXTRACT + "    if s_active.shape[0] >= 1024:\n"
                "        g = torch.Generator().manual_seed(int(s_active.shape[0]))\n"
                "        keep = torch.rand(s_active.shape[0], generator=g) >= 0.001\n"
                "        s_active, t_active = s_active[keep], t_active.select(keep)\n",
            )
        ],
        "production sizes",
        None,
    ),
    # call mode
    "no_promotion_under_no_grad": (
        "good",
        [(_PROMOTE, "    if not torch.is_grad_enabled():\n        return tensors\n" + _PROMOTE)],
        "production sizes",
        "the value depends on the autograd mode",
    ),
    # the contract
    "num_valid_int": (
        "good",
        [("    return total, num_valid\n", "    return total, int(num_valid)\n")],
        "the contract",
        "num_valid is not a tensor",
    ),
    "empty_partition_constant_zero": (
        "good",
        [
            (
                "        return s_logits.sum()  # Keep the empty partition connected to the student graph.\n",
                "        return s_logits.new_zeros(())\n",
            )
        ],
        "the contract",
        "an empty partition (or a path) returns a total outside the student's graph",
    ),
    "swallows_exceptions": (
        "good",
        [
            (
                _SIGNATURE,
                _SIGNATURE + f"    try:\n        return _gkd_loss({_CALL_ARGS})\n"
                "    except Exception:\n        return student_logits.sum() * 0, torch.tensor(0)\n\n\n"
                + _SIGNATURE.replace("def gkd_loss(", "def _gkd_loss("),
            )
        ],
        "the contract",
        "swallows exceptions",
    ),
    # global state
    "sets_default_dtype": (
        "good",
        [
            (
                "    teacher_output.validate()\n",
                "    teacher_output.validate()\n    torch.set_default_dtype(torch.float64)\n",
            )
        ],
        "mixed FP32/BF16 (the defect)",
        "changes global torch state (default dtype torch.float32 -> torch.float64)",
    ),
    "reseeds_rng": (
        "good",
        [("    teacher_output.validate()\n", "    teacher_output.validate()\n    torch.manual_seed(0)\n")],
        "mixed FP32/BF16 (the defect)",
        "changes global torch state (RNG state)",
    ),
    # the exported β
    "silent_continuous": (
        "good",
        [
            (
                "            jsd = beta_t * kl_div_fn(m_log, t_log) + (1 - beta_t) * kl_div_fn(m_log, s_log)\n",
                "            jsd = (1 - beta_t) * kl_div_fn(m_log, t_log) + beta_t * kl_div_fn(m_log, s_log)\n",
            )
        ],
        "beta 0, 0.5, 1 and interior",
        None,
    ),
    # causes that must not be named
    "mean_clamp_count": (
        "good",
        [("    return total, num_valid\n", "    return total / num_valid.clamp(min=1), num_valid\n")],
        "injected primitives (2 vocab-parallel ranks)",
        "a mean instead of a sum",
    ),
    "restored_in_place_shift": (
        "good",
        [
            (
                "    teacher_output.validate()\n",
                "    teacher_output.validate()\n"
                "    saved = None\n"
                "    if teacher_output.full_logits is not None:\n"
                "        saved = teacher_output.full_logits.clone()\n"
                "        teacher_output.full_logits.sub_(teacher_output.full_logits.amax(dim=-1, keepdim=True))\n",
            ),
            (
                "    return total, num_valid\n",
                "    if saved is not None:\n        teacher_output.full_logits.copy_(saved)  # restored bit for bit\n"
                "    return total, num_valid\n",
            ),
        ],
        "mixed FP32/BF16 (the defect)",
        "writes into an input tensor (teacher_output.full_logits (in place, even if restored afterwards))",
    ),
    # a cause from the pattern (issue 40, item 9): the bug report's snippet promotes the top-k branch only
    "promotes_topk_only": (
        "good",
        [
            (_CALLER_PROMOTE_LINE, "        s_logits, t_logits = s_active, t_active.full_logits\n"),
            (
                "    s_logits, t_logits = _promote(s_logits, t_logits)\n    N = s_logits.size(0)\n",
                "    N = s_logits.size(0)\n",
            ),
        ],
        "mixed FP32/BF16 (the defect)",
        None,
    ),
    # a speed regression: one position per chunk
    "one_position_chunks": (
        "good",
        [
            (
                "    for start in range(0, N, chunk_size):\n        end = min(start + chunk_size, N)\n",
                "    for start in range(0, N, 1):\n        end = min(start + 1, N)\n",
            )
        ],
        "",
        None,
    ),
}

#: Candidates whose failures must not be explained as "a mean instead of a sum" (issue 37, item 14), under --strict.
NOT_A_MEAN: Dict[str, Tuple[str, List[Tuple[str, str]]]] = {
    "beta_clamp": (
        "good",
        [
            (
                "    s_logits, t_logits = _promote(s_logits, t_logits)\n    N = s_logits.size(0)\n",
                "    beta = min(max(beta, 1e-3), 1 - 1e-3)\n"
                "    s_logits, t_logits = _promote(s_logits, t_logits)\n    N = s_logits.size(0)\n",
            )
        ],
    ),
    "harmless_jsd_clamp": (
        "good",
        [("        total = total + jsd.sum()\n", "        total = total + jsd.clamp(min=0).sum()\n")],
    ),
}
EDITS.update(NOT_A_MEAN)

#: Issue 44's causes named without evidence, each a one-change copy of the good example: name -> (base, edits, the
#: family that must fail, the cause it must get, the cause the old code named wrongly).
ISSUE_44: Dict[str, Tuple[str, List[Tuple[str, str]], str, str, str]] = {
    # the teacher detached after _align_vocab: its pad columns (the student's logits) lose their gradient
    "detaches_teacher": (
        "good",
        [
            (
                "        s_logits, t_logits = _align_vocab(s_logits, t_logits)\n",
                "        s_logits, t_logits = _align_vocab(s_logits, t_logits)\n        t_logits = t_logits.detach()\n",
            )
        ],
        "vocab mismatch",
        "the teacher detached after _align_vocab",
        "promotion after alignment",
    ),
    # a sign error in the mixture's weights: near 0 on near-identical distributions, as a mean over many rows is
    "sign_error": (
        "good",
        [
            (
                "jsd = beta_t * kl_div_fn(m_log, t_log) + (1 - beta_t)",
                "jsd = beta_t * kl_div_fn(m_log, t_log) - (1 - beta_t)",
            )
        ],
        "production sizes",
        "",
        "a mean instead of a sum",
    ),
    # a stale per-shape cache: the first result of each shape is returned for every later call of that shape
    "stale_shape_cache": (
        "good",
        [
            (
                _SIGNATURE,
                "_STALE = {}\n\n\n" + _SIGNATURE + "    key = tuple(student_logits.shape)\n"
                "    if key in _STALE:\n        total, num_valid = _STALE[key]\n"
                "        return total + student_logits.sum() * 0, num_valid\n"
                f"    total, num_valid = _gkd_loss({_CALL_ARGS})\n"
                "    _STALE[key] = (total.detach(), num_valid)\n    return total, num_valid\n\n\n"
                + _SIGNATURE.replace("def gkd_loss(", "def _gkd_loss("),
            )
        ],
        "production sizes",
        "",
        "the value depends on the autograd mode",
    ),
    # the teacher cast to the student's dtype instead of both promoted: a BF16 student stays in BF16
    "casts_teacher_to_student": (
        "good",
        [
            (
                _PROMOTE + "    for t in tensors:\n        dtype = torch.promote_types(dtype, t.dtype)\n",
                "    dtype = tensors[0].dtype\n",
            )
        ],
        "dtype pairs",
        "the arithmetic stays in a BF16/FP16 student's dtype",
        "",
    ),
}
EDITS.update({k: (v[0], v[1]) for k, v in ISSUE_44.items()})

#: Correct fixes that must pass: the good example with FP64 arithmetic inside (a correct rewrite).
CORRECT = {
    "fp64_internal": ("good", [(_PROMOTE, "    dtype = torch.float64\n")]),
}
EDITS.update({k: (v[0], v[1]) for k, v in ISSUE_37.items()})
EDITS.update(CORRECT)


def source(name: str) -> str:
    from gkd_harness.harness.loss.candidate import upstream_file

    base, edits = EDITS[name]
    path = GOOD if base == "good" else upstream_file()
    assert path is not None, "ms-swift's gkd_loss.py is not installed"
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) >= 1, (name, old)
        text = text.replace(old, new)
    for declared in ("GKD_CERTIFY_UNCHANGED = ('float32/float32', )", 'GKD_CERTIFY_UNCHANGED = ("float32/float32",)'):
        text = text.replace(declared, "GKD_CERTIFY_UNCHANGED = ()")
    return text


def write(name: str, folder: Path) -> Path:
    path = Path(folder) / f"{name}.py"
    path.write_text(source(name))
    return path
