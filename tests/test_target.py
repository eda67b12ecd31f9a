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
