"""The model served by its own process (`specdec.engine_process`): the same outputs as a model loaded here,
live settings, Stop, cancel, faults that stay with their request, and an engine process that dies.

Each engine process loads the embedded model (a few seconds), so one serves most tests here; the app over
an engine process is tested in test_app_server.py (its server fixture runs both ways).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

import specdec
from specdec import GenerationRequest, SamplingParams, engine_process
from specdec.api import encode
from bench.chaos import chaos
from specdec.supervisor import ENGINE_GONE
from specdec.ticket import RemoteTicket
from specdec.lookup import DEFAULT_LOOKUP
from specdec import RequestFailed
from specdec.supervisor import FIRST_DELAY, HEALTHY, MAX_DELAY, backoff

from conftest import wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.process]

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, x):", "import os\n\ndef list_files(path):",
           "for i in range(10):"]


class Recorder:
    """A SchedulerMetrics that keeps what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def _add(self, name, value) -> None:
        with self.lock:
            self.calls.append((name, value))

    def observe_batch(self, size: int) -> None:
        self._add("batch", size)

    def observe_queue_wait(self, seconds: float) -> None:
        self._add("wait", seconds)

    def observe_failure(self, cause: str) -> None:
        self._add("failure", cause)

    def observe_restart(self) -> None:
        self._add("restart", 1)

    def named(self, name: str) -> list:
        with self.lock:
            return [v for n, v in self.calls if n == name]


@pytest.fixture(scope="module")
def here():
    return specdec.load(device="cpu", max_batch_size=4)


@pytest.fixture(scope="module")
def remote():
    model = engine_process.start(threads=1, device="cpu", max_batch_size=4)
    metrics = Recorder()
    model.serve(metrics=metrics)
    yield model, metrics
    model.close()


def requests(loaded) -> list[GenerationRequest]:
    """Greedy and seeded sampling, static and dynamic trees, with and without prompt lookup."""
    ids = [encode(loaded, p) for p in PROMPTS]
    return [GenerationRequest(ids[0], 40, SamplingParams(), "small", True, "lossless"),
            GenerationRequest(ids[1], 40, SamplingParams(), "auto", True, "lossless", lookup=DEFAULT_LOOKUP),
            GenerationRequest(ids[2], 40, SamplingParams(temperature=0.7, top_p=0.9, seed=11), "auto", True,
                              "lossless", lookup=DEFAULT_LOOKUP),
            GenerationRequest(ids[3], 40, SamplingParams(temperature=1.0, seed=5), "small", True, "lossless"),
            GenerationRequest(ids[0], 24, SamplingParams(temperature=0.8, top_k=20, seed=3), "auto", False)]


def tokens(events) -> list[int]:
    return [t.token_id for ev in events for t in ev.emitted]


def test_outputs_equal_the_model_loaded_here_and_hf(here, remote):
    """Every request, submitted together (so batched there), emits exactly the tokens it emits here: greedy
    and seeded sampling alike (a seeded request's tokens do not depend on the batch: `sampler`'s
    per-position uniforms), and greedy equals HF `generate`."""
    model, metrics = remote
    reqs = requests(here)
    theirs = [model.scheduler.submit(r) for r in reqs]
    ours = [here.scheduler.submit(r).result() for r in reqs]
    got = [t.result(timeout=120) for t in theirs]
    assert [tokens(e) for e in got] == [tokens(e) for e in ours]
    # A static tree verifies the same trees there, so the same rounds. (An "auto" tree is sized by each
    # process's own measured cost model: its rounds may differ, its tokens may not.)
    static = [i for i, r in enumerate(reqs) if r.tree == "small" and not r.lookup]
    assert static and [len(got[i]) for i in static] == [len(ours[i]) for i in static]
    ids = reqs[0].prompt_ids
    import torch
    hf = here.model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=None)
    assert tokens(got[0]) == hf[0, len(ids):].tolist()
    assert max(metrics.named("batch")) > 1  # they shared rounds there
    assert len(metrics.named("wait")) >= len(reqs)


def test_the_comparison_catches_a_lost_event(here, remote, monkeypatch):
    """Negative control: an event dropped on its way back (a planted bug in delivery) fails the comparison above."""
    model, _ = remote
    real, seen = RemoteTicket._arrive, []

    def lossy(self, ev):
        seen.append(ev.index)
        if ev.index == 2:
            return
        real(self, ev)

    monkeypatch.setattr(RemoteTicket, "_arrive", lossy)
    req = requests(here)[0]
    assert tokens(model.scheduler.submit(req).result(timeout=60)) != tokens(here.scheduler.submit(req).result())
    assert 2 in seen


