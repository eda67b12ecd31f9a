"""specdec.engine / api: greedy exactness against HF, EOS and limits, events, live tuning."""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import ARCHS, PROMPTS, hf_greedy, make_model, oracle_loaded
from specdec.detok import IncrementalDecoder
from specdec.events import TOKEN_KINDS, RoundEvent
from specdec.sampler import SamplingParams
from specdec.target import TargetModel

N = 24  # new tokens per exactness run


@pytest.fixture(scope="module")
def hf_refs(models):
    """HF greedy continuations, (arch, prompt index) -> N + 8 tokens."""
    return {(a, i): hf_greedy(models[a], p, N + 8) for a in ARCHS for i, p in enumerate(PROMPTS)}


@pytest.fixture(scope="module")
def random_loaded(models):
    return {a: specdec.load(models[a], heads="random", device="cpu") for a in ARCHS}


# -- greedy exactness ----------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["chain", "small", "default"])
def test_greedy_equals_hf_generate(arch, tree, random_loaded, hf_refs):
    loaded = random_loaded[arch]
    for i, prompt in enumerate(PROMPTS):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, tree=tree, lookup=0, eos_token_id=None)
        assert out.token_ids == hf_refs[arch, i][:N], f"prompt {i}"
        assert out.stats["new_tokens"] == N and out.stats["finished"] == "length"
        assert all(r.acceptance == "greedy" for r in out.rounds[1:])


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_mode_equals_hf_generate(arch, random_loaded, hf_refs):
    for i, prompt in enumerate(PROMPTS):
        out = specdec.generate(random_loaded[arch], prompt_ids=prompt, max_new_tokens=N, speculative=False,
                               eos_token_id=None)
        assert out.token_ids == hf_refs[arch, i][:N]
        assert out.stats["target_forwards"] == N  # one token per forward
        assert all(len(r.emitted) == 1 and r.emitted[0].kind == "baseline" and not r.nodes for r in out.rounds)
        assert all(r.acceptance == "plain" and not r.speculative for r in out.rounds)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["chain", "default"])
def test_greedy_with_oracle_heads_accepts_long_paths(arch, tree, models, hf_refs):
    """Perfect drafts: every round accepts a full path, and the output is still exactly HF's."""
    prompt = PROMPTS[0]
    loaded, ref = oracle_loaded(models[arch], prompt, N)
    out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, tree=tree, lookup=0, eos_token_id=None)
    assert out.token_ids == ref[:N] == hf_refs[arch, 0][:N]
    assert out.stats["mean_accepted_length"] > 3.5  # up to 5 = 4 drafts + bonus
    assert out.stats["target_forwards"] <= 2 + N // 4
    kinds = [t.kind for r in out.rounds[1:-1] for t in r.emitted]
    assert kinds.count("bonus") == len(out.rounds) - 2 and "correction" not in kinds


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_with_noisy_oracle_heads(arch, models, hf_refs):
    """Right token at rank 0..4 (sometimes outside the tree): partial, off-first-branch paths."""
    prompt = PROMPTS[2]
    loaded, _ = oracle_loaded(models[arch], prompt, N, rank_of=lambda pos, k: (pos * 5 + k) % 4)
    for tree in ("small", "default"):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, tree=tree, lookup=0, eos_token_id=None)
        assert out.token_ids == hf_refs[arch, 2][:N]
        assert out.stats["mean_accepted_length"] > 1.5
        assert any(r.accepted_path != tuple(range(len(r.accepted_path))) for r in out.rounds)


def test_random_heads_accept_sometimes(random_loaded):
    """Random heads are not useless on repetitive tiny-model text: some rounds accept drafts."""
    lengths = [specdec.generate(random_loaded[a], prompt_ids=p, max_new_tokens=N, tree="default", lookup=0,
                                eos_token_id=None).stats["mean_accepted_length"] for a in ARCHS for p in PROMPTS]
    assert max(lengths) > 1.5 and min(lengths) >= 1.0


