"""specdec.tree_policy: the dynamic ("auto") tree, and that decoding stays exact on it.

Unit tests pin the pieces (head scores, calibration, best-first growth, sizing by cost, the heads'
rest). End to end, the dynamic tree must keep both invariants: greedy output identical to HF
`generate` (3 architectures, random and oracle heads, with and without prompt lookup), and sampled
output following the exact filtered law (chi-square against an enumerated float64 law, with
planted bugs as negative controls). The trees in those runs really vary from seed to seed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec
import specdec.engine as engine_mod
import specdec.verifier as verifier_mod
from conftest import ARCHS, PROMPTS, hf_greedy, make_model, oracle_loaded
from specdec.cost import CostModel
from specdec.draft_tree import best_first, best_tree, build_tree, expected_length
from specdec.heads import HeadsConfig, MedusaHeads
from specdec.sampler import SamplingParams, target_probs
from specdec.tree_policy import FIRST_REST, TRIAL, Calibrator, DynamicTree, head_scores
from test_lossless import CONTEXT, FAIL_P, PARAMS, PASS_P, ROOT, V, chi2_pvalue, exact_joint, exact_law

N = 24
COUNTS = (1, 2, 4, 8, 16, 32, 64)


def linear_cost(per_node_ms: float, heads_ms: float = 0.0, base_ms: float = 1.0) -> CostModel:
    """forward(n) = base + per_node * n, in seconds."""
    return CostModel(COUNTS, tuple((base_ms + per_node_ms * n) / 1e3 for n in COUNTS), heads_ms / 1e3, 0.0)


FREE = linear_cost(0.0)  # nodes cost nothing: the tree grows to its cap
STEEP = linear_cost(20.0)  # each node costs as much as a whole one-token forward: nothing pays
MODERATE = linear_cost(0.1)  # the size follows the heads' confidence


# -- head scores -----------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3),
                                    SamplingParams(temperature=0.5, top_k=20, top_p=0.8, min_p=0.05),
                                    SamplingParams(temperature=1.0, top_k=3)])
@pytest.mark.parametrize("sharpness", [1.0, 4.0])
def test_head_scores_are_the_filtered_law_of_the_candidates(params, sharpness):
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(0)) * sharpness
    q, ids, score = head_scores(logits, params)
    exact = target_probs(logits, params).gather(-1, ids)
    torch.testing.assert_close(score, exact, atol=1e-6, rtol=1e-5)  # flat laws too: the nucleus is the sampler's
    torch.testing.assert_close(q, torch.softmax(logits, -1).gather(-1, ids))
    assert (ids == torch.topk(logits, 10, -1).indices).all()


def test_greedy_scores_are_the_heads_softmax():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    q, _, score = head_scores(logits, SamplingParams())
    assert torch.equal(q, score)


# -- calibration -------------------------------------------------------------------------

def test_calibration_follows_what_verification_gave():
    cal = Calibrator(2, prior=1.0)
    assert cal.estimate(0, 0.5) == pytest.approx(0.5)  # the prior: calibrated heads
    for _ in range(30):
        cal.observe([(0, 0.5, 0.1)])  # the target agreed far less than the heads claimed
    assert cal.estimate(0, 0.5) < 0.15
    assert cal.estimate(1, 0.5) == pytest.approx(0.5)  # another depth is untouched
    for _ in range(60):
        cal.observe([(0, 0.5, 0.9)])  # old evidence decays: the estimate follows the new rate
    assert cal.estimate(0, 0.5) > 0.75
    assert cal.estimate(0, 0.9) <= 1.0


# -- best-first growth -------------------------------------------------------------------

def valid_prefix(picks) -> None:
    seen = {(): True}
    chain = 0
    for kind, path, _ in picks:
        if kind == "heads":
            assert path[:-1] in seen, f"{path} taken before its parent"
            seen[path] = True
        else:
            assert path == (chain,), "lookup chain taken out of order"
            chain += 1


@pytest.mark.parametrize("seed", range(5))
def test_best_first_order_gives_the_best_tree_of_every_size(seed):
    g = torch.Generator().manual_seed(seed)
    acc = torch.rand(4, 6, generator=g).sort(descending=True).values.tolist()
    picks = list(best_first(acc, [], 40))
    valid_prefix(picks)
    values = [v for _, _, v in picks]
    assert values == sorted(values, reverse=True)
    for n in (1, 5, 15, 40):
        mine = tuple(p for _, p, _ in picks[:n])
        assert expected_length(mine, acc) == pytest.approx(expected_length(best_tree(acc, n), acc))


def test_lookup_chain_competes_in_the_same_order():
    acc = [[0.5, 0.2], [0.5, 0.2]]
    picks = list(best_first(acc, [0.9, 0.9, 0.9], 10))
    valid_prefix(picks)
    kinds = [k for k, _, _ in picks]
    assert kinds[:3] == ["lookup"] * 3  # 0.9, 0.81, 0.73 beat every head node (0.5 at best)
    assert kinds.count("lookup") == 3 and len(picks) <= 10


def test_lookup_chains_are_calibrated_by_the_length_of_their_match():
    """A chain after a 3-gram match is likelier than one after a 1-gram match (the priors say so), and
    what 1-gram chains teach does not move the estimates of 3-gram chains."""
    policy = DynamicTree(4, MODERATE, lookup=5)
    for mode in ("greedy", "sampled"):
        one, three = (policy._lookup_estimates(5, 10, mode, m) for m in (1, 3))
        assert one[0] < three[0] and all(a <= b for a, b in zip(one, three))
        assert policy._lookup_estimates(5, 10, mode, 7) == three  # longer matches share the last class
    before = policy._lookup_estimates(5, 10, "sampled", 3)
    for _ in range(20):  # 1-gram chains whose first token the target never takes
        policy.observe(False, [], [(0, 0.0)], nodes=6, accepted=1, heads_ran=0.0, match=1)
    assert policy._lookup_estimates(5, 10, "sampled", 1)[0] < 0.05
    assert policy._lookup_estimates(5, 10, "sampled", 3) == pytest.approx(before, rel=1e-9)
    # So at a cost where a likely chain pays and an unlikely one does not, only the 3-gram chain is drafted.
    assert policy.choose(None, 5, room=10, greedy=False, match=1).chain == 0
    assert policy.choose(None, 5, room=10, greedy=False, match=3).chain > 0


def test_greedy_rounds_learn_the_candidates_they_did_not_draft():
    """Under the accepted path, every head candidate's outcome is known in greedy decoding: the policy
    learns it, once, for the depths the path reached and no deeper."""
    from specdec.drafting import _undrafted
    from specdec.run_state import Draft
    from specdec.verifier import Verdict

    tree = build_tree(((0,), (1,), (0, 0)))  # nodes: root, (0,), (1,), (0, 0)
    ids = [[10.0, 11.0, 12.0], [20.0, 21.0, 22.0], [30.0, 31.0, 32.0]]  # [D][k] head d's rank-r token
    scores = [[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]
    draft = Draft(tree, [7, 10, 11, 20], [None, 0.6, 0.3, 0.5], drafted=True, candidates=(scores, ids))
    # (0,) = 10 accepted, then (0, 0) = 20 rejected; the target's token at depth 2 was 21
    verdict = Verdict((0, 1), 21, "correction", 0.5, {}, (3,))
    drafted_seen = {(0, 0), (0, 1), (1, 0)}  # the drafted nodes whose parent was reached
    got = _undrafted(draft, verdict, drafted_seen)
    assert got == [(0, 2, 0.1, 0.0), (1, 1, 0.4, 1.0), (1, 2, 0.1, 0.0)]  # depth 3 (head 2) not reached
    # The policy's estimate for a candidate it never drafted moves once such evidence comes in.
    policy = DynamicTree(3, MODERATE)
    before = policy._head_estimates([[0.9, 0.02, 0.01]] * 3, 3, "greedy")[0][1]
    for _ in range(30):
        policy.observe(True, [(0, 1, 0.02, 1.0)], [], nodes=4, accepted=2, heads_ran=0.0)
    assert policy._head_estimates([[0.9, 0.02, 0.01]] * 3, 3, "greedy")[0][1] > 5 * before


# -- sizing by cost ------------------------------------------------------------------------

def confident(depths: int = 4) -> list[list[float]]:
    return [[0.9, 0.05, 0.02] for _ in range(depths)]


def test_free_nodes_grow_the_tree_to_its_cap():
    choice = DynamicTree(4, FREE).choose(confident(), 0, room=10, greedy=True)
    assert len(choice.paths) == FREE.max_nodes - 1
    build_tree(choice.paths)  # a valid tree


def test_expensive_nodes_leave_the_root_alone():
    policy = DynamicTree(4, STEEP)
    choice = policy.choose(None, 3, room=10, greedy=True)  # no heads this round, a lookup chain on offer
    assert choice.paths == () and choice.chain == 0 and choice.expected == 1.0
    # Once the heads ran, their best node is drafted anyway, so that calibration keeps learning.
    assert policy.choose(confident(), 0, room=10, greedy=True).paths == ((0,),)


def test_room_bounds_the_depth():
    choice = DynamicTree(4, FREE).choose(confident(), 3, room=2, greedy=True)
    assert max(len(p) for p in choice.paths) <= 2 and choice.chain <= 2


def test_a_flatter_law_drafts_a_smaller_tree():
    """The same heads at a higher temperature score lower, so the next round's tree shrinks."""
    logits = torch.zeros(4, 100)
    logits[:, 0], logits[:, 1] = 6.0, 4.0
    sizes = []
    for t in (0.3, 1.0, 2.0):
        _, _, score = head_scores(logits, SamplingParams(temperature=t))
        sizes.append(len(DynamicTree(4, MODERATE).choose(score.tolist(), 0, 10, greedy=False).paths))
    assert sizes[0] > sizes[1] > sizes[2], sizes


