"""specdec.scheduler: continuous batching, per-request faults, cancellation, and each request's own law.

Requests join and leave mid-run; one that fails (a bad callback, a bad params source, a NaN row, a
simulated CUDA out-of-memory) ends with a clear error and keeps its events, while every other request
completes with exactly its solo output; a client that stops reading frees its slot within a round.
A chi-square per request in a mixed batch (different sampler settings side by side) checks that each
follows its own filtered law, with a negative control that verifies a request by another's params.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import specdec
import specdec.engine as engine_mod
from conftest import PROMPTS, hf_greedy, make_model, naive_logits, reference_probs, submit_together, wait_until
from specdec.request import GenerationRequest
from specdec.sampler import SamplingParams
from specdec import RequestFailed, Scheduler
from test_lossless import CONTEXT, FAIL_P, PASS_P, ROOT, V, chi2_pvalue
from test_tree_policy import MODERATE

pytestmark = pytest.mark.usefixtures("schedulers_idle")

N = 20


@pytest.fixture(scope="module")
def loaded(models):
    out = specdec.load(models["llama"], heads="random", device="cpu")
    out.engine.set_cost_model(MODERATE)
    return out


@pytest.fixture(scope="module")
def refs(models):
    return [hf_greedy(models["llama"], p, N) for p in PROMPTS]


def tokens(events) -> list[int]:
    return [t.token_id for e in events for t in e.emitted]


def outcomes_of(tickets) -> list:
    """Each ticket's token ids, or the RequestFailed that ended it."""
    out = []
    for t in tickets:
        try:
            out.append(tokens(t))
        except RequestFailed as e:
            out.append(e)
    return out


def requests(n=N, **kw) -> list[GenerationRequest]:
    return [GenerationRequest(p, n, lookup=6, eos_token_id=None, **kw) for p in PROMPTS * 2]


def test_arguments_are_checked(loaded):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_batch_size"):
            Scheduler(loaded.engine, max_batch_size=bad)
    with pytest.raises(ValueError, match="prefill_chunk"):
        Scheduler(loaded.engine, prefill_chunk=0)
    with Scheduler(loaded.engine) as s:
        with pytest.raises(ValueError, match="prompt_ids"):
            s.submit([10_000], 4)  # refused in the caller's thread, before any round
        with pytest.raises(TypeError):
            s.submit(GenerationRequest([1, 2], 2), 4)


def test_batch_size_one_is_one_at_a_time(loaded, refs):
    with Scheduler(loaded.engine, max_batch_size=1) as s:
        tickets = [s.submit(r) for r in requests()]
        assert [tokens(t) for t in tickets] == refs * 2
        assert set(s.stats()["batch_sizes"]) == {1}


def test_a_started_scheduler_is_closed_at_exit_until_closed_by_hand(loaded, monkeypatch):
    """A running scheduler's thread is stopped before the interpreter ends (a daemon thread holding an
    OpenMP pool at exit sometimes aborted `specdec generate`); closing it by hand drops the hook."""
    import specdec.scheduler as scheduler_mod

    hooks: list = []

    class Recorder:
        register, unregister = hooks.append, hooks.remove

    monkeypatch.setattr(scheduler_mod, "atexit", Recorder)
    sched = Scheduler(loaded.engine, max_batch_size=2)
    assert hooks == []  # no thread yet, nothing to stop
    assert len(sched.submit(requests(1)[0]).result()) > 0
    assert len(hooks) == 1
    hooks[0]()  # what the interpreter calls at exit: the thread stops, and the hook goes
    assert not sched._thread.is_alive() and hooks == []
    with pytest.raises(RuntimeError, match="closed"):
        sched.submit(requests(1)[0])


def test_call_soon_runs_on_the_scheduler_thread_and_returns_a_future(loaded):
    with Scheduler(loaded.engine, max_batch_size=2) as sched:
        fut = sched.call_soon(lambda x: (x, threading.current_thread().name), 3)
        assert fut.result(timeout=30) == (3, "specdec-scheduler")

        def fails():
            raise ValueError("`x` is out of range")

        with pytest.raises(ValueError, match="out of range"):
            sched.call_soon(fails).result(timeout=30)


