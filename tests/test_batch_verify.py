"""specdec.verifier.verify_greedy_batch, as a batched round uses it: greedy members verified together, exactly as alone.

Unit level: random trees and logits (with ties, and with trees built so that paths get accepted)
give each request the verdict `verifier.verify_greedy` gives it on its own rows; a negative control
shows the comparison catches rows read at the wrong offset. End to end: a batch of greedy requests
goes through the joint path (counted) and decodes what each decodes alone, next to sampled requests
that keep their own verification.
"""
from __future__ import annotations

import random

import pytest
import torch

import specdec
from conftest import PROMPTS
from specdec import batch as batch_mod
from specdec.draft_tree import build_tree
from specdec.request import GenerationRequest
from specdec.sampler import SamplingParams
from specdec.scheduler import Scheduler
from specdec.verifier import verify_greedy, verify_greedy_batch
from test_tree_policy import MODERATE

V = 11


def random_request(rng: random.Random, gen: torch.Generator) -> tuple[list[int], object, torch.Tensor]:
    """A random tree whose tokens often match the logits' argmax (so paths get accepted), with ties."""
    paths = set()
    for _ in range(rng.randrange(0, 9)):
        depth = rng.randrange(1, 4)
        paths.update(tuple(rng.randrange(3) for _ in range(d + 1)) for d in range(depth))
    paths = {p for p in paths if all(p[:k] in paths for k in range(1, len(p)))}
    tree = build_tree(tuple(sorted(paths, key=lambda p: (len(p), p))))
    logits = torch.randint(-3, 4, (tree.num_nodes, V), generator=gen).float()  # small ints: ties happen
    best = logits.argmax(-1).tolist()
    tokens = [rng.randrange(V)]
    for i in range(1, tree.num_nodes):
        tokens.append(best[tree.parent[i]] if rng.random() < 0.5 else rng.randrange(V))
    return tokens, tree, logits


def mismatches(requests, logits: torch.Tensor) -> list[int]:
    """Requests whose joint verdict differs from their solo `verify_greedy` verdict (probabilities to 1e-6)."""
    got = verify_greedy_batch([(t, tree) for t, tree, _ in requests], logits)
    bad = []
    for k, ((tokens, tree, own), v) in enumerate(zip(requests, got)):
        want = verify_greedy(tokens, tree, own)
        same = (v.accepted, v.next_token, v.next_kind, v.rejected, sorted(v.target_prob)) == \
               (want.accepted, want.next_token, want.next_kind, want.rejected, sorted(want.target_prob))
        close = same and abs(v.next_prob - want.next_prob) < 1e-6 and all(
            abs(v.target_prob[n] - want.target_prob[n]) < 1e-6 for n in want.target_prob)
        if not close:
            bad.append(k)
    return bad


def test_joint_verdicts_equal_each_requests_own():
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(200):
        requests = [random_request(rng, gen) for _ in range(rng.randrange(1, 9))]
        logits = torch.cat([r[2] for r in requests])
        assert mismatches(requests, logits) == []
        accepted += sum(len(v.accepted) - 1 for v in verify_greedy_batch(
            [(t, tree) for t, tree, _ in requests], logits))
    assert accepted > 200  # the trees are not all rejected at depth 1


def test_negative_control_rows_at_the_wrong_offset_are_caught():
    """A planted bug: every request reads the rows one position further on (an off-by-one in the offsets)."""
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    caught = 0
    for _ in range(50):
        requests = [random_request(rng, gen) for _ in range(4)]
        logits = torch.cat([r[2] for r in requests])
        shifted = torch.roll(logits, -1, dims=0)
        caught += bool(mismatches(requests, shifted))
    assert caught >= 45


def test_rows_must_match_the_trees():
    tokens, tree, logits = random_request(random.Random(2), torch.Generator().manual_seed(2))
    with pytest.raises(AssertionError):
        verify_greedy_batch([(tokens, tree)], torch.cat([logits, logits[:1]]))


def test_greedy_members_are_verified_together_and_decode_as_alone(models, monkeypatch):
    loaded = specdec.load(models["llama"], heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    calls = []
    joint = batch_mod.verify_greedy_batch
    monkeypatch.setattr(batch_mod, "verify_greedy_batch", lambda trees, logits: calls.append(len(trees)) or
                        joint(trees, logits))
    sampled = SamplingParams(temperature=0.9, seed=4)
    requests = [GenerationRequest(p, 20, tree=tree, lookup=lookup, eos_token_id=None)
                for p in PROMPTS for tree, lookup in (("auto", 6), ("default", 0))]
    requests.append(GenerationRequest(PROMPTS[0], 20, sampled, tree="default", lookup=0, eos_token_id=None))
    with Scheduler(loaded.engine, max_batch_size=len(requests)) as s:
        tickets = [s.submit(r) for r in requests]
        events = [list(tk) for tk in tickets]
        out = [[t.token_id for e in evs for t in e.emitted] for evs in events]
    assert calls and max(calls) >= 4, "greedy members must share a verification"
    # every round times the target's vocabulary rows apart from verification, jointly verified or alone
    assert all(e.timings.get("rows", 0.0) > 0 for evs in events for e in evs)
    solo = [[t.token_id for e in loaded.engine.stream(r) for t in e.emitted] for r in requests]
    assert out[:-1] == solo[:-1]
    assert len(out[-1]) == 20  # the sampled request verified alone, by its own rule


def test_a_plain_rounds_verdict_takes_one_sync_and_equals_the_walks():
    """A root-only tree (a plain round) has its own one-sync path: the same verdict as the joint walk
    and as the reference per-node walk, ties included (the first maximal id, as `argmax` and HF)."""
    from specdec import verifier

    gen, root = torch.Generator().manual_seed(3), build_tree(())
    for _ in range(100):
        logits = torch.randint(-3, 4, (1, V), generator=gen).float()  # small ints: ties at the max
        fast = verify_greedy([5], root, logits)
        joint = verify_greedy_batch([([5], root)], logits)[0]
        ref = verifier.verify([5], root, lambda i: logits[i], SamplingParams(), "greedy", [])
        for want in (joint, ref):
            assert (fast.accepted, fast.next_token, fast.next_kind, fast.target_prob, fast.rejected) == \
                   (want.accepted, want.next_token, want.next_kind, want.target_prob, want.rejected)
            assert abs(fast.next_prob - want.next_prob) < 1e-6
        assert fast.next_token == int(logits[0].argmax())