@pytest.mark.parametrize("greedy", [True, False])
def test_heads_a_little_slower_than_plain_rest_when_sampling_but_not_when_greedy(greedy):
    """Priced by a load-time model, a greedy rate within 20% of plain's is no evidence that the heads lose."""
    cost = linear_cost(0.1, heads_ms=0.5)  # a plain round 1.1 ms; an 8-node round with the heads 2.3 ms
    plain = 1.0 / cost.round_time(1, False)
    accepted = 0.9 * plain * cost.round_time(8, True, 2.0, not greedy)  # 10% slower than plain decoding
    policy = DynamicTree(4, cost)
    policy.probe = False  # every head, from the first round
    for _ in range(TRIAL["greedy"] + 4):
        assert policy.wants_heads(0, 10, greedy) == 4
        policy.observe(greedy, [], [], nodes=8, accepted=accepted, heads_ran=1.0)
        if not greedy:
            break
    assert (policy.wants_heads(0, 10, greedy) == 4) is greedy
    # Far below plain (random heads), greedy heads rest too.
    policy = DynamicTree(4, cost)
    for _ in range(TRIAL["greedy"]):
        policy.observe(True, [], [], nodes=8, accepted=1, heads_ran=1.0)
    assert policy.wants_heads(0, 10, True) == 0