def test_requests_join_and_leave_mid_run(loaded, refs):
    """Late requests join while others decode; short ones leave and free their rows for the next."""
    late: list = []
    with Scheduler(loaded.engine, max_batch_size=3) as s:

        def join_later(ev):  # runs on the scheduler thread, between rounds
            if ev.index == 2 and len(late) < 3:
                late.append(s.submit(GenerationRequest(PROMPTS[len(late)], N, lookup=6, eos_token_id=None)))

        first = [s.submit(GenerationRequest(p, n, lookup=6, eos_token_id=None), on_round=join_later)
                 for p, n in zip(PROMPTS, (N, 5, 9))]
        assert [tokens(t) for t in first] == [refs[0], refs[1][:5], refs[2][:9]]
        wait_until(lambda: len(late) == 3, 30, "the three late requests")
        assert [tokens(t) for t in late] == refs
        sizes = s.stats()["batch_sizes"]
    assert max(sizes) == 3 and len(sizes) > 1


def test_live_params_reach_the_next_round(loaded):
    """A params callable is read once per round, on the scheduler thread."""
    box = {"p": SamplingParams()}
    seen = []
    with Scheduler(loaded.engine) as s:
        def flip(ev):
            seen.append(ev.params["temperature"])
            if ev.index == 2:
                box["p"] = SamplingParams(temperature=0.9, seed=3)
        t = s.submit(GenerationRequest(PROMPTS[1], 30, params=lambda: box["p"], lookup=0, eos_token_id=None),
                     on_round=flip)
        t.result(timeout=60)
    assert seen[:3] == [0.0] * 3 and set(seen[3:]) == {0.9}


# -- faults stay with their request -----------------------------------------------------------

def run_with_fault(loaded, fault_hook=None, callbacks=None, params=None, max_batch_size=4):
    """Six requests (two of each prompt) in batches of `max_batch_size`; request 1 may be the faulty one."""
    reqs = requests()
    if params is not None:
        reqs[1] = GenerationRequest(PROMPTS[1], N, params=params, lookup=6, eos_token_id=None)
    with Scheduler(loaded.engine, max_batch_size=max_batch_size, fault_hook=fault_hook) as s:
        tickets = [s.submit(r, on_round=(callbacks or {}).get(i)) for i, r in enumerate(reqs)]
        return outcomes_of(tickets), tickets, s.stats()


def check_isolated(outcomes, tickets, stats, refs, cause: str, rounds_before: int):
    failed = outcomes[1]
    assert isinstance(failed, RequestFailed) and failed.failure.cause == cause, failed
    assert f"({failed.failure.step}, {cause})" in str(failed)
    assert len(tickets[1].events) == rounds_before  # its partial output stays
    assert tokens(tickets[1].events) == refs[1][: len(tokens(tickets[1].events))]
    assert [o for i, o in enumerate(outcomes) if i != 1] == [refs[0], refs[2], refs[0], refs[1], refs[2]]
    assert stats["failures"][cause] == 1 and sum(stats["failures"].values()) == 1


def test_a_failing_callback_ends_its_request_alone(loaded, refs):
    def bad(ev):
        if ev.index == 3:
            raise KeyError("the client's callback broke")

    outcomes, tickets, stats = run_with_fault(loaded, callbacks={1: bad})
    check_isolated(outcomes, tickets, stats, refs, "callback", rounds_before=4)  # round 3's event was made
    assert "KeyError" in str(outcomes[1])


def test_a_failing_params_source_ends_its_request_alone(loaded, refs):
    calls = {"n": 0}

    def params():
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("slider state lost")
        return SamplingParams()

    outcomes, tickets, stats = run_with_fault(loaded, params=params)
    check_isolated(outcomes, tickets, stats, refs, "params", rounds_before=3)


@pytest.mark.parametrize("max_batch_size", [4, 1])
def test_simulated_out_of_memory_in_the_shared_forward(loaded, refs, max_batch_size):
    """The hook raises CUDA's OOM inside request 1's forward: the batch's forward fails, every request is
    retried alone in its row, and only request 1 ends."""
    def hook(rid, index, step):
        if rid == 1 and index == 3 and step == "forward":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    outcomes, tickets, stats = run_with_fault(loaded, fault_hook=hook, max_batch_size=max_batch_size)
    check_isolated(outcomes, tickets, stats, refs, "out_of_memory", rounds_before=3)