# -- EOS, max_new_tokens, context ---------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_an_accepted_block(arch, models):
    """EOS that the oracle drafts mid-path: output stops at EOS inclusive, exactly like HF."""
    model = models[arch]
    checked_inside = 0
    for prompt in PROMPTS:
        loaded, ref = oracle_loaded(model, prompt, 30)
        for j in range(2, 20):
            eos = ref[j]
            if eos in ref[:j]:
                continue  # not the first occurrence: HF would stop earlier
            want = hf_greedy(model, prompt, 30, eos=eos)
            assert want == ref[: j + 1]
            out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=30, tree="chain", eos_token_id=eos)
            assert out.token_ids == want
            assert out.stats["finished"] == "eos" and out.rounds[-1].finished == "eos"
            last = out.rounds[-1].emitted
            assert last[-1].token_id == eos
            if last[-1].kind == "accepted":  # cut in the middle of an accepted path
                checked_inside += 1
            plain = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=30, speculative=False, eos_token_id=eos)
            assert plain.token_ids == want
    assert checked_inside >= 2


def test_eos_is_the_union_of_tokenizer_and_generation_config(byte_model, byte_tokenizer):
    loaded = specdec.load(byte_model, heads="random", device="cpu", tokenizer=byte_tokenizer)
    assert loaded.engine.eos_token_ids == {256}
    byte_model.generation_config.eos_token_id = [5, 7]  # an instruct model's end-of-turn list
    try:
        assert specdec.load(byte_model, heads="random").engine.eos_token_ids == {5, 7}
        assert specdec.load(byte_model, heads="random", tokenizer=byte_tokenizer).engine.eos_token_ids == {5, 7, 256}
    finally:
        byte_model.generation_config.eos_token_id = None


@pytest.mark.parametrize("speculative", [True, False])
def test_generation_stops_at_every_eos_id_of_the_generation_config(models, speculative, byte_tokenizer):
    """A two-id EOS list: generation stops at whichever comes first, as HF generate does, and
    the tokenizer's own single EOS id does not hide the list."""
    model, prompt = models["llama"], PROMPTS[1]
    free = hf_greedy(model, prompt, 40)
    for first, other in ((free[10], free[25]), (free[25], free[10])):
        eos = [first, other]
        want = hf_greedy(model, prompt, 40, eos=eos)
        assert want[-1] in eos and len(want) < 40
        model.generation_config.eos_token_id = eos
        try:
            loaded = specdec.load(model, heads="random", tokenizer=byte_tokenizer)  # its EOS (256) is not in the list
            out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=40, speculative=speculative, tree="small")
        finally:
            model.generation_config.eos_token_id = None
        assert out.token_ids == want
        assert out.stats["finished"] == "eos"


@pytest.mark.parametrize("speculative", [True, False])
def test_greedy_acceptance_is_argmax_for_every_token_at_any_temperature(models, speculative):
    """acceptance="greedy" with temperature > 0 once sampled round 0 and the plain tail rounds but
    took the argmax in tree rounds: one output, two laws. Now every token is the argmax."""
    loaded = specdec.load(models["llama"], heads="random")
    prompt = PROMPTS[0]
    ref = hf_greedy(models["llama"], prompt, 30)
    for seed in range(3):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=30, temperature=1.5, seed=seed,
                               acceptance="greedy", speculative=speculative, tree="small", eos_token_id=None)
        assert out.token_ids == ref
        assert all(r.params["temperature"] == 0 for r in out.rounds)  # events record what was used
        assert {r.acceptance for r in out.rounds} == ({"greedy"} if speculative else {"plain"})


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 11])
def test_max_new_tokens_is_exact(n, models):
    prompt = PROMPTS[0]
    loaded, ref = oracle_loaded(models["llama"], prompt, 16)
    for tree in ("chain", "default"):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=n, tree=tree, lookup=0, eos_token_id=None)
        assert out.token_ids == ref[:n]  # perfect drafts: the bonus token would overshoot if unchecked
        assert out.stats["finished"] == "length" and out.rounds[-1].total_tokens == n
    rnd = specdec.load(models["qwen2"], heads="random")
    for kw in (dict(), dict(temperature=1.0, top_k=20, seed=3), dict(speculative=False, temperature=0.8, seed=4)):
        out = specdec.generate(rnd, prompt_ids=prompt, max_new_tokens=n, eos_token_id=None, **kw)
        assert len(out.token_ids) == n and out.stats["new_tokens"] == n


