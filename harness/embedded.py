"""The embedded default: tiny Qwen3 student + near-copy teacher, a local or real Qwen tokenizer, a chat dataset.

Everything is built locally with random weights (no hub access) and cached on disk, keyed by the settings,
so every harness path runs on a CPU:

* ``student/`` and ``teacher/``: ``Qwen3ForCausalLM`` checkpoints written with ``save_pretrained`` (FP32
  weights), each with the same tokenizer and a Qwen-style chat template, so ms-swift loads them through its
  normal ``--model_type qwen3`` path. The tokenizer (``tokenizer``) is either

  - ``"bytes"``: a byte-level BPE trained locally on the dataset, carrying the Qwen chat tokens (``vocab_size``
    is then the BPE target size, e.g. 512), untied embeddings; or
  - ``"qwen3"`` / ``"qwen35"``: Qwen's real vocabulary (:mod:`harness.qwen_tokenizer`, 151,669 / 248,077
    tokens with the chat tokens at their real ids); ``vocab_size`` is the embedding width (151,936 / 248,320
    as in the real checkpoints) and the input and output embeddings are tied to keep the model small.
* The teacher is a **near-copy** of the student: every weight ``w`` becomes ``w + noise * std(w) * eps``
  with ``eps ~ N(0, 1)``. Student and teacher distributions are then nearly identical, which is the regime
  where BF16 rounding of the teacher logits makes upstream's JSD negative.
* ``train.jsonl``: a small generated chat dataset in ms-swift's ``messages`` format.

Cache root: ``$GKD_HARNESS_CACHE`` or ``~/.cache/gkd-harness``. Builds are atomic (build in a temporary
folder, then rename) and serialised with a file lock, so parallel sweep points share one build.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

#: Bump when the on-disk layout or the generation procedure changes (invalidates old cache entries).
FORMAT_VERSION = 2

#: ``model.embedded.tokenizer`` values: the locally trained BPE, or one of Qwen's real vocabularies.
TOKENIZERS = ("bytes", "qwen3", "qwen35")

#: Special tokens of the Qwen chat format (ms-swift's ``qwen3`` template emits these as text).
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_EXTRA_TOKENS = ("<think>", "</think>")

QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class EmbeddedSpec:
    """Settings of the embedded models and data; the cache key is derived from all of them.

    Attributes:
        vocab_size: the model's embedding rows; with ``tokenizer="bytes"`` also the target size of the trained
            BPE (which may end up smaller on the tiny corpus; the rows are then padded as in Qwen checkpoints);
            with a Qwen vocabulary it must be >= the tokenizer's length (151,669 / 248,077).
        hidden_size / num_layers / num_heads / num_kv_heads / head_dim / intermediate_size: Qwen3 shape.
        init_std: ``initializer_range`` of the random init (larger -> sharper next-token distributions).
        teacher_noise: relative std of the Gaussian noise added to each student weight to make the teacher.
        seed: seed for weights, noise and dataset.
        num_samples: rows in the generated dataset.
        tokenizer: ``"bytes"`` (locally trained BPE), ``"qwen3"`` or ``"qwen35"`` (real Qwen vocabulary,
            tied embeddings).
    """

    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    init_std: float = 0.1
    teacher_noise: float = 0.01
    seed: int = 0
    num_samples: int = 64
    tokenizer: str = "bytes"

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"model.embedded.tokenizer: must be one of {list(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.tokenizer != "bytes":
            from harness.qwen_tokenizer import get_vocab

            need = get_vocab(self.tokenizer).tokenizer_size
            if self.vocab_size < need:
                raise ValueError(f"model.embedded.vocab_size: must be >= {need} (length of the {self.tokenizer} "
                                 f"tokenizer), got {self.vocab_size}")

    @property
    def tie_word_embeddings(self) -> bool:
        """Input and output embeddings are tied for the real Qwen vocabularies (as in Qwen3-0.6B)."""
        return self.tokenizer != "bytes"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "EmbeddedSpec":
        """Build from a config mapping; unknown keys raise ``ValueError`` naming ``model.embedded.<key>``."""
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"model.embedded.{unknown[0]}: unknown setting (known: {sorted(known)})")
        return cls(**values)

    def key(self) -> str:
        """Short stable hash of the settings and the format version."""
        settings = dataclasses.asdict(self)
        if settings["tokenizer"] == "bytes":  # the default keeps the keys it had before the field existed
            del settings["tokenizer"]
        blob = json.dumps({"format": FORMAT_VERSION, **settings}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class EmbeddedAssets:
    """Paths of one built embedded set."""

    root: Path
    student_dir: Path
    teacher_dir: Path
    dataset_path: Path
    vocab_size: int


def cache_root() -> Path:
    """``$GKD_HARNESS_CACHE`` or ``~/.cache/gkd-harness``."""
    env = os.environ.get("GKD_HARNESS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gkd-harness"


# ----------------------------------------------------------------------------------------------------------
# dataset
# ----------------------------------------------------------------------------------------------------------
_NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]
_COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
_THINGS = ["apple", "car", "house", "river", "cloud", "book", "cat", "tree"]


def generate_messages(num_samples: int, seed: int) -> list[dict]:
    """Deterministic small chat dataset: ``[{"messages": [{"role", "content"}, ...]}]`` rows."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_samples):
        kind = i % 3
        if kind == 0:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            q = f"What is {_NUMBER_WORDS[a]} plus {_NUMBER_WORDS[b]}?"
            ans = f"{_NUMBER_WORDS[a]} plus {_NUMBER_WORDS[b]} is {_NUMBER_WORDS[a + b]}."
        elif kind == 1:
            c, t = rng.choice(_COLORS), rng.choice(_THINGS)
            q = f"Describe a {c} {t} in one sentence."
            ans = f"The {t} is {c}, and the {c} {t} looks calm in the light."
        else:
            words = [rng.choice(_THINGS) for _ in range(rng.randint(2, 4))]
            q = "Repeat these words: " + " ".join(words) + "."
            ans = " ".join(words) + "."
        rows.append({"messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": q},
            {"role": "assistant", "content": ans},
        ]})
    return rows