def test_a_fault_in_round_0_leaves_no_events(loaded, refs):
    def hook(rid, index, step):
        if rid == 1 and step == "forward":
            raise RuntimeError("prefill broke")

    outcomes, tickets, stats = run_with_fault(loaded, fault_hook=hook)
    check_isolated(outcomes, tickets, stats, refs, "error", rounds_before=0)


def test_a_nan_row_ends_its_request_and_its_row_is_cleaned(models, refs):
    """Real NaNs in request 1's rows (hidden states and KV): it fails as non-finite; the next request
    that takes its row (more requests than rows) still decodes exactly."""
    model = models["llama"]
    loaded = specdec.load(model, heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    state = {"rows": None, "batched": False}
    target = loaded.engine.target
    real_rows = target.forward_rows

    def forward_rows(*args):
        state["batched"] = True
        try:
            return real_rows(*args)
        finally:
            state["batched"] = False

    target.forward_rows = forward_rows

    def poison(module, args, output):  # one batched forward, one row: its embeddings become NaN
        row = state["rows"]
        if row is not None and state["batched"] and output.shape[0] > row:
            state["rows"] = None
            output = output.clone()
            output[row] = float("nan")
            return output
        return None

    with Scheduler(loaded.engine, max_batch_size=2) as s:
        def arm(ev):  # after request 1's round 2, poison its row in the next batched forward
            if ev.index == 2:
                member = next(m for m in s._batch.members if m.rid == 1)
                state["rows"] = member.run.cache.row

        handle = model.get_input_embeddings().register_forward_hook(poison)
        try:
            reqs = requests()
            tickets = [s.submit(r, on_round=arm if i == 1 else None) for i, r in enumerate(reqs)]
            outcomes = outcomes_of(tickets)
        finally:
            handle.remove()
        stats = s.stats()
    check_isolated(outcomes, tickets, stats, refs, "non_finite", rounds_before=3)


# -- disconnects ---------------------------------------------------------------------------------

def test_a_client_that_stops_reading_frees_its_slot_within_a_round(loaded, refs):
    with Scheduler(loaded.engine, max_batch_size=1) as s:
        long = s.submit(GenerationRequest(PROMPTS[0], 200, lookup=0, eos_token_id=None))
        waiting = s.submit(GenerationRequest(PROMPTS[1], N, lookup=6, eos_token_id=None))
        stream = iter(long)
        for _ in range(2):
            next(stream)
        stream.close()  # the client went away (a closed tab: Gradio closes the generator)
        made = len(long.events)  # the scheduler runs ahead of its reader: rounds made before it left
        assert tokens(waiting) == refs[1]  # the one slot came free
        assert long.done.is_set() and long.failure is None
        assert len(long.events) <= made + 1  # at most the round already running when it left
        assert s.stats()["decoding"] == 0


def test_should_stop_and_cancel_end_requests_without_error(loaded):
    with Scheduler(loaded.engine) as s:
        stopped = s.submit(GenerationRequest(PROMPTS[0], 100, eos_token_id=None), should_stop=lambda: True)
        assert len(stopped.result(timeout=60)) == 1
        t = s.submit(GenerationRequest(PROMPTS[1], 100, eos_token_id=None))
        t.cancel()
        t.done.wait(60)
        assert t.failure is None and len(t.events) <= 1


def test_on_end_is_called_once_after_the_last_event_with_the_failure_or_none(loaded):
    """`on_end` (what an engine process sends its "end" message from) comes once per request, after its
    last event: None when it finished, stopped or was cancelled; the Failure when it failed."""
    ended: dict[str, list] = {}

    def watch(name):
        ended[name] = []
        seen = []
        return dict(on_round=lambda ev: seen.append(ev.index),
                    on_end=lambda failure: ended[name].append((failure, list(seen))))

    def boom(ev):
        if ev.index == 1:
            raise RuntimeError("boom")

    with Scheduler(loaded.engine) as s:
        done = s.submit(GenerationRequest(PROMPTS[0], 12, eos_token_id=None), **watch("done"))
        stopped = s.submit(GenerationRequest(PROMPTS[1], 100, eos_token_id=None), should_stop=lambda: True,
                           **watch("stopped"))
        failing = watch("failed")
        failed = s.submit(GenerationRequest(PROMPTS[2], 100, eos_token_id=None),
                          on_round=[failing["on_round"], boom], on_end=failing["on_end"])
        events = done.result(timeout=60)
        stopped.result(timeout=60)
        with pytest.raises(RequestFailed):
            failed.result(timeout=60)
        cancelled = s.submit(GenerationRequest(PROMPTS[0], 100, eos_token_id=None), **watch("cancelled"))
        cancelled.cancel()
        cancelled.done.wait(60)
    assert ended["done"] == [(None, [ev.index for ev in events])]
    assert ended["stopped"] == [(None, [0])]
    [(failure, seen)] = ended["failed"]
    assert failure.cause == "callback" and "boom" in failure.message and seen == [0, 1]
    assert len(ended["cancelled"]) == 1 and ended["cancelled"][0][0] is None


def test_close_ends_running_requests_with_an_error(loaded):
    s = Scheduler(loaded.engine, max_batch_size=1)
    gate = threading.Event()
    t = s.submit(GenerationRequest(PROMPTS[0], 150, lookup=0, eos_token_id=None), on_round=lambda ev: gate.set())
    queued = s.submit(GenerationRequest(PROMPTS[1], 150, eos_token_id=None))
    gate.wait(60)
    s.close()
    for x in (t, queued):
        with pytest.raises(RequestFailed, match="closed"):
            x.result(timeout=60)
    with pytest.raises(RuntimeError, match="closed"):
        s.submit(GenerationRequest(PROMPTS[0], 2))


def test_call_runs_between_rounds(loaded):
    with Scheduler(loaded.engine) as s:
        logits = s.call(loaded.engine.next_logits, PROMPTS[0])
    torch.testing.assert_close(logits, loaded.engine.next_logits(PROMPTS[0]))


def test_an_error_outside_every_requests_steps_fails_those_in_flight_and_the_thread_serves_on(loaded, refs, caplog):
    """A bug of ours in the loop itself (here: the batched round raises once) must not kill the thread:
    the requests in flight end with an error naming the scheduler, and the next requests are exact."""
    from specdec.batch import Batch

    real, state = Batch.round, {"raise": True}

    def round_once_broken(self):
        if state["raise"]:
            state["raise"] = False
            raise RuntimeError("a planted scheduler bug")
        return real(self)

    with Scheduler(loaded.engine, max_batch_size=4) as s:
        with caplog.at_level("ERROR"):
            Batch.round = round_once_broken
            try:
                first = outcomes_of(submit_together(s, requests()[:3]))
            finally:
                Batch.round = real
        after = outcomes_of([s.submit(r) for r in requests()[:3]])
        stats = s.stats()
    assert all(isinstance(o, RequestFailed) and o.failure.step == "scheduler" for o in first), first
    assert "a planted scheduler bug" in str(first[0]) and "scheduler error" in caplog.text
    assert after == refs and stats["failures"]["error"] == 3


def test_an_error_as_a_request_joins_the_batch_ends_it_and_the_next_is_exact(loaded, refs):
    """The batch's buffer fails to grow (a simulated CUDA out-of-memory) as a request that ran round 0
    alone joins: between its round 0 and its place in the batch it is in no list but the tickets', and it
    must still end with the error (it waited forever once), counted by cause."""
    from specdec import kv_cache

    real, state = kv_cache.BatchCache.grow, {"raise": True}

    def grow(self, capacity):
        if state.pop("raise", False):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, capacity)

    with Scheduler(loaded.engine, max_batch_size=4) as s:
        kv_cache.BatchCache.grow = grow
        try:
            with pytest.raises(RequestFailed, match="scheduler, out_of_memory"):
                s.submit(requests()[0]).result(timeout=30)
        finally:
            kv_cache.BatchCache.grow = real
        assert outcomes_of([s.submit(r) for r in requests()[:3]]) == refs
        assert s.stats()["failures"]["out_of_memory"] == 1


