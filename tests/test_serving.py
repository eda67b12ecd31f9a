"""Serving: /metrics on a launched app, request outcomes, and a short load test (embedded model)."""
from __future__ import annotations

import time

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from prometheus_client.parser import text_string_to_metric_families

import app
import loadtest
import specdec
from conftest import APP_GREEDY, free_port, wait_until
from app import build_demo, launch_kwargs
from specdec.metrics import RequestMetrics
from specdec.metrics import Metrics
from specdec.prefix_cache import PrefixCache

GREEDY = APP_GREEDY
PROMPT = "import os\n\ndef list_files(path):\n    "  # >= 8 tokens: long enough to enter the prefix cache


@pytest.fixture(scope="module")
def server():
    loaded = specdec.load(device="cpu", prefix_cache=PrefixCache(max_bytes=16 * 2**20))
    metrics = Metrics()
    demo = build_demo(loaded, max_prompt_tokens=64, figure_interval=60.0, text_interval=0.0, metrics=metrics)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                            quiet=True, **launch_kwargs(metrics))
    yield url
    demo.close()


def scrape(url: str) -> dict:
    """GET /metrics -> {(sample name, sorted label items): value}."""
    r = httpx.get(url.rstrip("/") + "/metrics", timeout=10)
    r.raise_for_status()
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def val(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: dict, before: dict, name: str, **labels) -> float:
    return val(after, name, **labels) - val(before, name, **labels)


def wait_metric(url: str, pred, timeout: float = 20.0) -> dict:
    t0 = time.monotonic()
    while True:
        m = scrape(url)
        if pred(m) or time.monotonic() - t0 > timeout:
            return m
        time.sleep(0.1)


@pytest.mark.server
def test_metrics_move_as_expected_after_one_generation(server):
    url = server
    before = scrape(url)
    updates = list(Client(url, verbose=False).submit(prompt=PROMPT, max_new_tokens=12, **GREEDY,
                                                     api_name="/generate"))
    final = updates[-1][-1]
    assert final["new_tokens"] == 12 and final["finished"] == "length"
    m = wait_metric(url, lambda m: delta(m, before, "specdec_requests_total", outcome="ok") >= 1)
    d = lambda name, **kw: delta(m, before, name, **kw)  # noqa: E731
    assert d("specdec_requests_total", outcome="ok") == 1
    assert d("specdec_requests_total", outcome="error") == d("specdec_requests_total", outcome="cancelled") == 0
    assert d("specdec_rounds_total") == final["round"] > 0  # one per decoding round after the prefill
    emitted = sum(d("specdec_emitted_tokens_total", kind=k) for k in ("accepted", "correction", "bonus"))
    assert emitted == final["new_tokens"] - 1  # the prefill's token is not a decoding round's
    accepted = d("specdec_accepted_tokens_total")
    assert accepted == d("specdec_emitted_tokens_total", kind="accepted")
    assert accepted == sum(d("specdec_accepted_tokens_per_depth_total", depth=str(k)) for k in range(1, 6))
    assert d("specdec_draft_tokens_total") >= accepted
    for hist in ("accepted_length", "round_seconds"):
        assert d(f"specdec_{hist}_count") == d("specdec_rounds_total")
    for hist in ("time_to_first_token_seconds", "time_per_output_token_seconds", "request_seconds",
                 "queue_wait_seconds"):
        assert d(f"specdec_{hist}_count") == 1, hist
    assert val(m, "specdec_requests_in_flight") == 0
    assert val(m, "specdec_prefix_cache_bytes") > 0

    # The same prompt again: a prefix-cache hit, visible in the hit-ratio gauge.
    ratio = val(m, "specdec_prefix_cache_hit_ratio")
    Client(url, verbose=False).predict(prompt=PROMPT, max_new_tokens=2, **GREEDY, api_name="/generate")
    after = val(scrape(url), "specdec_prefix_cache_hit_ratio")
    assert after > ratio or after == 1.0  # one more hit