@pytest.mark.parametrize("arch", ARCHS)
def test_context_length_is_never_exceeded(arch, monkeypatch):
    model = make_model(arch, context=40)
    prompt = list(range(1, 31))
    ref = hf_greedy(model, prompt, 10)  # fills the 40 positions
    loaded = specdec.load(model, heads="random", device="cpu")
    seen = []
    real = TargetModel.forward

    def spy(self, input_ids, cache, tree_mask=None, depth=None, taps=False):
        past = specdec.kv_cache.length(cache)
        top = past + (int(depth.max()) if depth is not None else input_ids.shape[0] - 1)
        seen.append(top)
        return real(self, input_ids, cache, tree_mask, depth, taps)

    monkeypatch.setattr(TargetModel, "forward", spy)
    for kw in (dict(tree="default"), dict(speculative=False)):
        seen.clear()
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=50, eos_token_id=None, **kw)
        assert max(seen) <= 39, "a position id beyond the model's context was used"
        assert out.stats["finished"] == "context"
        # all 40 positions are used: 10 tokens fed after the prompt, plus the one predicted at position 39
        assert len(out.token_ids) == 11 and out.token_ids[:10] == ref


def test_the_kv_buffer_is_sized_to_the_context_not_to_max_new_tokens(monkeypatch):
    """Decoding ends at the model's context, so a request for far more new tokens than fit gets a buffer for
    the context, and runs to it (before: prompt + max_new_tokens slots, 61 GB asked for 10**7 tokens)."""
    model = make_model("llama", context=40)
    prompt = list(range(1, 31))
    loaded = specdec.load(model, heads="random", device="cpu")
    sizes = []
    real = TargetModel.new_cache
    monkeypatch.setattr(TargetModel, "new_cache", lambda self, slots=None: sizes.append(slots) or real(self, slots))
    for kw in (dict(tree="default"), dict(speculative=False)):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=10**6, eos_token_id=None, **kw)
        assert out.stats["finished"] == "context" and len(out.token_ids) == 11
    assert sizes and all(s is not None and 40 <= s <= 41 + 2 * 64 for s in sizes), sizes
    # The position uniforms are drawn for the positions the context leaves: a seeded run is the same one.
    sampled = dict(temperature=0.8, seed=5, eos_token_id=None, prompt_ids=prompt)
    long = specdec.generate(loaded, max_new_tokens=10**6, **sampled)
    assert long.stats["finished"] == "context"
    assert long.token_ids == specdec.generate(loaded, max_new_tokens=11, **sampled).token_ids


# -- sampling determinism -------------------------------------------------------------

@pytest.mark.parametrize("speculative", [True, False])
def test_same_seed_same_output_different_seed_differs(random_loaded, speculative):
    loaded = random_loaded["llama"]
    kw = dict(prompt_ids=PROMPTS[1], max_new_tokens=20, temperature=1.0, top_p=0.95, eos_token_id=None,
              speculative=speculative, tree="default")
    a = specdec.generate(loaded, seed=123, **kw).token_ids
    assert specdec.generate(loaded, seed=123, **kw).token_ids == a
    others = {tuple(specdec.generate(loaded, seed=s, **kw).token_ids) for s in (1, 2, 3)}
    assert len(others | {tuple(a)}) >= 3
    assert specdec.generate(loaded, seed=None, **kw).rounds[0].extra["seed"] is not None


def test_top_k_1_sampling_equals_greedy(random_loaded, hf_refs):
    """With top-k = 1 the filtered law is a point mass: lossless sampling must reproduce greedy."""
    out = specdec.generate(random_loaded["gpt2"], prompt_ids=PROMPTS[0], max_new_tokens=N, temperature=1.7,
                           top_k=1, seed=9, eos_token_id=None)
    assert out.token_ids == hf_refs["gpt2", 0][:N]
    assert all(r.acceptance == "lossless" for r in out.rounds[1:])


# -- events -----------------------------------------------------------------------------

