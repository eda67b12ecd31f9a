"""specdec.batch: B requests share one target forward, and each decodes exactly as it would alone.

The batched KV buffer (`kv_cache.BatchCache`) and `TargetModel.forward_rows` are checked against
solo forwards; end to end, every request of a batch must give HF `generate`'s greedy tokens and the
tokens of its own solo run, on three architectures, with the dynamic tree and a static one, with
and without prompt lookup, and on sliding-window models past their window.
"""
from __future__ import annotations

import threading

import pytest
import torch

import specdec
from conftest import ARCHS, PROMPTS, hf_greedy, make_model, oracle_loaded, submit_together
from specdec import kv_cache
from specdec.draft_tree import build_tree
from specdec.request import GenerationRequest
from specdec.scheduler import Scheduler
from specdec.target import TargetModel
from test_tree_policy import MODERATE

N = 24
TREE = build_tree(((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))
LONG = [(7 * i) % 50 + 3 for i in range(30)]  # a 30-token prompt


def solo_cache(model, target, prompt):
    cache = kv_cache.new_cache(model, 64)
    target.forward(torch.tensor(prompt), cache)
    return cache


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_rows_equals_each_requests_own_forward(arch, models):
    """Rows of different lengths, a tree, a chain and a single token, padded to one T: each row's hidden
    states are its own forward's, and the padding writes nothing a later round can see."""
    model = models[arch]
    target = TargetModel(model)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    tokens = [[4], [7, 8, 9, 10, 11, 12], [3, 4, 5]]
    trees = [None, (TREE.ancestor_mask, TREE.depth_t), None]
    batch = kv_cache.BatchCache(model.config.num_hidden_layers, 4, 64, fixed_shapes=False)
    want = []
    for row, (p, toks, tree) in enumerate(zip(prompts, tokens, trees)):
        cache = solo_cache(model, target, p)
        batch.adopt(row, cache)
        want.append(target.forward(torch.tensor(toks), cache, *(tree or (None, None))))
    got = target.forward_rows(batch, 0, tokens, trees)  # [3, 6, H]
    assert got.shape[:2] == (3, 6)
    for i in range(3):
        torch.testing.assert_close(got[i, : len(tokens[i])], want[i], atol=1e-5, rtol=0)
    # commit row 1's path (0, 2, 4) and row 0's token; then one more token per row equals a fresh forward
    kv_cache.keep_path(kv_cache.RowCache(batch, 1), len(prompts[1]), [0, 2, 4])
    kv_cache.keep_path(kv_cache.RowCache(batch, 0), len(prompts[0]), [0])
    kv_cache.keep_path(kv_cache.RowCache(batch, 2), len(prompts[2]), [0, 1, 2])
    committed = [prompts[0] + [4], prompts[1] + [7, 9, 11], prompts[2] + [3, 4, 5]]
    assert batch.lengths[:3] == [len(c) for c in committed]
    nxt = target.forward_rows(batch, 0, [[5], [6], [7]], [None] * 3)
    for i, c in enumerate(committed):
        fresh = target.forward(torch.tensor(c + [5 + i]), kv_cache.new_cache(model))
        torch.testing.assert_close(nxt[i, 0], fresh[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("fixed_shapes", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_lone_row_equals_its_own_forward(arch, fixed_shapes, models):
    """One request in the batch, in a row other than the first: a tree, a chain and one token each equal its
    own buffer's forward, and the batch's padded mask (`_batch_inputs`) gives the same rows as the lone
    request's own inputs (HF's causal masks over the slots in use; a 4D mask for a tree or hidden slots)."""
    model = models[arch]
    target = TargetModel(model)
    batch = kv_cache.BatchCache(model.config.num_hidden_layers, 4, 64, fixed_shapes=fixed_shapes)
    for toks, tree in (([7, 8, 9, 10, 11, 12], (TREE.ancestor_mask, TREE.depth_t)), ([3, 4, 5], None), ([4], None)):
        cache = solo_cache(model, target, PROMPTS[1])
        batch.adopt(2, cache)
        want = target.forward(torch.tensor(toks), cache, *(tree or (None, None)))
        got = target.forward_rows(batch, 2, [toks], [tree])  # [1, T, H]
        assert got.shape[:2] == (1, len(toks))
        torch.testing.assert_close(got[0], want, atol=1e-5, rtol=0)
        target._lone_inputs = target._batch_inputs  # the padded form, on the same committed row
        try:
            padded = target.forward_rows(batch, 2, [toks], [tree])
        finally:
            del target._lone_inputs
        torch.testing.assert_close(padded, got, atol=1e-5, rtol=0)


def test_batch_cache_rows_move_grow_and_clear(llama):
    target = TargetModel(llama)
    batch = kv_cache.BatchCache(llama.config.num_hidden_layers, 3, 16, fixed_shapes=False)
    for row, p in enumerate(PROMPTS):
        batch.adopt(row, solo_cache(llama, target, p))
    before = batch.layers[1].keys[2, :, : len(PROMPTS[2])].clone()
    batch.move(2, 0)
    assert batch.lengths[0] == len(PROMPTS[2])
    torch.testing.assert_close(batch.layers[1].keys[0, :, : len(PROMPTS[2])], before)
    batch.grow(64)
    assert batch.capacity == 64 and batch.layers[0].keys.shape[2] == 64
    torch.testing.assert_close(batch.layers[1].keys[0, :, : len(PROMPTS[2])], before)
    with torch.inference_mode():
        batch.layers[0].keys[1].fill_(float("nan"))
    batch.clear(1)
    assert batch.lengths[1] == 0 and torch.isfinite(batch.layers[0].keys[1]).all()
    assert target.rows_work() == (True, "")


def run_batch(loaded, requests, max_batch_size=4, **kw) -> list[list[int]]:
    with Scheduler(loaded.engine, max_batch_size=max_batch_size, **kw) as s:
        tickets = [s.submit(r) for r in requests]
        out = [[t.token_id for e in tk for t in e.emitted] for tk in tickets]
        sizes = s.stats()["batch_sizes"]
        assert max(sizes) > 1 if max_batch_size > 1 else set(sizes) == {1}, "requests must have shared rounds"
    return out


def solo(loaded, requests) -> list[list[int]]:
    return [[t.token_id for e in loaded.engine.stream(r) for t in e.emitted] for r in requests]


@pytest.fixture(scope="module")
def hf_refs(models):
    return {(a, i): hf_greedy(models[a], p, N) for a in ARCHS for i, p in enumerate(PROMPTS)}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree,lookup", [("auto", 6), ("auto", 0), ("default", 0), ("default", 6)])
def test_batched_greedy_equals_solo_and_hf_generate(arch, tree, lookup, models, hf_refs):
    loaded = specdec.load(models[arch], heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    # two of each prompt, and different lengths, so requests leave while others decode
    requests = [GenerationRequest(p, N - 6 * (k % 2), tree=tree, lookup=lookup, eos_token_id=None)
                for k in range(2) for p in PROMPTS]
    out = run_batch(loaded, requests)
    assert out == solo(loaded, requests)
    for r, toks in zip(requests, out):
        assert toks == hf_refs[arch, PROMPTS.index(list(r.prompt_ids))][: r.max_new_tokens]


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_oracle_heads_accept_long_paths_and_stay_exact(arch, models, hf_refs):
    """Perfect heads make deep trees and long accepted paths in every row at once."""
    loaded, ref = oracle_loaded(models[arch], PROMPTS[0], N)
    loaded.engine.set_cost_model(MODERATE)
    requests = [GenerationRequest(PROMPTS[0], N, tree=t, lookup=0, eos_token_id=None) for t in ("auto", "default")] * 2
    assert run_batch(loaded, requests) == [ref[:N]] * 4


def test_plain_and_speculative_requests_share_a_batch(models, hf_refs):
    loaded = specdec.load(models["llama"], heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    requests = [GenerationRequest(p, N, speculative=k == 0, lookup=0, eos_token_id=None)
                for k in range(2) for p in PROMPTS]
    out = run_batch(loaded, requests, max_batch_size=6)
    assert out == [hf_refs["llama", i] for i in range(3)] * 2


@pytest.mark.parametrize("size", [4, 1])
@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma2"])
def test_batched_sliding_window_models_stay_exact_past_the_window(name, size):
    """The window goes into each row's mask ("uniform" Mistral, "mapping" Qwen2 and Gemma-2), for a lone row
    (size 1) as for a batch."""
    from test_target import LONG_PROMPT, WINDOW, hub_model

    model = hub_model(name)
    loaded = specdec.load(model, heads="random")
    n = 2 * WINDOW
    prompts = [LONG_PROMPT, LONG_PROMPT[3:], LONG_PROMPT[:5] + [9, 8]]
    requests = [GenerationRequest(p, n, tree="small", lookup=5, eos_token_id=None) for p in prompts]
    assert run_batch(loaded, requests, max_batch_size=size) == [hf_greedy(model, p, n) for p in prompts]


def test_batched_window_negative_control():
    """Planted bug: row masks without the window. Past the window the output must differ from HF's."""
    from test_target import LONG_PROMPT, WINDOW, hub_model

    model = hub_model("mistral")
    loaded, ref = oracle_loaded(model, LONG_PROMPT, 2 * WINDOW)
    loaded.engine.target.window_mode = None
    requests = [GenerationRequest(LONG_PROMPT, 2 * WINDOW, lookup=0, eos_token_id=None)] * 2
    out = run_batch(loaded, requests)
    assert out[0][: WINDOW - len(LONG_PROMPT)] == ref[: WINDOW - len(LONG_PROMPT)]  # inside: no difference
    assert out[0] != ref[: 2 * WINDOW]


def test_a_model_without_the_slot_buffer_still_shares_rounds(models, caplog):
    """The DynamicCache fallback: requests take turns inside each round, each on its own cache."""
    loaded = specdec.load(models["gpt2"], heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    loaded.engine.target.slots = False  # as for a model whose attention ignores the slots
    requests = [GenerationRequest(p, 12, lookup=6, eos_token_id=None) for p in PROMPTS]
    with caplog.at_level("WARNING"):
        out = run_batch(loaded, requests)
    assert "batched rounds are off" in caplog.text
    assert out == [hf_greedy(models["gpt2"], p, 12) for p in PROMPTS]


def test_prompt_longer_than_a_prefill_chunk_is_fed_in_chunks(models):
    model = make_model("qwen2")
    loaded = specdec.load(model, heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    long = list(range(3, 40))
    requests = [GenerationRequest(p, 12, lookup=6, eos_token_id=None) for p in (long, PROMPTS[0], long[5:])]
    out = run_batch(loaded, requests, prefill_chunk=8)
    assert out == [hf_greedy(model, list(r.prompt_ids), 12) for r in requests]


def round0_spy(target) -> list[list[int]]:
    """Wrap `forward_rows`: record the prompt rests of every forward that ran round 0 for 2+ requests (rows
    are staged shortest rest first)."""
    seen, real = [], target.forward_rows

    def forward_rows(cache, lo, tokens, trees, taps=False):
        out = real(cache, lo, tokens, trees, taps)  # recorded once it returned: a fallback to one row each is not shared
        if len(tokens) > 1 and all(t is None for t in trees) and max(map(len, tokens)) > 1:
            seen.append([len(t) for t in tokens])
        return out

    target.forward_rows = forward_rows
    return seen


@pytest.mark.parametrize("arch", ARCHS)
def test_joining_requests_share_round_0s_forward_and_stay_exact(arch, models):
    """Requests that join together run round 0 as one forward, each prompt (its rest) a causal chain in
    a row after the members'. A wave that joins while others decode covers the cases: prompt-cache
    hits (a row seeded with a prefix), a prompt fed in chunks first, and a request that ends at round 0
    between two that go on (the rows after it move down). Every output equals HF `generate`'s."""
    from specdec.prefix_cache import PrefixCache

    model = models[arch]
    loaded = specdec.load(model, heads="random", device="cpu", prefix_cache=PrefixCache(min_tokens=4))
    loaded.engine.set_cost_model(MODERATE)
    first = [GenerationRequest(p, N, lookup=6, eos_token_id=None) for p in PROMPTS]
    second = [GenerationRequest(LONG, 12, lookup=6, eos_token_id=None),  # 24 tokens fed first, 6 in round 0
              GenerationRequest(PROMPTS[0] + [9, 10], 12, lookup=6, eos_token_id=None),  # 3 tokens: too short to keep
              GenerationRequest(PROMPTS[1] + [11], 1, eos_token_id=None),  # a hit of 10, done at round 0
              GenerationRequest(PROMPTS[2][:-1] + [5, 6, 7], 12, lookup=0, eos_token_id=None)]  # a hit of 7
    decoding = threading.Event()
    with Scheduler(loaded.engine, max_batch_size=8, prefill_chunk=24) as s:
        seen = round0_spy(loaded.engine.target)  # after the scheduler's probe of the batched path
        tickets = submit_together(s, first, on_round=lambda ev: ev.index == 2 and decoding.set())
        assert decoding.wait(60)  # the second wave joins while the first decodes
        tickets += submit_together(s, second)
        out = [[t.token_id for e in tk.result(timeout=120) for t in e.emitted] for tk in tickets]
    assert out == [hf_greedy(model, list(r.prompt_ids), r.max_new_tokens) for r in first + second]
    assert seen[0] == sorted(len(p) for p in PROMPTS)  # the first wave: whole prompts
    # the second wave: what the prefix cache did not hold, and the rest of the chunked prompt
    assert seen[1:] == [sorted([len(LONG) - 24, len(PROMPTS[0]) + 2, 1, 3])]


def test_a_nan_row_in_round_0s_shared_forward_ends_that_request_alone(models):
    """Real NaNs in one row of the joining requests' shared forward: that request fails before its first
    token; the others decode exactly, and so does a later request that takes its cleaned row."""
    from specdec import RequestFailed

    model = models["llama"]
    loaded = specdec.load(model, heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    state = {"armed": False}

    def poison(module, args, output):  # the first forward of 2+ rows: request 1's embeddings become NaN
        ids = args[0]
        if state["armed"] and ids.shape[0] > 1:
            state["armed"] = False
            output = output.clone()
            output[ids[:, 0] == LONG[-1]] = float("nan")
            return output
        return None

    # Two long prompts, so that the next rounds' keys reach far into the poisoned request's row when a short
    # request takes it: only the row's cleaning keeps its stale NaN slots out of that request.
    prompts = [LONG, LONG[::-1], PROMPTS[2], *PROMPTS]
    requests = [GenerationRequest(p, N, lookup=6, eos_token_id=None) for p in prompts]
    handle = model.get_input_embeddings().register_forward_hook(poison)
    try:
        with Scheduler(loaded.engine, max_batch_size=3) as s:
            seen = round0_spy(loaded.engine.target)  # armed after the scheduler's probe of the batched path
            state["armed"] = True
            tickets = submit_together(s, requests)
            out = []
            for t in tickets:
                try:
                    out.append([tok.token_id for e in t for tok in e.emitted])
                except RequestFailed as e:
                    out.append(e)
            stats = s.stats()
    finally:
        handle.remove()
    assert seen[0] == sorted(len(p) for p in prompts[:3])  # round 0 of the first three was the poisoned forward
    assert isinstance(out[1], RequestFailed) and out[1].failure.cause == "non_finite" and not tickets[1].events
    assert [o for i, o in enumerate(out) if i != 1] == [hf_greedy(model, p, N) for i, p in enumerate(prompts) if i != 1]
    assert stats["failures"]["non_finite"] == 1


def test_which_joining_requests_share_round_0():
    """Rows are padded to the longest rest, so a request shares the forward only while the padding stays
    within the buffer and at most doubles the real tokens (or 16 per row); the rest run alone."""
    from specdec.batch import Batch, Member
    from specdec.prefill import _sharing, prefill

    model = make_model("llama")
    engine = specdec.load(model, heads=None, device="cpu").engine
    batch = Batch(engine, 4, batched=True)

    def member(rid, n, fed=0):
        prompt = [(5 * i) % 90 + 3 for i in range(n)]
        m = Member(rid, engine.open(GenerationRequest(prompt, 8, speculative=False).plan(engine)))
        if fed:
            assert prefill(batch, m, fed) == fed  # prompt chunks already in its own buffer
        return m

    short = [member(0, 5), member(1, 3), member(2, 4)]
    assert _sharing(batch, short) == [short[1], short[2], short[0]]  # shortest rest first
    long = member(3, 60)
    assert _sharing(batch, short + [long]) == [short[1], short[2], short[0]]  # 4 x 60 padded for 72 real tokens
    assert _sharing(batch, [short[0], long]) == [short[0], long]  # two rows: the padding at most doubles them
    assert _sharing(batch, [short[0]]) == []  # a group of one is no group
    fed, rest = member(4, 200, fed=198), member(5, 100)  # 2 x 100 padded for 102 real: fine, but 198 + 100
    assert fed.run.cache.capacity < 298 and _sharing(batch, [fed, rest]) == []  # slots do not fit the buffer
    assert _sharing(Batch(engine, 4, batched=False), short) == []
