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


def source(name: str) -> str:
    from gkd_harness.harness.loss.candidate import upstream_file

    base, edits = EDITS[name]
    text = (GOOD if base == "good" else upstream_file()).read_text()
    for old, new in edits:
        assert text.count(old) >= 1, (name, old)
        text = text.replace(old, new)
    return text.replace("GKD_CERTIFY_UNCHANGED = ('float32/float32', )", "GKD_CERTIFY_UNCHANGED = ()")


def write(name: str, folder: Path) -> Path:
    path = Path(folder) / f"{name}.py"
    path.write_text(source(name))
    return path
