"""specdec.target: one tree forward equals a plain forward of every node's path."""
from __future__ import annotations

import pytest
import torch

from conftest import make_model, naive_logits
from specdec import kv_cache
from specdec.draft_tree import PRESETS, build_tree, resolve_tree
from specdec.target import TargetModel

PROMPT = [3, 14, 15, 92, 65, 35]


def path_tokens(tree, tokens: list[int], i: int) -> list[int]:
    """Tokens from the root to node i, root included."""
    out = []
    while i != -1:
        out.append(tokens[i])
        i = tree.parent[i]
    return out[::-1]


def check_tree_forward(model, tree, seed: int = 0, atol: float = 1e-5) -> None:
    target = TargetModel(model)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, target.vocab_size, (tree.num_nodes,), generator=g)  # [N]
    cache = kv_cache.new_cache(model)
    hidden = target.forward(torch.tensor(PROMPT), cache)  # [T, H]
    assert hidden.shape == (len(PROMPT), target.hidden_size)
    torch.testing.assert_close(target.logits(hidden[-1]), naive_logits(model, PROMPT), atol=atol, rtol=0)
    assert kv_cache.length(cache) == len(PROMPT)

    hidden = target.forward(tokens, cache, tree.ancestor_mask, tree.depth_t)  # [N, H]
    assert hidden.shape == (tree.num_nodes, target.hidden_size)
    assert kv_cache.length(cache) == len(PROMPT) + tree.num_nodes
    logits = target.logits(hidden)  # [N, V]
    assert logits.dtype == torch.float32
    toks = tokens.tolist()
    for i in range(tree.num_nodes):
        want = naive_logits(model, PROMPT + path_tokens(tree, toks, i))
        torch.testing.assert_close(logits[i], want, atol=atol, rtol=0, msg=lambda m: f"node {i}: {m}")


@pytest.mark.parametrize("preset", ["chain", "small", "default"])
def test_tree_forward_matches_plain_forward(arch_model, preset):
    _, model = arch_model
    check_tree_forward(model, resolve_tree(preset, num_heads=4))


def test_hand_tree_with_repeated_tokens(arch_model):
    """Equal tokens in different branches must still see only their own ancestors."""
    _, model = arch_model
    tree = build_tree(((0,), (1,), (2,), (0, 0), (1, 0), (2, 0), (0, 0, 0), (1, 0, 0)))
    target = TargetModel(model)
    tokens = torch.tensor([9, 4, 4, 7, 5, 5, 4, 6, 6])  # siblings share tokens on purpose
    cache = kv_cache.new_cache(model)
    target.forward(torch.tensor(PROMPT), cache)
    logits = target.logits(target.forward(tokens, cache, tree.ancestor_mask, tree.depth_t))
    for i in range(tree.num_nodes):
        want = naive_logits(model, PROMPT + path_tokens(tree, tokens.tolist(), i))
        torch.testing.assert_close(logits[i], want, atol=1e-5, rtol=0)
    # nodes 1 and 2 have the same path text "9 4" vs "9 4": identical logits
    torch.testing.assert_close(logits[1], logits[2], atol=1e-5, rtol=0)
    # but 3 ("9 4 7") and 4 ("9 4 5") differ, proving the mask isolates branches
    assert not torch.allclose(logits[3], logits[4], atol=1e-3)


def test_eager_attention_tree_forward():
    check_tree_forward(make_model("llama", attn="eager"), build_tree(PRESETS["small"]))


def test_sequential_plain_forward_matches():
    """Plain decoding one token at a time through the cache equals a no-cache forward."""
    model = make_model("qwen2", seed=3)
    target = TargetModel(model)
    cache = kv_cache.new_cache(model)
    target.forward(torch.tensor(PROMPT[:2]), cache)
    for n in range(3, len(PROMPT) + 1):
        h = target.forward(torch.tensor([PROMPT[n - 1]]), cache)
        torch.testing.assert_close(target.logits(h[-1]), naive_logits(model, PROMPT[:n]), atol=1e-5, rtol=0)
    assert kv_cache.length(cache) == len(PROMPT)


def test_target_model_metadata(arch_model):
    name, model = arch_model
    target = TargetModel(model)
    assert target.vocab_size == model.config.vocab_size
    assert target.hidden_size == 32
    assert target.max_length == 256
    assert target.dtype == torch.float32


def test_target_rejects_models_without_lm_head(llama):
    with pytest.raises(ValueError, match="causal LM"):
        TargetModel(llama.base_model)


# -- real hub architectures: sliding windows, refused layers, attention implementations -----------------

import logging  # noqa: E402

import transformers as hf  # noqa: E402

