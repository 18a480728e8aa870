"""Issue 44's wrong fixes that the exported suite used to pass while ``gkd-certify`` failed them: each a one-change
copy of the good worked example (examples/candidates/good_promote_first.py), written by :func:`write`."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

from tests.analysis.certify.defects import GOOD

_PROMOTE_RETURN = "    return tuple(t if t.dtype == dtype else t.to(dtype) for t in tensors)\n"
_PROMOTE = "    dtype = torch.float32\n"
_VALIDATE = "    teacher_output.validate()\n"
_CALLER = (
    "        s_logits, t_logits = _promote(s_active, t_active.full_logits)  # before alignment and temperature\n"
    "        s_logits, t_logits = _align_vocab(s_logits, t_logits)\n"
)

#: name -> (edits, the certificate's family that fails it).
EXPORT_PANEL: Dict[str, Tuple[List[Tuple[str, str]], str]] = {
    # promotes BF16 only: an FP16 side keeps upstream's arithmetic
    "export_promotes_only_bf16": (
        [(_PROMOTE_RETURN, "    return tuple(t.to(dtype) if t.dtype == torch.bfloat16 else t for t in tensors)\n")],
        "dtype pairs",
    ),
    # beta rounded to 2 decimals (exact at 0, 0.25, 0.5, 0.75, 0.9, 1: the pinned grid cannot see it)
    "export_round_beta": ([(_VALIDATE, _VALIDATE + "    beta = round(beta, 2)\n")], "random search"),
    # wrong only at Qwen's vocabulary: no promotion at V = 151,936
    "export_wrong_at_151936": (
        [(_PROMOTE, "    if tensors[0].shape[-1] == 151936:\n        return tensors\n" + _PROMOTE)],
        "production sizes",
    ),
    # the injected (vocab-parallel) log-softmax and KL applied to the replicated [N, K] top-k tensors
    "export_topk_misuses_primitives": (
        [
            (
                "        lsf, kdf = default_log_softmax, default_kl_div\n",
                "        lsf, kdf = log_softmax_fn, kl_div_fn\n",
            )
        ],
        "injected primitives",
    ),
    # bug report 000's literal fix: both sides promoted right after upstream's _align_vocab (the BF16 teacher is
    # padded with the FP32 student's logits rounded to BF16)
    "export_report_000_literal": (
        [
            (
                _CALLER,
                "        s_logits, t_logits = _align_vocab(s_active, t_active.full_logits)\n"
                "        s_logits, t_logits = _promote(s_logits, t_logits)\n",
            )
        ],
        "vocab mismatch",
    ),
}


def source(name: str) -> str:
    text = GOOD.read_text()
    for old, new in EXPORT_PANEL[name][0]:
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    for declared in ("GKD_CERTIFY_UNCHANGED = ('float32/float32', )", 'GKD_CERTIFY_UNCHANGED = ("float32/float32",)'):
        text = text.replace(declared, "GKD_CERTIFY_UNCHANGED = ()")
    return text


def write(name: str, folder: Path) -> Path:
    path = Path(folder) / f"{name}.py"
    path.write_text(source(name))
    return path
