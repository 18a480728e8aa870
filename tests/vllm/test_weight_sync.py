"""vLLM CPU weight sync: the prepack switch lets ms-swift's ``load_weights`` reach the engine, and the engine then
generates from the new weights (checked against an independent FP64 HF forward).

This is the in-process path ms-swift's colocate mode uses (``GRPOVllmEngine.inner_model.load_weights``),
exercised directly on a tiny Qwen3 (head_dim 32) so a failure points at the switch, not at the trainer.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from gkd_harness.harness.fixtures.embedded import EmbeddedSpec, prepare_embedded

    assets = prepare_embedded(EmbeddedSpec(head_dim=32, init_std=0.1), root=tmp_path_factory.mktemp("embedded"))
    return assets.student_dir


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    """An in-process vLLM CPU engine with the harness's prepack switch installed before it is built."""
    with pytest.MonkeyPatch.context() as mp:
        # in-process engine core (as ms-swift's colocate mode), and the CPU-lane settings of rollout_env
        for k, v in {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_PLUGINS": "none",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "GKD_VLLM_CPU_NO_PREPACK": "1",
            "HF_HUB_OFFLINE": "1",
        }.items():
            mp.setenv(k, v)
        from gkd_harness.harness.rank.rollout_patches import install_rollout_patches

        assert "vllm_cpu_no_prepack" in install_rollout_patches()
        from vllm import LLM

        engine = LLM(
            model=str(tiny_model_dir),
            dtype="float32",
            max_model_len=128,
            enforce_eager=True,
            seed=0,
            gpu_memory_utilization=0.3,
        )
        yield engine
        del engine


def inner_model(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner.model


def hf_next_token_logprobs_fp64(model_dir, state_dict, prompt_ids):
    """FP64 HF reference: log-softmax of the last position's logits under ``state_dict``. Shape ``[V]``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    model.load_state_dict({k: v.double() for k, v in state_dict.items()}, strict=True)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0, -1]
    return torch.log_softmax(logits, dim=-1)


def vllm_next_token_logprobs(llm, prompt_ids, k):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        TokensPrompt(prompt_token_ids=prompt_ids),
        SamplingParams(max_tokens=1, temperature=0.0, logprobs=k),
        use_tqdm=False,
    )
    top = out[0].outputs[0].logprobs[0]
    return {tok: lp.logprob for tok, lp in top.items()}


def test_linear_weights_keep_their_loader(llm):
    model = inner_model(llm)
    q = model.model.layers[0].self_attn.qkv_proj
    assert q.weight.numel() > 0 and hasattr(q.weight, "weight_loader"), "prepack removed the weight"


def test_engine_generates_from_synced_weights(llm, tiny_model_dir):
    """Sync new weights the way ms-swift does, then vLLM's next-token log-probs match an FP64 HF forward."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(123)
    new_state = {
        k: v + 0.5 * v.std() * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v.clone()
        for k, v in hf.state_dict().items()
    }
    prompt = [1, 40, 41, 42, 43, 44]
    k = 8

    before = vllm_next_token_logprobs(llm, prompt, k)
    inner_model(llm).load_weights(iter(new_state.items()))  # ms-swift's _load_state_dict_to_vllm path
    llm.reset_prefix_cache()
    after = vllm_next_token_logprobs(llm, prompt, k)

    ref_old = hf_next_token_logprobs_fp64(tiny_model_dir, hf.state_dict(), prompt)
    ref_new = hf_next_token_logprobs_fp64(tiny_model_dir, new_state, prompt)
    # the perturbation moves the reference distribution far more than the comparison tolerance
    assert (ref_new - ref_old).abs().max() > 0.05
    for tok, lp in before.items():
        assert abs(lp - ref_old[tok].item()) < 1e-4, (tok, lp, ref_old[tok].item())
    for tok, lp in after.items():
        assert abs(lp - ref_new[tok].item()) < 1e-4, (tok, lp, ref_new[tok].item())
    # vLLM's top-k after the sync is the new reference's top-k (it is not generating from the old weights)
    assert set(after) == set(torch.topk(ref_new, k).indices.tolist())
