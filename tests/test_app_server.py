"""A real app server on a free port, on the embedded default model, driven with gradio_client."""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import types
import threading
import time

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import specdec
from specdec import engine_process
from specdec.metrics import Metrics
from conftest import APP_GREEDY, free_port, wait_until
import app
from app import build_demo, launch_kwargs

pytestmark = pytest.mark.server  # deselected by the quick loop (-m "not slow"); CI runs it

GREEDY = APP_GREEDY
SEEN: list[specdec.RoundEvent] = []  # every round of every Generate run, via the on_round hook
SERVED: dict = {}  # the model the running app serves (here, or its engine process's face)


@pytest.fixture(scope="module", params=["in the server's process", "in its own process"])
def server(request):
    """The app over the model loaded here, and over the same model served by an engine process
    (`specdec.engine_process`, what `python app.py` does on a CPU). Yields the URL and a model loaded
    here, for the library's reference outputs."""
    loaded = specdec.load(device="cpu")
    served = loaded if request.param == "in the server's process" else engine_process.start(threads=1, device="cpu")
    SERVED["model"] = served
    metrics = Metrics()
    demo = build_demo(served, max_prompt_tokens=64, figure_interval=0.2, text_interval=0.0, on_round=[SEEN.append],
                      metrics=metrics)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                            quiet=True, **launch_kwargs(metrics))
    yield url, loaded
    demo.close()
    if served is not loaded:
        served.close()


def client(url: str) -> Client:
    return Client(url, verbose=False, download_files=False)


def round_json(outputs) -> dict:
    return outputs[-1]  # the last output of /generate is the per-round JSON record