@pytest.mark.server
def test_errors_and_cancellations_are_counted(server):
    url = server
    before = scrape(url)
    c = Client(url, verbose=False)
    with pytest.raises(AppError):
        c.predict(prompt="", max_new_tokens=4, **GREEDY, api_name="/generate")
    # A client that drops its stream (gradio_client's cancel: Gradio closes the generator).
    job = c.submit(prompt=PROMPT, max_new_tokens=400, **GREEDY, api_name="/generate")
    wait_until(lambda: job.outputs() and job.outputs()[-1][-1]["round"] >= 1, 60, "the run's round 1", 0.05)
    assert val(scrape(url), "specdec_requests_in_flight") == 1
    job.cancel()
    m = wait_metric(url, lambda m: delta(m, before, "specdec_requests_total", outcome="cancelled") >= 1)
    assert delta(m, before, "specdec_requests_total", outcome="cancelled") == 1
    # Stop, seen by the engine between rounds.
    job = c.submit(prompt="class Stack:", max_new_tokens=400, **GREEDY, api_name="/generate")
    wait_until(lambda: job.outputs() and job.outputs()[-1][-1]["round"] >= 1, 60, "the run's round 1", 0.05)
    c.predict(api_name="/stop")
    m = wait_metric(url, lambda m: delta(m, before, "specdec_requests_total", outcome="cancelled") >= 2
                    and val(m, "specdec_requests_in_flight") == 0)
    assert delta(m, before, "specdec_requests_total", outcome="cancelled") == 2
    assert delta(m, before, "specdec_requests_total", outcome="error") == 1
    assert delta(m, before, "specdec_requests_total", outcome="ok") == 0
    assert delta(m, before, "specdec_time_to_first_token_seconds_count") == 2  # cancelled after their first token
    assert delta(m, before, "specdec_request_seconds_count") == 0  # latencies: completed requests only
    assert val(m, "specdec_requests_in_flight") == 0


@pytest.mark.server
def test_a_dropped_connection_counts_as_cancelled(server):
    """Open the SSE stream by hand, read two updates, close the socket: like a closed browser tab."""
    url = server
    before = scrape(url)
    fn = next(d["id"] for d in Client(url, verbose=False).config["dependencies"] if d.get("api_name") == "generate")
    api = url.rstrip("/") + "/gradio_api"
    data = [PROMPT, 0.0, 0, 1.0, 0.0, 400, 0, "small", "lossless", True, 0, "first", False, None]  # ..., chat, state
    httpx.post(f"{api}/queue/join", json={"data": data, "fn_index": fn, "session_hash": "drop-test",
                                          "event_data": None, "trigger_id": None}).raise_for_status()
    with httpx.stream("GET", f"{api}/queue/data", params={"session_hash": "drop-test"}, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += '"process_generating"' in line
            if seen >= 2:
                break
    m = wait_metric(url, lambda m: delta(m, before, "specdec_requests_total", outcome="cancelled") >= 1
                    and val(m, "specdec_requests_in_flight") == 0)
    assert delta(m, before, "specdec_requests_total", outcome="cancelled") == 1
    assert delta(m, before, "specdec_requests_total", outcome="ok") == 0
    emitted = sum(delta(m, before, "specdec_emitted_tokens_total", kind=k) for k in ("accepted", "correction", "bonus"))
    assert 0 < emitted < 399  # the run stopped early


@pytest.mark.server
def test_short_load_test_has_no_failures(server):
    url = server
    before = scrape(url)
    args = loadtest.parse_args(["--url", url, "--clients", "2", "--requests", "2", "--max-new-tokens", "8",
                                "--duration", "60"])
    rep = loadtest.run(args)
    assert rep["failed"] == 0, rep["errors"]
    assert rep["completed"] == 4 and rep["tokens_per_second"] > 0
    assert rep["ttft_s"]["p50"] is not None and rep["e2e_s"]["p99"] >= rep["e2e_s"]["p50"]
    assert "| completed |" in loadtest.markdown(rep)
    m = scrape(url)
    assert delta(m, before, "specdec_requests_total", outcome="ok") == 4


@pytest.mark.server
def test_concurrent_clients_are_batched_and_a_chaos_run_fails_only_its_victims():
    """Half the requests fail mid-stream (the chaos hook); every other one completes with the text of
    its solo run, and /metrics counts the failures by cause and the rounds by batch size."""
    from bench.chaos import chaos

    loaded = specdec.load(device="cpu", max_batch_size=4)
    metrics = Metrics()
    demo = build_demo(loaded, max_prompt_tokens=64, figure_interval=60.0, text_interval=0.0, metrics=metrics,
                      fault_hook=chaos(0.5, at_round=2))
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                            quiet=True, **launch_kwargs(metrics))
    try:
        args = loadtest.parse_args(["--url", url, "--clients", "4", "--requests", "2", "--max-new-tokens", "24",
                                    "--duration", "60"])
        rep = loadtest.run(args)
        m = scrape(url)
    finally:
        demo.close()
    assert rep["completed"] + rep["failed"] == 8 and rep["failed"] == 4, rep["errors"]
    assert all("chaos hook" in e for e in rep["errors"])
    alone = specdec.load(device="cpu", max_batch_size=1)  # no chaos there
    solo = {p: specdec.generate(alone, p, max_new_tokens=24).text
            for p in {r["prompt"] for r in rep["results"]}}
    done = [r for r in rep["results"] if r["outcome"] == "ok"]
    assert [r["text"] for r in done] == [solo[r["prompt"]] for r in done]
    assert val(m, "specdec_request_failures_total", cause="out_of_memory") == 2
    assert val(m, "specdec_request_failures_total", cause="error") == 2
    assert val(m, "specdec_batch_size_count") > 0
    assert val(m, "specdec_batch_size_sum") > val(m, "specdec_batch_size_count")  # some rounds had company
    assert val(m, "specdec_scheduler_wait_seconds_count") == 8
    assert val(m, "specdec_requests_total", outcome="error") == 4