# ----------------------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------------------
def build_tokenizer(corpus: list[str], vocab_size: int):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ``PreTrainedTokenizerFast`` with Qwen chat tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS),
    )
    fast.add_tokens(list(QWEN_EXTRA_TOKENS))
    fast.chat_template = QWEN_CHAT_TEMPLATE
    fast.model_max_length = 512
    return fast


# ----------------------------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------------------------
def _qwen3_config(spec: EmbeddedSpec, vocab_size: int, tokenizer):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=512,
        initializer_range=spec.init_std,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )


def build_models(spec: EmbeddedSpec, vocab_size: int, tokenizer):
    """Return ``(student, teacher)``: a random Qwen3 student and its noisy near-copy (both FP32)."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(spec.seed)
    config = _qwen3_config(spec, vocab_size, tokenizer)
    student = Qwen3ForCausalLM(config).float().eval()
    teacher = Qwen3ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for (name, ps), (_, pt) in zip(student.named_parameters(), teacher.named_parameters()):
            std = ps.detach().std() if ps.numel() > 1 else ps.detach().abs()
            if not torch.isfinite(std) or std == 0:
                std = torch.tensor(1.0)
            noise = torch.randn(ps.shape, generator=gen) * (spec.teacher_noise * std)
            pt.copy_(ps + noise)
    return student, teacher


def _build_into(target: Path, spec: EmbeddedSpec) -> None:
    rows = generate_messages(spec.num_samples, spec.seed)
    if spec.tokenizer == "bytes":
        corpus = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for r in rows for m in r["messages"]]
        corpus += ["<think>\n\n</think>\n\n"]
        tokenizer = build_tokenizer(corpus, spec.vocab_size - len(QWEN_EXTRA_TOKENS))
    else:
        from harness.qwen_tokenizer import build_qwen_tokenizer

        tokenizer = build_qwen_tokenizer(spec.tokenizer, chat_template=QWEN_CHAT_TEMPLATE)
    # As in Qwen checkpoints, the embedding rows may outnumber the tokenizer's tokens (padded vocab).
    vocab_size = spec.vocab_size
    assert len(tokenizer) <= vocab_size, (len(tokenizer), vocab_size)
    student, teacher = build_models(spec, vocab_size, tokenizer)
    for name, model in (("student", student), ("teacher", teacher)):
        model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        model.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        model.save_pretrained(target / name)
        tokenizer.save_pretrained(target / name)
    with open(target / "train.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(target / "spec.json", "w") as f:
        json.dump({"format": FORMAT_VERSION, **dataclasses.asdict(spec), "model_vocab_size": vocab_size,
                   "tokenizer_len": len(tokenizer)}, f, indent=1)


def prepare_embedded(spec: EmbeddedSpec | None = None, root: Path | None = None) -> EmbeddedAssets:
    """Build (once) and return the embedded student, teacher and dataset for ``spec``."""
    spec = spec or EmbeddedSpec()
    root = Path(root) if root is not None else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"embedded-{spec.key()}"
    lock_path = root / f".embedded-{spec.key()}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (final / "spec.json").exists():
                tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
                try:
                    _build_into(tmp, spec)
                    if final.exists():
                        shutil.rmtree(final)
                    os.replace(tmp, final)
                finally:
                    if tmp.exists():
                        shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    meta = json.loads((final / "spec.json").read_text())
    return EmbeddedAssets(root=final, student_dir=final / "student", teacher_dir=final / "teacher",
                          dataset_path=final / "train.jsonl", vocab_size=int(meta["model_vocab_size"]))


def asset_paths(spec: EmbeddedSpec, root: Path | None = None) -> tuple[Path, Path, Path]:
    """(student_dir, teacher_dir, dataset_path) that :func:`prepare_embedded` builds for ``spec``, without building
    anything (the dry run shows them)."""
    final = (Path(root) if root is not None else cache_root()) / f"embedded-{spec.key()}"
    return final / "student", final / "teacher", final / "train.jsonl"