def test_heads_rest_after_rounds_that_did_not_pay_and_come_back_through_a_probe():
    assert DynamicTree(4, linear_cost(0.1, heads_ms=2.0)).wants_heads(0, 10, greedy=True) == 4  # greedy opens with all
    policy = DynamicTree(4, linear_cost(0.1, heads_ms=2.0))
    assert policy.wants_heads(0, 10, greedy=False) == 1  # a sampled request opens with a probe of the first head
    policy.observe(True, [(0, 0, 0.9, 1.0)], [], nodes=2, accepted=2, heads_ran=0.25)
    assert policy.wants_heads(0, 10, greedy=True) == 0 and policy.wants_heads(0, 10, greedy=True) == 1
    policy.observe(True, [(0, 0, 0.9, 1.0)], [], nodes=2, accepted=2, heads_ran=0.25)
    assert policy.wants_heads(0, 10, greedy=True) == 4  # two good probes: all four heads
    for _ in range(TRIAL["greedy"] - 1):  # full greedy rounds that accept nothing: judged after a trial
        policy.observe(True, [(0, 0, 0.9, 0.0)], [], nodes=8, accepted=1, heads_ran=1.0)
        assert policy.wants_heads(0, 10, greedy=True) == 4
    policy.observe(True, [(0, 0, 0.9, 0.0)], [], nodes=8, accepted=1, heads_ran=1.0)
    # a rest, then a probe with the first head alone
    assert [policy.wants_heads(0, 10, True) for _ in range(FIRST_REST + 1)] == [0] * FIRST_REST + [1]
    policy.observe(True, [(0, 0, 0.9, 0.0)], [], nodes=2, accepted=1, heads_ran=0.25)  # the probe failed
    assert sum(policy.wants_heads(0, 10, True) == 0 for _ in range(20)) == 4 * FIRST_REST  # a longer rest
    policy.observe(True, [(0, 0, 0.9, 1.0)], [], nodes=2, accepted=2, heads_ran=0.25)  # this probe paid:
    assert [policy.wants_heads(0, 10, True) for _ in range(2)] == [0, 1]  # one more, soon, to be sure
    policy.observe(True, [(0, 0, 0.9, 1.0)], [], nodes=2, accepted=2, heads_ran=0.25)  # paid again
    assert [policy.wants_heads(0, 10, True) for _ in range(5)] == [4] * 5  # all heads, every round