import specdec  # noqa: E402
from conftest import HUB_SMALL, hf_greedy, oracle_loaded, tiny_hub_model  # noqa: E402
from specdec.prefix_cache import PrefixCache  # noqa: E402

_SMALL = HUB_SMALL
WINDOW = 24  # small enough that the tests reach it
# name -> (config class, model class, config overrides, attention implementation)
WINDOWED = {
    "mistral-default": (hf.MistralConfig, hf.MistralForCausalLM, {}, "sdpa"),  # sliding_window=4096, as Mistral-7B-v0.1
    "mistral": (hf.MistralConfig, hf.MistralForCausalLM, dict(sliding_window=WINDOW), "sdpa"),
    "gemma2": (hf.Gemma2Config, hf.Gemma2ForCausalLM, dict(head_dim=8, sliding_window=WINDOW), "eager"),
    "gemma3": (hf.Gemma3TextConfig, hf.Gemma3ForCausalLM,
               dict(head_dim=8, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]), "sdpa"),
    "qwen2": (hf.Qwen2Config, hf.Qwen2ForCausalLM,
              dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1), "sdpa"),
    "qwen3": (hf.Qwen3Config, hf.Qwen3ForCausalLM,
              dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, head_dim=8), "sdpa"),
    "phi3": (hf.Phi3Config, hf.Phi3ForCausalLM, dict(sliding_window=WINDOW, pad_token_id=0), "sdpa"),
    "mixtral": (hf.MixtralConfig, hf.MixtralForCausalLM, dict(sliding_window=WINDOW, num_local_experts=2), "sdpa"),
}
LONG_PROMPT = [5, 17, 3, 9, 9, 1, 2, 3, 4, 5, 6, 7]  # 12 tokens: the prefix cache stores prompts of >= 8


def hub_model(name: str):
    return tiny_hub_model(WINDOWED[name])


@pytest.mark.parametrize("arch", list(WINDOWED))
def test_sliding_window_models_decode_exactly(arch):
    """Greedy output equals HF generate (HF's own sliding caches) to twice the window, with and without
    the prefix cache, speculative (random heads + lookup, and oracle heads that accept long paths) and plain."""
    model = hub_model(arch)
    target = specdec.load(model, heads="random").engine.target
    assert target.window == (4096 if arch == "mistral-default" else WINDOW)
    assert target.window_mode == ("mapping" if arch in ("gemma2", "gemma3", "qwen2", "qwen3") else "uniform")
    assert target.exact_limit is None  # the window is folded into the masks: no length limit
    n = 2 * WINDOW
    ref = hf_greedy(model, LONG_PROMPT, n)
    for prefix_cache in (None, PrefixCache()):
        loaded = specdec.load(model, heads="random", prefix_cache=prefix_cache)
        for speculative in (True, False):
            for _ in range(2):  # the second run starts from the prefix cache when there is one
                out = specdec.generate(loaded, prompt_ids=LONG_PROMPT, max_new_tokens=n, speculative=speculative,
                                       eos_token_id=None, lookup=5, tree="small")
                assert out.token_ids == ref, (arch, prefix_cache is not None, speculative)
        if prefix_cache is not None:
            assert prefix_cache.hits >= 3
    oracle, _ = oracle_loaded(model, LONG_PROMPT, n)
    out = specdec.generate(oracle, prompt_ids=LONG_PROMPT, max_new_tokens=n, eos_token_id=None, lookup=0)
    assert out.token_ids == ref
    assert out.stats["mean_accepted_length"] > 3  # long accepted paths cross the window edge


def test_window_folding_negative_control():
    """Planted bug: tree masks without the window. Past the window the output must differ from HF's."""
    model = hub_model("mistral")
    loaded, ref = oracle_loaded(model, LONG_PROMPT, 2 * WINDOW)
    loaded.engine.target.window_mode = None
    out = specdec.generate(loaded, prompt_ids=LONG_PROMPT, max_new_tokens=2 * WINDOW, eos_token_id=None, lookup=0)
    assert out.token_ids[: WINDOW - len(LONG_PROMPT)] == ref[: WINDOW - len(LONG_PROMPT)]  # inside: no difference
    assert out.token_ids != ref[: 2 * WINDOW]


