"""`GenerationRequest(last_law=k)`: the finished event carries the law its last token was drawn from.

That law is read from the final round's own forward, so it must be the law a cache-free forward of
the prompt and every token but the last gives (up to float rounding), whichever node of the tree the
last token came from: the last accepted node's row (a correction or bonus), or, when EOS cuts an
accepted path short, the row of the EOS draft's parent. (max_new_tokens never cuts a path: the tree is
drafted no deeper than the tokens left.)
"""
from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPTS, oracle_loaded, submit_together
from specdec.sampler import SamplingParams, filter_stages


def _expected(loaded, prompt, tokens, params, top):
    return filter_stages(loaded.engine.next_logits(list(prompt) + tokens[:-1]), params, top)


def _close(rows, ref):
    assert [r["token_id"] for r in rows] == [r["token_id"] for r in ref]
    for a, b in zip(rows, ref):
        assert a["prob"] == pytest.approx(b["prob"], abs=1e-5)
        assert a["filtered_prob"] == pytest.approx(b["filtered_prob"], abs=1e-5)
        assert a["removed_by"] == b["removed_by"]


@pytest.fixture(scope="module")
def oracle(llama):
    return oracle_loaded(llama, PROMPTS[1], 40)[0]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_finished_event_carries_the_last_tokens_law(oracle, temperature):
    """Solo engine: every length from 1 to 14, so the run ends in round 0 and after paths of every length."""
    params = SamplingParams(temperature=temperature, top_k=20, seed=3)
    for n in range(1, 15):
        req = specdec.GenerationRequest(PROMPTS[1], n, params, "default", last_law=7)
        events = list(oracle.engine.stream(req))
        tokens = [t.token_id for ev in events for t in ev.emitted]
        assert len(tokens) == n and events[-1].finished == "length"
        assert all("last_law" not in ev.extra for ev in events[:-1])
        law = events[-1].extra["last_law"]
        assert len(law) == 7
        _close(law, _expected(oracle, PROMPTS[1], tokens, params, 7))
        assert law[0]["token_id"] == tokens[-1] or temperature > 0  # greedy: the last token is its argmax


def test_batched_requests_carry_their_own_law(oracle):
    """Through the scheduler: requests decoded together, each its own law, at its own length."""
    params = SamplingParams(temperature=0.0)
    reqs = [specdec.GenerationRequest(PROMPTS[1], n, params, "default", last_law=5) for n in (3, 6, 9, 13)]
    tickets = submit_together(oracle.scheduler, reqs)
    for req, ticket in zip(reqs, tickets):
        events = ticket.result(timeout=60)
        tokens = [t.token_id for ev in events for t in ev.emitted]
        _close(events[-1].extra["last_law"], _expected(oracle, PROMPTS[1], tokens, params, 5))


def _eos_runs(llama, control=False):
    """Runs ended by EOS at each of the first 12 positions of the greedy continuation: (events, ok)."""
    loaded, ref = oracle_loaded(llama, PROMPTS[0], 20)
    params = SamplingParams(temperature=0.0)
    out = []
    for at in range(12):
        if ref[at] in ref[:at]:
            continue  # an earlier copy of that id would end the run there
        req = specdec.GenerationRequest(PROMPTS[0], 20, params, "default", eos_token_id=ref[at], last_law=4)
        events = list(loaded.engine.stream(req))
        tokens = [t.token_id for ev in events for t in ev.emitted]
        assert events[-1].finished == "eos" and tokens == ref[: at + 1]
        try:
            _close(events[-1].extra["last_law"], _expected(loaded, PROMPTS[0], tokens, params, 4))
            out.append((events, True))
        except AssertionError:
            if not control:
                raise
            out.append((events, False))
    return out


def test_eos_inside_an_accepted_path_and_round_zero(llama):
    """EOS at every early position: in round 0, as a bonus, and as an accepted draft with more after it."""
    runs = _eos_runs(llama)
    mid_path = sum(evs[-1].emitted[-1].kind == "accepted" for evs, _ in runs)
    assert mid_path >= 2, "no EOS landed inside an accepted path: a wrong row would go unseen"
    assert any(len(evs) == 1 for evs, _ in runs)  # EOS as the first token: the run ends at round 0


def test_off_by_default_and_checked(oracle):
    events = list(oracle.engine.stream(specdec.GenerationRequest(PROMPTS[1], 5, tree="default")))
    assert all("last_law" not in ev.extra for ev in events)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="`last_law` must be an integer >= 0"):
            specdec.GenerationRequest(PROMPTS[1], 5, last_law=bad)


def test_a_wrong_row_is_caught(llama, monkeypatch):
    """Negative control: the last accepted node's row, whatever EOS kept, fails where EOS cut the path."""
    from specdec import engine as engine_mod

    real = engine_mod.Engine._commit

    def wrong(self, run, draft, verdict, hidden):
        out = real(self, run, draft, verdict, hidden)
        if run.law_row is not None:
            run.law_row = hidden[verdict.accepted[-1]]
        return out

    monkeypatch.setattr(engine_mod.Engine, "_commit", wrong)
    runs = _eos_runs(llama, control=True)
    assert sum(not ok for _, ok in runs) >= 2


def test_the_law_is_on_the_cpu_as_plain_values(oracle):
    ev = list(oracle.engine.stream(specdec.GenerationRequest(PROMPTS[1], 3, tree="default", last_law=3)))[-1]
    assert all(isinstance(r["prob"], float) and not isinstance(r["token_id"], torch.Tensor)
               for r in ev.extra["last_law"])