def test_a_request_the_engine_refuses_raises_before_any_token(remote):
    model, _ = remote
    with pytest.raises(ValueError, match=r"`prompt_ids` must be in \[0, "):
        model.scheduler.submit(GenerationRequest([10**6], 8))
    assert model.scheduler.stats()["waiting"] == 0


def test_live_settings_reach_the_engine_and_stop_ends_the_run(here, remote):
    """A params callable is read after each event and a change is sent on: it shows in the events within two
    rounds and stays; each round runs under one whole SamplingParams. should_stop ends the request (no
    failure) at most two rounds after the round that asked."""
    model, _ = remote
    ids = encode(here, PROMPTS[0])
    live = {"params": SamplingParams()}
    seen, stop = [], {"at": None}

    def on_round(ev):
        seen.append(ev)
        if ev.index == 2:
            live["params"] = SamplingParams(temperature=0.9, top_k=5, seed=1)
        if ev.index == 6:
            stop["at"] = ev.index

    ticket = model.scheduler.submit(GenerationRequest(ids, 400, lambda: live["params"], "small", True, "lossless"),
                                    on_round=on_round, should_stop=lambda: stop["at"] is not None)
    events = ticket.result(timeout=60)
    temps = [ev.params["temperature"] for ev in events]
    assert temps[:3] == [0.0, 0.0, 0.0]
    first = temps.index(0.9)
    assert first <= 2 + 2 and all(t == 0.9 for t in temps[first:])
    assert all(ev.params["top_k"] == 5 for ev in events[first:])
    # ends after the round that asked (as in-process, when the message beats that round's end), or the next
    assert 6 <= events[-1].index <= 6 + 2 and sum(len(ev.emitted) for ev in events) < 400
    assert seen == events  # callbacks ran here, once per event, in order


def test_closing_the_stream_frees_its_slot(here, remote):
    model, _ = remote
    ids = encode(here, PROMPTS[1])
    stream = iter(model.scheduler.submit(GenerationRequest(ids, 400, SamplingParams(), speculative=False)))
    for _ in range(3):
        next(stream)
    stream.close()
    t0 = time.monotonic()
    while model.scheduler.stats()["decoding"]:
        assert time.monotonic() - t0 < 10, "the closed request still decodes"
        time.sleep(0.05)
    assert len(model.scheduler.submit(GenerationRequest(ids, 5)).result(timeout=30)) >= 1


def test_a_callback_or_params_error_ends_its_request_alone(here, remote):
    model, metrics = remote
    reqs = requests(here)[:2]
    before = metrics.named("failure").count("callback")

    def boom(ev):
        if ev.index == 2:
            raise RuntimeError("a broken callback")

    bad = model.scheduler.submit(reqs[0], on_round=boom)
    good = model.scheduler.submit(reqs[1])
    with pytest.raises(RequestFailed) as err:
        bad.result(timeout=60)
    assert err.value.failure.cause == "callback" and "a broken callback" in str(err.value)
    assert [ev.index for ev in err.value.events] == [0, 1]  # what it had before the failure stays
    assert tokens(good.result(timeout=60)) == tokens(here.scheduler.submit(reqs[1]).result())
    assert metrics.named("failure").count("callback") == before + 1
    calls = []

    def params():  # read at submit, then after each event; the third read fails
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a broken params source")
        return SamplingParams()

    ids = encode(here, PROMPTS[0])
    with pytest.raises(RequestFailed) as err:
        model.scheduler.submit(GenerationRequest(ids, 40, params, "small")).result(timeout=60)
    assert err.value.failure.cause == "params" and "a broken params source" in str(err.value)
    assert metrics.named("failure").count("params") >= 1


def test_sampler_rows_and_a_lane_run_alone_match_here(here, remote):
    model, _ = remote
    ids = encode(here, PROMPTS[2])
    params = SamplingParams(temperature=0.7, top_p=0.9)
    assert model.engine.sampler_rows(ids, params, 10) == here.engine.sampler_rows(ids, params, 10)
    assert model.engine.info()["model"] == here.engine.info()["model"]
    req = requests(here)[1]
    lane, events = model.engine.stream(req), []
    while True:
        ev, secs = lane.timed_next()
        if ev is None:
            break
        assert secs > 0
        events.append(ev)
    assert tokens(events) == tokens(list(here.engine.stream(req)))
    stopped = model.engine.stream(req, should_stop=lambda: True)
    assert stopped.timed_next() == (None, 0.0)
    with pytest.raises(ValueError, match="`prompt_ids` must be in"):
        model.engine.stream(GenerationRequest([10**6], 8))