def test_round_events_are_complete(byte_model, byte_tokenizer):
    loaded = specdec.load(byte_model, heads="random", device="cpu", tokenizer=byte_tokenizer)
    seen = []
    out = specdec.generate(loaded, prompt="Hello, world", max_new_tokens=30, temperature=0.9, top_k=50,
                           top_p=0.95, min_p=0.01, seed=1, tree="small", on_round=seen.append, eos_token_id=None,
                           lookup=0)
    assert seen == out.rounds and all(a is b for a, b in zip(seen, out.rounds))
    tree = loaded.engine.resolve_tree("small")
    assert out.rounds[0].index == 0 and out.rounds[0].nodes == () and len(out.rounds[0].emitted) == 1
    assert out.rounds[0].prompt_tokens == len("Hello, world")
    total = 0
    for i, ev in enumerate(out.rounds):
        assert isinstance(ev, RoundEvent) and ev.index == i
        assert ev.params == dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, seed=1)
        assert ev.speculative is True
        assert all(isinstance(v, float) and v >= 0 for v in ev.timings.values())
        total += len(ev.emitted)
        assert ev.total_tokens == total
        assert all(t.kind in TOKEN_KINDS for t in ev.emitted)
        ev.to_dict()  # plain values only
        if i == 0:
            continue
        assert ev.acceptance == "lossless"
        assert {"draft", "forward", "rows", "verify", "total"} <= set(ev.timings)  # rows: the vocabulary projection
        # near max_new_tokens the engine truncates the tree so the round cannot overshoot
        room = 30 - ev.total_tokens + len(ev.emitted) - 1
        if room == 0:  # one token left: a plain step, no tree
            assert ev.nodes == () and ev.accepted_path == (0,) and len(ev.emitted) == 1
            continue
        t = tree if tree.max_depth <= room else tree.truncated(room)
        assert len(ev.nodes) == t.num_nodes
        path = ev.accepted_path
        assert path[0] == 0 and all(t.parent[b] == a for a, b in zip(path, path[1:]))
        for k, node in enumerate(ev.nodes):
            assert (node.parent, node.depth, node.rank) == (t.parent[k], t.depth[k], t.rank[k])
            assert node.text == byte_tokenizer.decode([node.token_id])
            if k == 0:
                assert node.status == "root" and node.draft_prob is None
                continue
            assert 0 < node.draft_prob <= 1
            assert node.status == ("accepted" if k in path else node.status)
            assert node.status in ("accepted", "rejected", "not_reached")
            if node.status in ("accepted", "rejected"):
                assert node.target_prob is not None and 0 <= node.target_prob <= 1
            if node.status == "not_reached":
                assert node.target_prob is None  # lossless: only tried children were scored
        emitted = [t.kind for t in ev.emitted]
        if ev.finished is None:
            assert emitted == ["accepted"] * (len(path) - 1) + [emitted[-1]]
            assert emitted[-1] == ("bonus" if not t.children[path[-1]] else "correction")
        for t, node in zip(ev.emitted, path[1:]):
            assert t.token_id == ev.nodes[node].token_id and t.target_prob == ev.nodes[node].target_prob
            assert t.draft_prob == ev.nodes[node].draft_prob
        assert all(t.target_prob is not None and 0 < t.target_prob <= 1 for t in ev.emitted)
    assert out.text == byte_tokenizer.decode(out.token_ids, skip_special_tokens=True)
    replay = IncrementalDecoder(byte_tokenizer)
    texts = [replay.push(i) for i in out.token_ids]
    texts[-1] += replay.flush()  # the last round flushes a trailing partial character (`with_text`)
    assert [t.text for ev in out.rounds for t in ev.emitted] == texts
    assert set(out.stats) >= {"new_tokens", "target_forwards", "mean_accepted_length", "tokens_per_second"}
    assert out.stats["target_forwards"] == len(out.rounds)
    assert out.stats["mean_accepted_length"] == pytest.approx((30 - 1) / (len(out.rounds) - 1))
    assert out.to_dict()["token_ids"] == out.token_ids


def test_greedy_event_marks_losing_siblings_rejected(random_loaded):
    out = specdec.generate(random_loaded["gpt2"], prompt_ids=PROMPTS[0], max_new_tokens=N, tree="default",
                           eos_token_id=None)
    for ev in out.rounds[1:]:
        for node in ev.nodes[1:]:
            if node.status == "not_reached":
                assert node.target_prob is None


def test_several_callbacks_and_should_stop(random_loaded):
    a, b = [], []
    stream = random_loaded["llama"].engine.stream(PROMPTS[0], 50, SamplingParams(), tree="chain",
                                                  eos_token_id=None, on_round=[a.append, b.append],
                                                  should_stop=lambda: len(a) >= 3)
    events = list(stream)
    assert events == a == b and len(events) == 3


def test_live_tuning_changes_later_rounds(random_loaded):
    """A params callable is read once per round; each event records what it used."""
    greedy, sharp = SamplingParams(seed=0), SamplingParams(temperature=1.0, top_k=1, seed=0)
    calls = []

    def params():
        calls.append(1)
        return greedy if len(calls) <= 3 else sharp

    events = list(random_loaded["qwen2"].engine.stream(PROMPTS[1], 30, params, tree="small", eos_token_id=None))
    assert len(calls) == len(events)  # read once per round (round 0 included)
    for i, ev in enumerate(events):
        want = greedy if i < 3 else sharp
        assert ev.params == want.to_dict()
        if i > 0:
            assert ev.acceptance == ("greedy" if i < 3 else "lossless")
        # top-k 1 makes p a point mass: every emitted token has p = 1; greedy reports the raw softmax
        probs = [t.target_prob for t in ev.emitted]
        if i >= 3:
            assert all(p == pytest.approx(1.0) for p in probs)
        else:
            assert all(p < 0.5 for p in probs)