def wait_for(job, pred, timeout: float = 60.0):
    """Poll a streaming job's outputs until `pred(latest)` holds; return the latest output."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        outs = job.outputs()
        if outs and round_json(outs[-1]) and pred(round_json(outs[-1])):
            return outs[-1]
        if job.done():
            break
        time.sleep(0.05)
    raise AssertionError(f"condition not reached; last outputs: {job.outputs()[-1:]}")


@pytest.mark.timeout(90)
def test_streams_round_by_round_and_matches_the_library(server):
    url, loaded = server
    prompt = "def fibonacci(n):"
    updates = list(client(url).submit(prompt=prompt, max_new_tokens=16, **GREEDY, api_name="/generate"))
    rounds = [round_json(u)["round"] for u in updates]
    assert rounds[0] == 0 and len(set(rounds)) >= 3 and rounds == sorted(rounds)
    texts = [round_json(u)["text"] for u in updates]
    assert all(a == b[: len(a)] for a, b in zip(texts, texts[1:]))  # grows round by round
    final = updates[-1]
    ref = specdec.generate(loaded, prompt, max_new_tokens=16, tree="small")
    assert round_json(final)["text"] == ref.text and round_json(final)["finished"] == "length"
    assert final[0].count('class="sd-tok') == 16  # coloured token spans
    assert json.loads(final[2]["plot"])["data"]  # the tree plot was sent
    assert "mean accepted length" in final[1]
    # The prompt lookup controls come last in /generate (older clients that omit them get the defaults):
    # here the lookup chain alone drafts (tree "none"), merged mode, 12 tokens a round.
    lookup = dict(GREEDY, tree="none", lookup=12, lookup_mode="merge")
    updates = list(client(url).submit(prompt=prompt, max_new_tokens=24, **lookup, api_name="/generate"))
    ref = specdec.generate(loaded, prompt, max_new_tokens=24, tree="none", lookup=12, lookup_mode="merge")
    assert round_json(updates[-1])["text"] == ref.text
    assert any(round_json(u)["accepted_lookup"] > 0 for u in updates)
    assert "by prompt lookup" in updates[-1][1]
    plot = json.loads(updates[-1][2]["plot"])
    assert any(t.get("name") == "prompt lookup" for t in plot["data"])


@pytest.mark.timeout(90)
def test_bad_inputs_error_and_the_app_keeps_serving(server):
    url, _ = server
    c = client(url)
    cases = [
        (dict(prompt=""), "empty"),
        (dict(prompt="   \n"), "empty"),
        (dict(prompt="x " * 300), "limit"),
        (dict(prompt="ok", temperature=5.0), "`temperature` must be in [0.0, 2.0], got 5"),
        (dict(prompt="ok", top_k=-3), "`top_k` must be an integer >= 0"),
        (dict(prompt="ok", top_p=0.0), "`top_p` must be in (0, 1]"),
        (dict(prompt="ok", max_new_tokens=100_000), "`max_new_tokens` must be in [1, 512]"),
        (dict(prompt="ok", seed=-7), "`seed` must be in [-1,"),
        (dict(prompt="ok", tree="enormous"), ""),
        (dict(prompt="ok", acceptance="yolo"), ""),
        (dict(prompt="ok", lookup=65), "`lookup` must be an integer in [0, 64]"),
        (dict(prompt="ok", lookup=2.5), "`lookup` must be an integer"),
        (dict(prompt="ok", lookup_mode="both"), "`lookup_mode` must be one of"),
        (dict(prompt="ok", chat=True), "chat template"),
        (dict(prompt="ok", tree="none", lookup=0), "set prompt lookup tokens >= 1"),
    ]
    for kwargs, words in cases:
        with pytest.raises(AppError) as err:
            c.predict(**{**GREEDY, "max_new_tokens": 4, **kwargs}, api_name="/generate")
        assert words.lower() in str(err.value).lower(), (kwargs, str(err.value))
    with pytest.raises(AppError, match=r"`temperature` must be a finite number >= 0 \(0 = greedy\), got -1"):
        c.predict(prompt="ok", temperature=-1.0, top_k=0, top_p=1.0, min_p=0.0, acceptance="lossless",
                  api_name="/set_sampling")
    out = c.predict(prompt="class Stack:", max_new_tokens=4, **GREEDY, api_name="/generate")
    assert round_json(out)["new_tokens"] == 4


@pytest.mark.timeout(120)
def test_four_concurrent_clients_finish_without_leaking_state(server):
    url, loaded = server
    prompts = ["def fibonacci(n):", "class Stack:", "import os\n", "def is_prime(n):"]
    results: dict[int, tuple] = {}

    def one(i: int) -> None:
        c = client(url)
        seed = 100 + i
        outs = list(c.submit(prompt=prompts[i], max_new_tokens=10, **{**GREEDY, "temperature": 0.8, "seed": seed},
                             api_name="/generate"))
        results[i] = (seed, outs[-1])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=110)
    assert sorted(results) == [0, 1, 2, 3]
    for i, (seed, out) in results.items():
        rec = round_json(out)
        ref = specdec.generate(loaded, prompts[i], max_new_tokens=10, temperature=0.8, top_p=1.0, seed=seed,
                               tree="small")
        assert rec["run"] == 1, "each client has its own session, whose first run is run 1"
        assert rec["seed"] == seed and rec["params"]["seed"] == seed
        assert rec["text"] == ref.text, f"client {i} got another session's text"
        assert out[0].startswith(f'<span class="sd-prompt" title="prompt">{prompts[i][:5]}')


@pytest.mark.timeout(150)
def test_concurrent_calls_from_one_client_each_run_to_their_end(server):
    """One client's calls share its session: none stops another, and each gets what it would alone
    (greedy ones their solo text, sampled ones their own seed's text)."""
    url, loaded = server
    c = client(url)
    prompts = ["def fibonacci(n):", "class Stack:", "import os\n", "def is_prime(n):", "x = [", "# sort a list"]
    seeds = {4: 11, 5: 12}  # the last two sample, at their own seeds
    jobs = [c.submit(prompt=p, max_new_tokens=24, **{**GREEDY, **({"temperature": 0.8, "seed": seeds[i]}
                                                                   if i in seeds else {})}, api_name="/generate")
            for i, p in enumerate(prompts)]
    finals = [round_json(list(job)[-1]) for job in jobs]
    for i, (p, rec) in enumerate(zip(prompts, finals)):
        kw = dict(temperature=0.8, top_p=1.0, seed=seeds[i]) if i in seeds else {}
        ref = specdec.generate(loaded, p, max_new_tokens=24, tree="small", **kw)
        assert rec["finished"] != "stopped" and rec["text"] == ref.text, (i, rec["finished"], rec["new_tokens"])


@pytest.mark.timeout(90)
def test_stop_halts_within_a_round_and_live_tuning_applies(server):
    url, _ = server
    c = client(url)
    for attempt in range(3):  # a run that ends before the change lands (a busy machine) tested nothing: again
        job = c.submit(prompt="def quicksort(arr):", max_new_tokens=400, **GREEDY, api_name="/generate")
        wait_for(job, lambda r: r["round"] >= 1)
        c.predict(prompt="def quicksort(arr):", temperature=1.3, top_k=5, top_p=1.0, min_p=0.0,
                  acceptance="lossless", api_name="/set_sampling")
        try:
            last = wait_for(job, lambda r: r["params"]["temperature"] == 1.3)
            break
        except AssertionError:
            assert job.done() and attempt < 2, "the live change never reached a running generation"
            c.predict(prompt="def quicksort(arr):", temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
                      acceptance="lossless", api_name="/set_sampling")
    assert round_json(last)["params"]["top_k"] == 5
    t0 = time.monotonic()
    c.predict(api_name="/stop")
    while not job.done():
        time.sleep(0.05)
        assert time.monotonic() - t0 < 20, "Stop did not halt the run"
    final = round_json(job.outputs()[-1])
    assert final["finished"] == "stopped" and final["new_tokens"] < 400
    assert "settings changed" in job.outputs()[-1][1]
    tree, info, event, slider, style = c.predict(1, api_name="/round")  # step back to round 1
    assert event["index"] == 1 and "Round 1" in info and 'data-round="1"' in style
    cleared = c.predict(api_name="/clear")
    assert cleared[0] == "" and cleared[1] == ""
    assert c.predict(1, api_name="/round")[2] is None  # nothing left in the session


@pytest.mark.timeout(90)
def test_compare_reports_speedup_and_identity_for_greedy(server):
    url, _ = server
    race = {k: v for k, v in GREEDY.items() if k != "speculative"}  # /compare always races both
    md, spec_html, base_html = client(url).predict(prompt="def f(x):", max_new_tokens=8, **race,
                                                   api_name="/compare")
    assert "Median ratio" in md and "identical" in md and "warm-up" in md and "Why speculation" in md
    assert spec_html.count("sd-tok") == 8 and base_html.count("sd-baseline") == 8


@pytest.mark.timeout(90)
def test_a_disconnected_client_frees_the_model(server):
    """Open the SSE stream by hand, read a few rounds, drop the connection: the run must stop."""
    url, _ = server
    fn = next(d["id"] for d in client(url).config["dependencies"] if d.get("api_name") == "generate")
    session_hash = "disconnect-test"
    seed = 4242  # marks this run's events in SEEN
    data = ["def fibonacci(n):", 0.0, 0, 1.0, 0.0, 500, seed, "small", "lossless", True, 10, "first", False, None]
    api = url.rstrip("/") + "/gradio_api"
    httpx.post(f"{api}/queue/join", json={"data": data, "fn_index": fn, "session_hash": session_hash,
                                          "event_data": None, "trigger_id": None}).raise_for_status()
    mine = lambda: [ev for ev in SEEN if ev.params.get("seed") == seed]  # noqa: E731
    with httpx.stream("GET", f"{api}/queue/data", params={"session_hash": session_hash}, timeout=60) as r:
        for line in r.iter_lines():
            if '"process_generating"' in line and len(mine()) >= 2:
                break
    # The disconnect must end the request early: nothing tracked or running within the deadline, and its
    # last round no finished one (a run nobody stopped ends with "length" after 500 tokens).
    sched = SERVED["model"].scheduler
    wait_until(lambda: (lambda st: not (st["tracked"] or st["waiting"] or st["prefilling"] or st["decoding"]))(
        sched.stats()), 30, "the disconnected request's end")
    events = mine()
    assert events and events[-1].finished is None and events[-1].total_tokens < 500, events[-1:]
    # and the model queue serves the next client
    out = client(url).predict(prompt="class Stack:", max_new_tokens=3, **GREEDY, api_name="/generate")
    assert round_json(out)["new_tokens"] == 3


def test_app_wiring_queue_spaces_and_arguments(server, monkeypatch):
    _, loaded = server
    demo = build_demo(loaded, queue_size=3)
    assert demo._queue.max_size == 3
    model_events = {f.api_name for f in demo.fns.values() if f.concurrency_id == "model"}
    assert model_events == {"generate", "generate_paced", "compare"}  # generate_paced: the page's Generate (private)
    # as many runs at once as the scheduler decodes together (the rest wait in Gradio's queue)
    assert all(f.concurrency_limit == loaded.max_batch_size for f in demo.fns.values() if f.concurrency_id == "model")
    # Views never wait in the model queue; queued on their own so that errors come back as toasts.
    views = [f for f in demo.fns.values() if f.api_name in ("set_sampling", "round")]
    assert len(views) == 2 and all(f.queue and f.concurrency_id == "views" for f in views)
    assert not next(f for f in demo.fns.values() if f.api_name == "stop").queue
    # spaces.GPU is applied when the package exists, and a no-op otherwise
    assert app.gpu(len) is len
    fake = types.ModuleType("spaces")
    fake.GPU = lambda duration=60: (lambda fn: ("gpu", duration, fn))
    monkeypatch.setitem(sys.modules, "spaces", fake)
    assert app.gpu(len) == ("gpu", 120, len)
    # arguments and environment variables
    monkeypatch.setenv("SPECDEC_MODEL", "some/model")
    monkeypatch.setenv("SPECDEC_HEADS", "random")
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    args = app.parse_args([])
    assert (args.model, args.heads, args.port) == ("some/model", "random", 7860)
    assert app.parse_args(["--model", "x", "--port", "9000", "--host", "0.0.0.0"]).port == 9000
    assert (args.max_batch_size, args.chaos) == (specdec.scheduler.DEFAULT_MAX_BATCH_SIZE, 0.0)
    assert app.parse_args(["--max-batch-size", "1", "--chaos", "0.25"]).max_batch_size == 1
    for bad in (["--max-batch-size", "0"], ["--chaos", "2"]):
        with pytest.raises(SystemExit):
            app.parse_args(bad)


def test_api_inputs_have_types_and_describe_themselves(server):
    url, _ = server
    api = client(url).view_api(print_info=False, return_format="dict")["named_endpoints"]
    params = {e: {p["parameter_name"]: p for p in api[e]["parameters"]} for e in ("/generate", "/compare")}
    for name in ("top_k", "max_new_tokens", "lookup"):
        assert params["/generate"][name]["type"]["type"] == "integer", name
    assert params["/generate"]["chat"]["type"]["type"] == "boolean"
    assert "speculative" in params["/generate"] and "speculative" not in params["/compare"]
    for endpoint in ("/generate", "/compare", "/stop", "/set_sampling", "/round", "/clear"):
        text = api[endpoint]["description"]
        assert text and "injected" not in text and "`request`" not in text, endpoint
    assert "temperature 0-2" in api["/generate"]["description"]


@pytest.mark.timeout(90)
def test_round_view_during_a_run_never_errors_and_reaches_every_round_after_stop(server):
    url, _ = server
    c = client(url)
    plain = {**GREEDY, "speculative": False}  # one token a round: the run outlasts the checks below
    job = c.submit(prompt="def quicksort(arr):", max_new_tokens=500, **plain, api_name="/generate")
    wait_for(job, lambda r: r["round"] >= 2)
    for typed in (5, 10_000, 2.0):  # past the slider's current maximum while streaming: clamped, not a 500
        _, info, event, _, _ = c.predict(typed, api_name="/round")
        assert event["index"] <= typed and info.startswith("**Round")
    with pytest.raises(AppError, match="`round` must be an integer"):
        c.predict("five", api_name="/round")
    c.predict(api_name="/stop")
    outs = list(job)
    final = outs[-1]
    rounds = round_json(final)["round"]
    assert round_json(final)["finished"] == "stopped"
    assert final[3]["maximum"] == rounds  # the slider reaches the last round that ran
    assert c.predict(rounds, api_name="/round")[2]["index"] == rounds
    assert "stopped by you" in final[1]


def call_generate(url: str, body: str) -> tuple[str, object]:
    """POST raw JSON text to /gradio_api/call/generate and read its SSE stream: (last event, its data)."""
    api = url.rstrip("/") + "/gradio_api/call/generate"
    r = httpx.post(api, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code < 500, (body[:80], r.status_code, r.text[:200])
    if r.status_code != 200:  # refused by Gradio's own checks of the body's shape, with a message
        return f"http {r.status_code}", r.json()
    kind, data = None, None
    with httpx.stream("GET", f"{api}/{r.json()['event_id']}", timeout=60) as events:
        assert events.status_code < 500
        for line in events.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = json.loads(line.split(":", 1)[1])
    return kind, data


GOOD = ["def f(x):", 0.0, 0, 1.0, 0.0, 4, 0, "small", "lossless", True, 10, "first", False]  # /generate's inputs


def with_value(i: int, value) -> str:
    """GOOD with input `i` replaced, as JSON text (NaN and infinities as Python's json writes them)."""
    return json.dumps({"data": [value if j == i else v for j, v in enumerate(GOOD)]})


@pytest.mark.timeout(120)
def test_malformed_calls_get_a_clear_error_and_the_next_call_is_served(server):
    """Raw HTTP calls with wrong types, NaN and infinities, a megabyte prompt, control characters, a lone
    surrogate and missing fields: each ends in an error event naming the problem (or a 4xx from Gradio's
    check of the body's shape), never a 5xx, and a normal call after them completes."""
    url, _ = server
    cases = [
        (with_value(0, 5), "`prompt` must be text, got int"),
        (with_value(0, ["a"]), "`prompt` must be text, got list"),
        (with_value(0, "a" * 1_000_000), "the limit is 64"),
        (with_value(0, "a\x00b"), "control character (U+0000) at character 1"),
        (with_value(0, "x \x1b[31m"), "control character (U+001B)"),
        (json.dumps({"data": GOOD}).replace('"def f(x):"', '"\\ud800 x"'), "lone surrogate (U+D800) at character 0"),
        (with_value(1, "hot"), "`temperature` must be a number, got 'hot'"),
        (with_value(1, math.nan), "`temperature` must be finite, got nan"),
        (with_value(1, math.inf), "`temperature` must be finite, got inf"),
        (with_value(3, -math.inf), "`top_p` must be finite, got -inf"),
        (with_value(4, math.nan), "`min_p` must be finite"),
        (with_value(2, 2.5), "`top_k` must be an integer, got 2.5"),
        (with_value(2, True), "`top_k` must be a number, got True"),
        (with_value(5, None), "`max_new_tokens` must be a number, got None"),
        (with_value(5, "4"), "`max_new_tokens` must be a number"),
        (with_value(6, math.inf), "`seed` must be finite"),
        (with_value(7, 3), "`tree` must be one of"),
        (with_value(9, "yes"), "`speculative` must be True or False"),
        (with_value(10, math.nan), "`lookup` must be finite"),
        (with_value(12, None), "`chat` must be True or False"),
        (json.dumps({"data": GOOD[:2]}), None),  # too few values: Gradio refuses them before the handler
        (json.dumps({}), "missing"),
        (json.dumps({"data": "x"}), "list"),
        ("not json", "json"),
    ]
    for body, words in cases:
        kind, data = call_generate(url, body)
        assert kind == "error" or kind.startswith("http 4"), (body[:60], kind, data)
        if words is not None:
            assert words.lower() in json.dumps(data).lower(), (body[:60], data)
    kind, data = call_generate(url, json.dumps({"data": GOOD}))
    assert kind == "complete" and data[-1]["new_tokens"] == 4


@pytest.mark.timeout(120)
def test_a_killed_engine_process_is_replaced_and_counted(server):
    """SIGKILL the engine's process: the next /generate succeeds (it waits for the new process) with no restart
    of the app, and /metrics counts the restart."""
    url, loaded = server
    model = SERVED["model"]
    if model is loaded:
        pytest.skip("the model runs in the server's process")
    killed = time.monotonic()
    os.kill(model.pid, signal.SIGKILL)
    out = client(url).predict(prompt="class Stack:", max_new_tokens=4, **GREEDY, api_name="/generate")
    assert round_json(out)["text"] == specdec.generate(loaded, "class Stack:", max_new_tokens=4, tree="small").text
    assert time.monotonic() - killed < 30
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).text
    assert "specdec_engine_restarts_total 1.0" in text