# -- each request of a mixed batch follows its own law -----------------------------------------

KINDS = {  # sampler settings side by side in one batch
    "a": SamplingParams(temperature=1.5, top_k=6, top_p=0.92, min_p=0.05),
    "b": SamplingParams(temperature=0.7, top_k=3),
}
N_MIXED = 1500


class Boom(RuntimeError):
    pass


def test_a_call_its_caller_cancelled_is_skipped_and_the_thread_serves_on(loaded, refs):
    """A cancelled call's Future refuses a result: setting one anyway killed the thread, and every
    request then waited forever."""
    with Scheduler(loaded.engine, max_batch_size=2) as s:
        gate = threading.Event()
        s.call_soon(gate.wait, 30)  # holds the thread, so the next call is still queued when cancelled
        late = s.call_soon(lambda: 1)
        assert late.cancel()
        gate.set()
        t = s.submit(requests(6)[0])
        assert tokens(t.result(timeout=30)) == refs[0][:6]
        assert s._thread.is_alive()


def test_a_metrics_sink_that_raises_never_strands_a_request(loaded, refs):
    class Broken:
        def observe_batch(self, size):
            raise Boom("batch")

        def observe_queue_wait(self, seconds):
            raise Boom("queue")

        def observe_failure(self, cause):
            raise Boom("failure")

    with Scheduler(loaded.engine, max_batch_size=2, metrics=Broken()) as s:
        tickets = [s.submit(r) for r in requests(4)[:3]]
        assert [tokens(t.result(timeout=30)) for t in tickets] == [r[:4] for r in refs[:3]]
        bad = s.submit(GenerationRequest(PROMPTS[0], 4, eos_token_id=None), on_round=lambda ev: 1 / 0)
        with pytest.raises(RequestFailed, match="ZeroDivisionError"):  # a failure, reported to the broken sink
            bad.result(timeout=30)
        assert s.idle(timeout=5) and s._thread.is_alive()


