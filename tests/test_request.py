"""specdec.request: one request, checked once, with messages that name the parameter."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPTS
from specdec import GenerationRequest, SamplingParams


@pytest.mark.parametrize("fields,match", [
    (dict(prompt_ids=[]), "`prompt` is empty"),
    (dict(prompt_ids=[1, 2.5]), "`prompt_ids` must be integer"),
    (dict(prompt_ids=[1, True]), "`prompt_ids` must be integer"),
    (dict(prompt_ids="abc"), "`prompt_ids` must be a list"),
    (dict(prompt_ids=torch.ones(2, 3, dtype=torch.long)), r"1-D \(or \[1, T\]\)"),
    (dict(max_new_tokens=0), r"`max_new_tokens` must be an integer >= 1"),
    (dict(max_new_tokens=2.0), r"`max_new_tokens` must be an integer >= 1"),
    (dict(params=0.7), "`params` must be a SamplingParams"),
    (dict(speculative="yes"), "`speculative` must be True or False"),
    (dict(acceptance="fast"), "`acceptance` must be 'auto' or one of"),
    (dict(lookup=-1), r"`lookup` must be an integer in \[0, 64\]"),
    (dict(lookup=65), r"`lookup` must be an integer in \[0, 64\]"),
    (dict(lookup_ngram=0), r"`lookup_ngram` must be an integer in \[1, 8\]"),
    (dict(lookup_mode="both"), "`lookup_mode` must be one of"),
    (dict(tree="bushy"), r"`tree` must be one of \('auto', 'trained', 'none', 'chain'"),
    (dict(eos_token_id="eos"), "`eos_token_id` must be 'auto', None"),
])
def test_fields_are_checked_on_construction(fields, match):
    base = dict(prompt_ids=[1, 2, 3])
    with pytest.raises(ValueError, match=match):
        GenerationRequest(**{**base, **fields})


def test_model_checks_happen_in_plan_before_any_round(loaded_llama):
    engine = loaded_llama.engine
    for req, match in [
        (GenerationRequest([1, 500]), r"`prompt_ids` must be in \[0, 127\]"),
        (GenerationRequest(list(range(100)) * 3), "the model's context holds 256"),
        (GenerationRequest([1, 2], params=lambda: "hot"), "`params` must be a SamplingParams"),
    ]:
        with pytest.raises(ValueError, match=match):
            engine.stream(req)  # raised at the call: the generator has not run a single round
    no_heads = specdec.load(loaded_llama.model, heads=None)
    with pytest.raises(ValueError, match="speculative decoding needs draft heads"):
        no_heads.engine.stream(GenerationRequest([1, 2], lookup=0))


def test_a_request_or_its_fields_run_the_same(loaded_llama):
    params = SamplingParams(temperature=0.8, seed=4)
    req = GenerationRequest(PROMPTS[1], 20, params, tree="small", eos_token_id=None, lookup=3)
    a = [t.token_id for ev in loaded_llama.engine.stream(req) for t in ev.emitted]
    b = [t.token_id for ev in loaded_llama.engine.stream(PROMPTS[1], 20, params, tree="small", eos_token_id=None,
                                                          lookup=3) for t in ev.emitted]
    assert a == b and len(a) == 20
    with pytest.raises(TypeError, match="not both"):
        loaded_llama.engine.stream(req, 20)


def test_plan_resolves_eos_tree_and_greedy_acceptance(loaded_llama):
    engine = loaded_llama.engine
    plan = GenerationRequest(torch.tensor([[4, 5, 6]]), 8, SamplingParams(temperature=1.3, seed=1),
                             acceptance="greedy", eos_token_id=[7, 9], tree="chain").plan(engine)
    assert plan.ids == [4, 5, 6] and plan.eos == {7, 9}
    assert plan.tree.num_nodes == 5  # the chain of 4 heads plus the root
    assert plan.first.temperature == 0 and plan.first.seed == 1  # greedy acceptance: argmax everywhere
    assert plan.get_params().temperature == 0
    assert plan.rule(plan.first) == "greedy"
    plain = GenerationRequest([4, 5], speculative=False, eos_token_id=None).plan(engine)
    assert plain.tree is None and plain.eos == frozenset() and plain.rule(SamplingParams()) == "plain"


def test_tree_none_needs_prompt_lookup(loaded_llama):
    engine = loaded_llama.engine
    with pytest.raises(ValueError, match="'none' drafts the root alone"):
        GenerationRequest([1, 2, 3], 4, tree="none", lookup=0).plan(engine)
    assert GenerationRequest([1, 2, 3], 4, tree="none", lookup=2).plan(engine).tree.num_nodes == 1


def test_auto_is_the_dynamic_tree(loaded_llama):
    plan = GenerationRequest([1, 2, 3], 4).plan(loaded_llama.engine)
    assert plan.dynamic and plan.tree.num_nodes == 1  # the tree is grown each round; the plan holds the root
    assert not GenerationRequest([1, 2, 3], 4, tree="small").plan(loaded_llama.engine).dynamic