def test_engine_argument_errors(random_loaded, models):
    eng = random_loaded["llama"].engine
    with pytest.raises(ValueError, match="acceptance"):
        eng.stream([1, 2], 5, acceptance="yolo")
    with pytest.raises(ValueError, match="params"):
        eng.stream([1, 2], 5, params=lambda: {"temperature": 1})
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.stream([1, 2], 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.stream([1, 2], 2.5)
    no_heads = specdec.load(models["llama"], heads=None)
    with pytest.raises(ValueError, match="heads"):
        specdec.generate(no_heads, prompt_ids=[1, 2], max_new_tokens=3, lookup=0)
    with pytest.raises(ValueError, match="tokenizer"):
        specdec.generate(no_heads, prompt="hello", speculative=False)
    with pytest.raises(ValueError, match="tree"):
        specdec.generate(random_loaded["llama"], prompt_ids=[1, 2], tree="bushy")


@pytest.mark.parametrize("ids", [[1.7, 2], [True, 3], [2, "7"]])
def test_non_integer_prompt_ids_raise(random_loaded, ids):
    with pytest.raises(ValueError, match="prompt_ids"):
        specdec.generate(random_loaded["llama"], prompt_ids=ids, max_new_tokens=2)


def test_batch_of_one_prompt_tensor(random_loaded):
    flat = specdec.generate(random_loaded["llama"], prompt_ids=[1, 2, 3], max_new_tokens=4, eos_token_id=None)
    batched = specdec.generate(random_loaded["llama"], prompt_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=4,
                               eos_token_id=None)
    assert batched.token_ids == flat.token_ids
    with pytest.raises(ValueError, match="prompt_ids"):
        specdec.generate(random_loaded["llama"], prompt_ids=torch.tensor([[1, 2], [3, 4]]), max_new_tokens=2)


def test_typical_acceptance_runs_and_is_labelled(random_loaded):
    out = specdec.generate(random_loaded["llama"], prompt_ids=PROMPTS[0], max_new_tokens=12, temperature=0.8,
                           seed=1, acceptance="typical", eos_token_id=None)
    assert len(out.token_ids) == 12
    assert all(r.acceptance == "typical" for r in out.rounds[1:])


def test_engine_event_text_keeps_characters_whole(byte_model, byte_tokenizer):
    """A scripted target whose greedy output is a UTF-8 text, drafted perfectly by oracle heads:
    the events carry whole characters only, and their concatenation is the text."""
    from conftest import OracleHeads

    text = "ok 日本 😀 é!"
    prompt = list("say: ".encode())
    script = prompt + list(text.encode()) + [0] * 8
    loaded = specdec.load(byte_model, heads="random", device="cpu", tokenizer=byte_tokenizer)
    target = loaded.engine.target
    oracle = OracleHeads(byte_model, script)
    real_logits = target.logits

    def scripted_logits(hidden, pack_one=False):  # [..., H] -> [..., V]: force the script where the hidden state is on it
        out = real_logits(hidden, pack_one).clone()
        flat, rows = hidden.reshape(-1, hidden.shape[-1]), out.view(-1, out.shape[-1])
        for r in range(flat.shape[0]):
            dist = (oracle.h_ref - flat[r]).norm(dim=-1)
            if dist.min() < 1e-3:
                rows[r] = -100.0
                rows[r, script[int(dist.argmin()) + 1]] = 100.0
        return out

    target.logits = scripted_logits
    loaded.engine.heads = oracle
    n = len(text.encode())
    events = list(loaded.engine.stream(prompt, n, SamplingParams(), tree="chain", eos_token_id=None))
    ids = [t.token_id for ev in events for t in ev.emitted]
    assert ids == script[len(prompt): len(prompt) + n]
    pieces = [t.text for ev in events for t in ev.emitted]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces.count("") == n - len(text)  # continuation bytes wait for their character
    assert max(len(ev.emitted) for ev in events) >= 3  # characters completed inside accepted blocks