def test_injected_faults_stay_with_their_requests_and_a_killed_engine_is_replaced(here):
    """A chaos run there (every fourth request fails in round 3): the others complete with the tokens they
    emit here, and the failures are counted here. Then the engine's process is killed mid-request: that
    request fails with a message that names the signal, a request sent meanwhile waits for the new process
    and completes, and the new process runs its scheduler with the same fault hook and metrics sink. A second
    kill soon after waits longer before its restart, and close() during that restart ends everything."""
    model = engine_process.start(threads=1, device="cpu", max_batch_size=4)
    try:
        metrics = Recorder()
        model.serve(metrics=metrics, fault_hook=chaos(0.25))
        reqs = (requests(here) * 2)[:8]
        tickets = [model.scheduler.submit(r) for r in reqs]
        failed = []
        for i, (t, r) in enumerate(zip(tickets, reqs)):
            try:
                got = t.result(timeout=120)
            except RequestFailed as e:
                failed.append(i)
                assert e.failure.index == 3 and len(e.events) == 3
                continue
            assert tokens(got) == tokens(here.scheduler.submit(r).result()), i
        assert failed == [3, 7]
        assert sorted(metrics.named("failure")) == ["error", "out_of_memory"]
        ids = encode(here, PROMPTS[0])
        stream = iter(model.scheduler.submit(GenerationRequest(ids, 400, SamplingParams(), speculative=False)))
        next(stream)
        first = model.pid
        killed = time.monotonic()
        os.kill(first, signal.SIGKILL)
        with pytest.raises(RequestFailed, match=rf"{ENGINE_GONE} \(signal 9\); it is being restarted"):
            for _ in stream:
                pass
        # Sent while the new process loads: they wait for it. The fourth fails in round 3 as chaos(0.25)
        # says, so the fault hook went to the new process too, and its failure is counted here.
        after = [model.scheduler.submit(r) for r in reqs[:4]]
        assert tokens(after[0].result(timeout=60)) == tokens(here.scheduler.submit(reqs[0]).result())
        recovered = time.monotonic() - killed  # a liveness bound (a new process loads in seconds), not a timing
        assert recovered < 60, f"the first request after the kill took {recovered:.1f} s"
        with pytest.raises(RequestFailed, match="out of memory"):
            after[3].result(timeout=60)
        assert model.pid not in (None, first) and metrics.named("restart") == [1]
        assert sorted(metrics.named("failure")) == ["error", "out_of_memory", "out_of_memory"]
        assert model.engine.info()["model"] == here.engine.info()["model"]
        supervisor = model._supervisor
        assert supervisor.delays == [FIRST_DELAY]
        os.kill(model.pid, signal.SIGKILL)  # dies again at once: the next restart waits longer
        wait_until(lambda: len(supervisor.delays) == 2, 10, "the second restart's schedule")
        assert supervisor.delays[1] == 2 * FIRST_DELAY
        loading = wait_until(lambda: supervisor._launching, 10, "the second restart's process")
    finally:
        t0 = time.monotonic()
        model.close()
    assert time.monotonic() - t0 < 10  # the process still loading was killed, not awaited
    loading.join(5)
    assert not loading.is_alive() and loading not in multiprocessing.active_children()
    assert metrics.named("restart") == [1] and model.pid is None
    with pytest.raises(RuntimeError, match="the engine is closed"):
        model.scheduler.submit(GenerationRequest(ids, 4))
    print(f"\nfirst request after SIGKILL: {recovered:.1f} s")


def test_backoff_doubles_while_a_process_dies_soon_and_resets_after_it_served():
    assert backoff(None, 0.0) == FIRST_DELAY
    delays = [FIRST_DELAY]
    for _ in range(8):
        delays.append(backoff(delays[-1], 1.0))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0] and MAX_DELAY == 30.0
    assert backoff(30.0, HEALTHY) == FIRST_DELAY and backoff(30.0, HEALTHY - 1) == MAX_DELAY


def test_a_model_the_engine_refuses_raises_here(tmp_path):
    with pytest.raises(ValueError, match="heads"):
        engine_process.start(threads=1, device="cpu", heads=str(tmp_path / "no-such-heads"))
    for bad in (0, -2, "many", 1.5, True):  # refused here, before a process starts
        with pytest.raises(ValueError, match=r"`threads` must be 'auto' or an integer >= 1"):
            engine_process.start(threads=bad, device="cpu")