def test_sampled_heads_back_from_probes_are_judged_on_their_first_full_round():
    policy = DynamicTree(4, linear_cost(0.1, heads_ms=2.0))
    assert policy.wants_heads(0, 10, greedy=False) == 1
    policy.observe(False, [], [], nodes=2, accepted=2, heads_ran=0.25)
    assert [policy.wants_heads(0, 10, greedy=False) for _ in range(2)] == [0, 1]
    policy.observe(False, [], [], nodes=2, accepted=2, heads_ran=0.25)  # two probes paid: every head, on trial
    assert policy.wants_heads(0, 10, greedy=False) == 4
    policy.observe(False, [], [], nodes=8, accepted=1, heads_ran=1.0)  # a full round that did not pay
    assert TRIAL["sampled"] == 1 and policy.rest == FIRST_REST  # rested at once (greedy waits for a trial)


def test_the_heads_probe_computes_only_the_first_head(llama):
    loaded = specdec.load(llama, heads="random", device="cpu")
    heads = loaded.heads
    for blk in heads.blocks:  # non-zero blocks, so each head differs
        torch.nn.init.normal_(blk[0].linear.weight, std=0.1)
    h = torch.randn(heads.config.hidden_size)
    torch.testing.assert_close(heads.first(h, 1), heads(h)[:1])
    torch.testing.assert_close(heads.first(h, 3), heads(h)[:3])


# -- end to end: greedy exactness ------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_refs(models):
    return {(a, i): hf_greedy(models[a], p, N) for a in ARCHS for i, p in enumerate(PROMPTS)}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cost", [FREE, MODERATE], ids=["free", "moderate"])
@pytest.mark.parametrize("lookup", [0, 6])
def test_dynamic_greedy_equals_hf_generate(arch, cost, lookup, models, hf_refs):
    loaded = specdec.load(models[arch], heads="random", device="cpu")
    loaded.engine.set_cost_model(cost)
    sizes = set()
    for i, prompt in enumerate(PROMPTS):
        out = specdec.generate(loaded, prompt_ids=prompt, max_new_tokens=N, tree="auto", lookup=lookup,
                               eos_token_id=None)
        assert out.token_ids == hf_refs[arch, i], f"prompt {i}"
        sizes |= {len(r.nodes) for r in out.rounds[1:]}
        assert all(r.expected_length is not None for r in out.rounds[1:])
    assert len(sizes) > 1, "the tree must change size from round to round"


@pytest.mark.parametrize("arch", ARCHS)
def test_dynamic_greedy_with_oracle_heads_grows_and_stays_exact(arch, models, hf_refs):
    """Perfect heads: calibration learns they are right, trees go deep, output is still HF's."""
    loaded, ref = oracle_loaded(models[arch], PROMPTS[0], N)
    loaded.engine.set_cost_model(MODERATE)
    out = specdec.generate(loaded, prompt_ids=PROMPTS[0], max_new_tokens=N, tree="auto", lookup=0, eos_token_id=None)
    assert out.token_ids == ref[:N] == hf_refs[arch, 0]
    assert out.stats["mean_accepted_length"] > 3.0