def test_a_request_cancelled_while_queued_ends_before_a_slot_frees(loaded):
    with Scheduler(loaded.engine, max_batch_size=1) as s:
        long = s.submit(GenerationRequest(PROMPTS[0], 400, eos_token_id=None, speculative=False))
        queued = s.submit(GenerationRequest(PROMPTS[1], 4, eos_token_id=None))
        wait_until(lambda: long.events, 30, "the first request's round 0")
        queued.cancel()
        assert queued.done.wait(10) and queued.failure is None and queued.events == []
        assert not long.done.is_set()  # ended while the batch's one slot was still taken
        long.cancel()
        assert long.done.wait(10)


def test_a_request_a_bug_drops_is_ended_by_the_idle_check_and_counted(loaded):
    """The invariant: with nothing queued or running, nothing is tracked. A path that forgets to end its
    request (planted here) cannot leave the client waiting, and `lost` says so."""
    real = Scheduler._drop_cancelled

    def forgetful(self):
        for entry in list(self._prefilling):
            if entry[0].rid == 1:
                self._prefilling.remove(entry)  # dropped, never ended
        real(self)

    with Scheduler(loaded.engine, max_batch_size=2) as s:
        s._drop_cancelled = forgetful.__get__(s)
        a, b = s.submit(requests(4)[0]), s.submit(requests(4)[1])
        assert len(a.result(timeout=30)) > 0
        with pytest.raises(RequestFailed, match="lost"):
            b.result(timeout=30)
        assert s.stats()["lost"] == 1 and not s.idle()
        s.lost = 0  # (for the fixture's check: the loss was planted)


def test_cancels_racing_submits_from_many_threads_each_end_once(loaded, refs):
    """Submits, cancels at random moments and readers that stop early, from six threads at once: every
    request ends exactly once, the uncancelled ones with their solo tokens, and the scheduler is idle."""
    import random

    ends: list[int] = []
    results: dict[int, object] = {}
    with Scheduler(loaded.engine, max_batch_size=3, prefill_chunk=4) as s:

        def client(k: int) -> None:
            rng = random.Random(k)
            for j in range(6):
                i = (k + j) % len(PROMPTS)
                t = s.submit(GenerationRequest(PROMPTS[i], 8, lookup=6, eos_token_id=None),
                             on_end=lambda f, k=k, j=j: ends.append((k, j)))
                how = rng.choice(["read", "cancel_now", "cancel_later", "stop_reading"])
                if how == "cancel_now":
                    t.cancel()
                elif how == "cancel_later":
                    time.sleep(rng.random() * 0.01)
                    t.cancel()
                elif how == "stop_reading":
                    it = iter(t)
                    next(it, None)
                    it.close()
                t.done.wait(30)
                results[(k, j)] = (how, i, t)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert len(results) == 36 and sorted(ends) == sorted(results)  # each ended, once
        for how, i, t in results.values():
            assert t.done.is_set() and t.failure is None
            if how == "read":
                assert tokens(t.events) == refs[i][:8]
        assert s.idle(timeout=5)


