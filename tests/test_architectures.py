"""More of the hub's causal LMs, each built tiny from its real config class: greedy output, alone and in
a batch of six, equals HF `generate` token for token.

The tests elsewhere go deep on Llama, Qwen2, GPT-2 and the sliding-window models; this module is the
breadth a user bringing their own model relies on: other normalisations (OLMo-2, Cohere), partial
rotary embeddings (Phi, GPT-NeoX, StableLM, GPT-J), multi-latent attention with its own value width
(DeepSeek-V3), mixtures of experts (Qwen3-MoE), learned positions (OPT), and scaled logits (Granite).
ALiBi models, which cannot take a tree mask, are refused at load (tests/test_target.py).
"""
from __future__ import annotations

import pytest
import transformers as hf

import specdec
from conftest import hf_greedy, tiny_hub_model
from specdec.request import GenerationRequest
from specdec.scheduler import Scheduler

# name -> (config class, model class, config overrides, attention implementation)
ARCHITECTURES = {
    "olmo2": (hf.Olmo2Config, hf.Olmo2ForCausalLM, {}, "sdpa"),
    "gpt-neox": (hf.GPTNeoXConfig, hf.GPTNeoXForCausalLM, dict(num_key_value_heads=None), "sdpa"),
    "falcon": (hf.FalconConfig, hf.FalconForCausalLM, dict(new_decoder_architecture=True, num_kv_heads=2), "sdpa"),
    "stablelm": (hf.StableLmConfig, hf.StableLmForCausalLM, {}, "sdpa"),
    "cohere": (hf.CohereConfig, hf.CohereForCausalLM, {}, "sdpa"),
    "granite": (hf.GraniteConfig, hf.GraniteForCausalLM, {}, "sdpa"),
    "phi": (hf.PhiConfig, hf.PhiForCausalLM, {}, "sdpa"),
    "gpt-j": (hf.GPTJConfig, hf.GPTJForCausalLM, dict(n_embd=32, n_layer=2, n_head=4, rotary_dim=4), "eager"),
    "smollm3": (hf.SmolLM3Config, hf.SmolLM3ForCausalLM, {}, "sdpa"),
    "qwen3-moe": (hf.Qwen3MoeConfig, hf.Qwen3MoeForCausalLM,
                  dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8), "sdpa"),
    "gemma": (hf.GemmaConfig, hf.GemmaForCausalLM, dict(head_dim=8), "sdpa"),
    "opt": (hf.OPTConfig, hf.OPTForCausalLM, dict(ffn_dim=64, word_embed_proj_dim=32), "sdpa"),
    "deepseek-v3": (hf.DeepseekV3Config, hf.DeepseekV3ForCausalLM,
                    dict(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                         n_routed_experts=4, num_key_value_heads=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         first_k_dense_replace=1, n_group=1, topk_group=1), "sdpa"),
}
PROMPTS = ([5, 17, 3, 9, 9, 1, 2], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [99, 42, 7, 7, 120, 64])
N = 20


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_greedy_alone_and_batched_equals_hf_generate(arch):
    model = tiny_hub_model(ARCHITECTURES[arch])
    refs = [hf_greedy(model, p, N) for p in PROMPTS]
    loaded = specdec.load(model, heads="random", device="cpu")
    target = loaded.engine.target
    assert target.slots, "specdec's position-addressed KV buffer should serve it"
    alone = [specdec.generate(loaded, prompt_ids=p, max_new_tokens=N, eos_token_id=None, lookup=4, tree="default")
             .token_ids for p in PROMPTS]
    assert alone == refs
    with Scheduler(loaded.engine, max_batch_size=4) as s:
        assert s.batched
        tickets = [s.submit(GenerationRequest(p, N, lookup=4, eos_token_id=None)) for p in PROMPTS * 2]
        batched = [[t.token_id for e in tk for t in e.emitted] for tk in tickets]
    assert batched == refs * 2