def test_seeded_sampling_reproduces_whatever_sizes_the_trees(models):
    """A seeded request gives the same tokens whatever trees the policy drafts (tokens come from the
    position uniforms, not from the tree): here the cost model that sizes the trees changes between runs."""
    from bench.oracle import OracleHeads
    model = models["llama"]
    loaded = specdec.load(model, heads=OracleHeads(model, accuracy=0.8, seed=3), device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    plain = [t.token_id for e in loaded.engine.stream(PROMPTS[1], 30, params, speculative=False, eos_token_id=None)
             for t in e.emitted]
    loaded.engine.heads.begin(PROMPTS[1] + plain + [0] * 6)  # heads that draft this very continuation

    def run(cost):
        loaded.engine.set_cost_model(cost)
        events = list(loaded.engine.stream(PROMPTS[1], 30, params, tree="auto", eos_token_id=None))
        return [t.token_id for e in events for t in e.emitted], [len(e.nodes) for e in events]

    first, again = run(MODERATE), run(FREE)
    assert again[0] == first[0] == plain
    assert again[1] != first[1], "the cost model must have changed the trees"


# -- end to end: the sampled law --------------------------------------------------------------

N_DYNAMIC = 2000


@pytest.fixture(scope="module")
def small_model():
    return make_model("llama", vocab=V, seed=3, init=0.2)


@pytest.fixture(scope="module")
def joint_after_two(small_model):
    """Exact law of (t3, t4) after the prompt, t1 and t2 marginalised out. [V, V]"""
    prompt = CONTEXT + [ROOT]
    p1 = exact_law(small_model, prompt)
    out = np.zeros((V, V))
    for a in range(V):
        if p1[a] > 0:
            p2 = exact_law(small_model, prompt + [a])
            out += sum(p1[a] * p2[b] * exact_joint(small_model, prompt + [a, b]) for b in range(V) if p2[b] > 0)
    return out


class MoodyHeads(MedusaHeads):
    """Heads whose confidence swings with the hidden state they read: their logits are the target's
    own, sharpened by a factor from 0.2 to 5 that depends on the last token. So the round-1 tree
    grown from them changes size with t1, a token sampled by the prefill."""

    def __init__(self, model) -> None:
        lm_head = model.get_output_embeddings()
        super().__init__(HeadsConfig(lm_head.in_features, lm_head.out_features, 4, num_layers=0,
                                     shared_lm_head=True), lm_head)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sharp = 0.2 + 4.8 * torch.sigmoid(hidden.float().sum() * 4)
        return super().forward(hidden) * sharp


def dynamic_counts(model, n: int, seed0: int) -> tuple[np.ndarray, set[tuple[int, ...]]]:
    """Counts of (t3, t4) over n seeded runs on the dynamic tree, and the tree sizes of rounds 1-3.

    Round 1's heads read the prompt's last hidden state, so its tree is the same in every run;
    later rounds' trees are grown from the hidden state of what earlier rounds accepted, from the
    calibration their verdicts updated, and from the heads' rest schedule: they depend on earlier
    random draws, as trees do in real use.
    """
    loaded = specdec.load(model, heads=MoodyHeads(model), device="cpu")
    loaded.engine.set_cost_model(linear_cost(0.03))
    counts, sizes = np.zeros((V, V)), set()
    for i in range(n):
        events = list(loaded.engine.stream(CONTEXT + [ROOT], 6, PARAMS.replace(seed=seed0 + i), tree="auto",
                                           eos_token_id=None))
        toks = [t.token_id for e in events for t in e.emitted]
        sizes.add(tuple(len(e.nodes) for e in events[1:4]))
        counts[toks[2], toks[3]] += 1
    return counts, sizes


@pytest.fixture(params=["opening probe", "opening with every head"])
def opening(request, monkeypatch):
    """Sampled requests open with a probe of the first head (the default), or with every head (as
    greedy ones do, and as after two good probes): the second gives bigger, more varied trees at once."""
    if request.param == "opening with every head":
        real = DynamicTree.__init__

        def full(self, *a, **kw):
            real(self, *a, **kw)
            self.probe = False

        monkeypatch.setattr(DynamicTree, "__init__", full)
    return request.param


@pytest.mark.slow
def test_dynamic_tree_is_lossless(small_model, joint_after_two, opening):
    counts, sizes = dynamic_counts(small_model, N_DYNAMIC, seed0=30_000)
    assert len({s[1:] for s in sizes}) >= 2, f"later trees must vary with the sampled history, got {sizes}"
    assert counts[joint_after_two == 0].sum() == 0
    p = chi2_pvalue(counts, joint_after_two)
    print(f"\n[engine, dynamic tree, {opening}, round 1-3 sizes {sorted(sizes)}] chi-square p = {p:.4g}")
    assert p > PASS_P


@pytest.mark.slow
def test_dynamic_tree_negative_control_accepts_first_children(small_model, joint_after_two, opening, monkeypatch):
    """A planted bug: every drafted node on the first-child path is accepted without the test."""
    real = verifier_mod.verify

    def accept_first(tokens, tree, logits_at, params, rule, uniforms, **kw):
        if tree.num_nodes == 1:
            return real(tokens, tree, logits_at, params, rule, uniforms, **kw)
        path = [0]
        while tree.children[path[-1]]:
            path.append(tree.children[path[-1]][0])
        tok, _, _ = verifier_mod.draw(target_probs(logits_at(path[-1]), params), uniforms[len(path) - 1])
        return verifier_mod.Verdict(tuple(path), tok, "bonus", 0.0, {}, ())

    monkeypatch.setattr(engine_mod, "verify", accept_first)
    counts, _ = dynamic_counts(small_model, N_DYNAMIC // 2, seed0=30_000)
    p = chi2_pvalue(counts, joint_after_two)
    print(f"\n[engine, dynamic tree] accept-first-children control p = {p:.4g}")
    assert p < FAIL_P