@pytest.fixture(scope="module")
def small_model():
    return make_model("llama", vocab=V, seed=3, init=0.2)


def law(model, prefix, p: SamplingParams) -> np.ndarray:
    probs, margin = reference_probs(naive_logits(model, prefix), p.temperature, p.top_k, p.top_p, p.min_p)
    assert margin > 1e-4
    return probs.numpy()


def joint_after_first(model, p: SamplingParams) -> np.ndarray:
    """Exact law of (t2, t3) after CONTEXT + [ROOT], t1 marginalised out. [V, V]"""
    prompt = CONTEXT + [ROOT]
    p1 = law(model, prompt, p)
    out = np.zeros((V, V))
    for a in range(V):
        if p1[a] > 0:
            p2 = law(model, prompt + [a], p)
            for b in range(V):
                if p2[b] > 0:
                    out[b] += p1[a] * p2[b] * law(model, prompt + [a, b], p)
    return out


def mixed_counts(model, n: int, seed0: int) -> dict[str, np.ndarray]:
    """(t2, t3) counts per kind over n requests of each, interleaved in batches of 8."""
    loaded = specdec.load(model, heads="random", device="cpu")
    loaded.engine.set_cost_model(MODERATE)
    counts = {k: np.zeros((V, V)) for k in KINDS}
    with Scheduler(loaded.engine, max_batch_size=8) as s:
        tickets = [(k, s.submit(GenerationRequest(CONTEXT + [ROOT], 4, params=p.replace(seed=seed0 + i),
                                                  tree="auto", eos_token_id=None)))
                   for i in range(n) for k, p in KINDS.items()]
        for k, t in tickets:
            toks = tokens(t)
            counts[k][toks[1], toks[2]] += 1
        assert max(s.stats()["batch_sizes"]) == 8
    return counts


@pytest.fixture(scope="module")
def mixed_laws(small_model):
    return {k: joint_after_first(small_model, p) for k, p in KINDS.items()}


@pytest.mark.slow
def test_each_request_of_a_mixed_batch_follows_its_own_law(small_model, mixed_laws, monkeypatch):
    """Each kind's (t2, t3) law, t1 drawn in round 0: most requests join in waves, so their round 0 is a
    shared forward (`prefill.first_rounds`), and the test covers that path too."""

    import specdec.prefill as prefill_mod
    shared, real = [], prefill_mod._shared_first_rounds
    monkeypatch.setattr(prefill_mod, "_shared_first_rounds", lambda batch, ms: shared.extend(ms) or real(batch, ms))
    counts = mixed_counts(small_model, N_MIXED, seed0=50_000)
    assert len(shared) > N_MIXED  # of 2 * N_MIXED requests (measured: 191 of 200)
    for k in KINDS:
        assert counts[k][mixed_laws[k] == 0].sum() == 0, k
        p = chi2_pvalue(counts[k], mixed_laws[k])
        print(f"\n[batched, kind {k}] chi-square p = {p:.4g}")
        assert p > PASS_P


@pytest.mark.slow
def test_mixed_batch_negative_control_verifies_with_another_requests_params(small_model, mixed_laws, monkeypatch):
    """A planted bug: every request is verified with kind b's params (one request's settings leaking
    into the others' verification). Kind a's law must then fail."""
    real = engine_mod.Engine.verify

    def leak(self, run, draft, hidden, params, *rest):
        return real(self, run, draft, hidden, KINDS["b"].replace(seed=params.seed), *rest)

    monkeypatch.setattr(engine_mod.Engine, "verify", leak)
    counts = mixed_counts(small_model, N_MIXED // 3, seed0=50_000)
    p = chi2_pvalue(counts["a"], mixed_laws["a"])
    print(f"\n[batched] verified-with-another-request's-params control p = {p:.4g}")
    assert p < FAIL_P