def test_request_metrics_outcomes_without_a_server():
    m = Metrics()
    get = lambda name, **kw: m.registry.get_sample_value(name, kw) or 0.0  # noqa: E731
    with RequestMetrics(m, arrival=time.monotonic() - 0.5):
        assert get("specdec_requests_in_flight") == 1
    with pytest.raises(ValueError):
        with RequestMetrics(m):
            raise ValueError("bad input")

    def stream():
        with RequestMetrics(m):
            yield 1
            yield 2

    g = stream()
    next(g)
    g.close()  # what Gradio does on Stop or a disconnect
    with RequestMetrics(m) as req:
        req.cancelled = True
    assert [get("specdec_requests_total", outcome=o) for o in ("ok", "error", "cancelled")] == [1, 1, 2]
    assert get("specdec_queue_wait_seconds_count") == 1 and get("specdec_queue_wait_seconds_sum") >= 0.5
    assert get("specdec_request_seconds_count") == 1 and get("specdec_requests_in_flight") == 0
    with RequestMetrics(None):  # no metrics: a no-op
        pass


def test_prefix_cache_is_on_by_default_and_can_be_switched_off():
    cache = app.prefix_cache(app.parse_args([]))
    assert isinstance(cache, PrefixCache) and cache.max_bytes == 256 * 2**20
    assert app.prefix_cache(app.parse_args(["--prefix-cache-mb", "1.5"])).max_bytes == int(1.5 * 2**20)
    assert app.prefix_cache(app.parse_args(["--no-prefix-cache"])) is None
    # what an engine process gets: the budget, its cache built there
    assert app.prefix_cache_bytes(app.parse_args([])) == 256 * 2**20
    assert app.prefix_cache_bytes(app.parse_args(["--no-prefix-cache"])) is None
    with pytest.raises(SystemExit):
        app.parse_args(["--prefix-cache-mb", "0"])


@pytest.mark.parametrize("flag", ["--max-prompt-tokens", "--queue-size"])
def test_size_flags_reject_non_positive_values(flag, capsys):
    with pytest.raises(SystemExit):
        app.parse_args([flag, "0"])
    assert f"{flag} must be >= 1" in capsys.readouterr().err