def chunked_model():
    """Llama-4's chunked attention: tokens attend within fixed chunks, which a tree mask does not express."""
    cfg = hf.Llama4TextConfig(**{**_SMALL, "intermediate_size_mlp": 64, "head_dim": 8, "num_local_experts": 2,
                                 "attention_chunk_size": WINDOW})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = hf.Llama4ForCausalLM(cfg).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def test_chunked_attention_is_exact_within_the_chunk_and_refused_past_it():
    model = chunked_model()
    loaded = specdec.load(model, heads="random")
    assert loaded.engine.target.window_mode == "bounded" and loaded.engine.target.exact_limit == WINDOW
    n = WINDOW - len(LONG_PROMPT)
    for speculative in (True, False):
        out = specdec.generate(loaded, prompt_ids=LONG_PROMPT, max_new_tokens=n, speculative=speculative,
                               eos_token_id=None, lookup=5, tree="small")
        assert out.token_ids == hf_greedy(model, LONG_PROMPT, n)
    with pytest.raises(ValueError, match=rf"window of {WINDOW} tokens.*max_new_tokens <= {n}"):
        loaded.engine.stream(LONG_PROMPT, max_new_tokens=n + 1)  # raised at the call, before a round runs
    with pytest.raises(ValueError, match="sliding-window"):
        specdec.generate(loaded, prompt_ids=LONG_PROMPT, max_new_tokens=n + 1, speculative=False)


def test_recurrent_layers_are_refused_at_load():
    cfg = hf.Qwen3NextConfig(**{**_SMALL, "num_hidden_layers": 2, "head_dim": 8, "linear_num_key_heads": 2,
                                "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                                "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
                                "shared_expert_intermediate_size": 16,
                                "layer_types": ["linear_attention", "full_attention"]})
    model = hf.Qwen3NextForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="'linear_attention' layers.*cannot restore"):
        specdec.load(model, heads=None)


def alibi_model(name: str):
    """ALiBi models: their attention biases come from a 2D mask's cumulative sum, not from position ids."""
    small = {k: v for k, v in _SMALL.items() if k not in ("intermediate_size", "num_key_value_heads")}
    if name == "bloom":
        cfg = hf.BloomConfig(**{**small, "n_layer": 2, "n_head": 4})
        cls = hf.BloomForCausalLM
    elif name == "falcon-rw":
        cfg = hf.FalconConfig(**{**small, "alibi": True, "new_decoder_architecture": False, "multi_query": False})
        cls = hf.FalconForCausalLM
    else:
        cfg = hf.MptConfig(d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=128, vocab_size=128)
        cls = hf.MptForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return cls(cfg).float().eval()


@pytest.mark.parametrize("name", ["bloom", "falcon-rw", "mpt"])
def test_models_that_cannot_take_a_tree_mask_are_refused_at_load(name):
    """BLOOM and Falcon-RW raise on a 4D mask; MPT takes it and silently computes something else (its
    nodes' hidden states differ from their paths'). Both are refused by `specdec.load`, with the reason,
    not in a visitor's first request."""
    with pytest.raises(ValueError, match=r"cannot verify a draft tree exactly.*ALiBi"):
        specdec.load(alibi_model(name), heads="random")


def test_the_tree_probe_catches_a_mask_that_shows_every_node_to_every_node(monkeypatch):
    """Negative control: a planted bug in the tree mask (siblings see each other) must fail the load probe."""
    from specdec.target import TargetModel

    real = TargetModel._mask
    monkeypatch.setattr(TargetModel, "_mask", lambda self, tree, depth, past, width: real(
        self, torch.ones_like(tree).tril_(), depth, past, width))
    with pytest.raises(ValueError, match="differ from cache-free forwards"):
        specdec.load(make_model("llama"), heads="random")


def test_in_half_precision_the_tree_probe_refuses_only_what_raises(monkeypatch, caplog):
    """In bf16 a disagreement may be rounding (another kernel moves a deep model's states by percents):
    it is then a warning, while a model whose tree forward raises is still refused."""
    from specdec.target import TargetModel

    with pytest.raises(ValueError, match="cannot verify a draft tree exactly"):
        specdec.load(alibi_model("bloom").to(torch.bfloat16), heads="random")
    monkeypatch.setattr(TargetModel, "_agrees", lambda self, got, want, token: False)  # every probe disagrees
    with caplog.at_level(logging.WARNING, logger="specdec.target"):
        specdec.load(make_model("llama").to(torch.bfloat16), heads="random")
    assert "strict in float32 only" in caplog.text


def test_attention_that_ignores_the_tree_mask_is_switched_to_sdpa(caplog):
    flex = make_model("llama", attn="flex_attention")
    assert flex.config._attn_implementation == "flex_attention"
    with caplog.at_level(logging.WARNING, logger="specdec.target"):
        loaded = specdec.load(flex, heads="random")
    assert flex.config._attn_implementation == "sdpa"
    assert "ignores a 4D tree mask" in caplog.text
    ref = hf_greedy(make_model("llama"), LONG_PROMPT, 24)  # the same weights, built with sdpa
    assert specdec.generate(loaded, prompt_ids=LONG_PROMPT, max_new_tokens=24, tree="small",
                            eos_token_id=None).token_ids == ref
