"""specdec.serve: a real uvicorn server on a free loopback port, driven with the official `openai` client
(and httpx for what the client will not send): completions and chat, streamed and not, equal to HF's greedy
decoding; concurrent streams, seeds, stop strings, usage, `speculation`; 400s naming the field; hang-ups;
/metrics, /v1/models, /health, the mounted app; and the command line's checks."""
from __future__ import annotations

import contextlib
import dataclasses
import re
import threading

import httpx
import openai
import pytest
import torch
import uvicorn
from transformers import AutoTokenizer

import specdec
from specdec.metrics import Metrics
from specdec.__main__ import serve_args
from specdec.cli import demo_module
from specdec.__main__ import serve as main
from specdec.serve import build_server
from conftest import wait_until

pytestmark = pytest.mark.usefixtures("schedulers_idle")  # every request a test makes has ended after it
server = pytest.mark.server  # the tests that start a server (deselected by the quick loop, -m "not slow")
PROMPTS = ("def fibonacci(n):", "import json\n\ndef load_config(path):", "class Stack:", "def is_prime(n: int):",
           "# Read a CSV file", "def quicksort(arr):", "class LinkedList:", "héllo wörld, 日本語 ")
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|> {% endif %}")


@contextlib.contextmanager
def serving(app):
    """`app` on uvicorn in a background thread, on a free loopback port; yields its base URL."""
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                        timeout_graceful_shutdown=5))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, what="the server starting")
    try:
        yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def loaded():
    return specdec.load(device="cpu")


@pytest.fixture(scope="module")
def metrics():
    return Metrics()


@pytest.fixture(scope="module")
def url(loaded, metrics):
    with serving(build_server(loaded, metrics=metrics)) as base:
        yield base


@pytest.fixture(scope="module")
def chat_model(loaded, tmp_path_factory):
    """The embedded model (the same scheduler) with a copy of its tokenizer that has a chat template."""
    folder = tmp_path_factory.mktemp("chat-tokenizer")
    loaded.tokenizer.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = TEMPLATE
    return dataclasses.replace(loaded, tokenizer=tok)


@pytest.fixture(scope="module")
def chat_url(chat_model):
    with serving(build_server(chat_model)) as base:
        yield base


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=60)


@torch.inference_mode()
def hf_greedy(loaded, ids: list[int], n: int) -> tuple[list[int], str]:
    """Hugging Face's greedy tokens (to EOS or n) and their text: the reference a greedy response must equal."""
    x = torch.tensor([ids])
    out = loaded.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                pad_token_id=0)
    new = out[0, len(ids):].tolist()
    return new, loaded.tokenizer.decode(new, skip_special_tokens=True)


def counter(base: str, name: str) -> float:
    """A sample's value from /metrics (0 when absent)."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(f"{base}/metrics").text, re.M)
    return float(found[1]) if found else 0.0


def streamed(chunks) -> tuple[str, list]:
    chunks = list(chunks)
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks


@server
def test_greedy_completions_equal_hf_generate_streamed_or_not(url, loaded):
    c = client(url)
    for prompt in PROMPTS[:3]:
        ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        ref_ids, ref = hf_greedy(loaded, ids, 24)
        r = c.completions.create(model="embedded", prompt=prompt, max_tokens=24, temperature=0)
        assert r.choices[0].text == ref and r.object == "text_completion" and r.model == "embedded"
        assert r.choices[0].finish_reason == ("stop" if 0 in ref_ids else "length")
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
            len(ids), len(ref_ids), len(ids) + len(ref_ids))
        spec = r.model_extra["speculation"]
        assert spec["new_tokens"] == len(ref_ids) and 1 <= spec["target_forwards"] <= len(ref_ids)
        assert spec["mean_accepted_length"] == pytest.approx(len(ref_ids) / spec["target_forwards"], rel=0.5)
        text, chunks = streamed(c.completions.create(model="embedded", prompt=prompt, max_tokens=24, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        assert text == ref
        assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == len(ref_ids)
        assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
        # the dynamic tree may draft differently from run to run: the figures differ, the text does not
        assert chunks[-2].model_extra["speculation"] == chunks[-1].model_extra["speculation"]
        assert chunks[-1].model_extra["speculation"]["new_tokens"] == len(ref_ids)
    ids_prompt = loaded.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]  # a prompt of token ids
    r = c.completions.create(model="embedded", prompt=ids_prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == hf_greedy(loaded, ids_prompt, 24)[1]
    default = c.completions.create(model="embedded", prompt=PROMPTS[0], temperature=0)
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens


@server
def test_eight_concurrent_streams_each_equal_their_solo_text(url, loaded):
    c = client(url)
    solo = [c.completions.create(model="embedded", prompt=p, max_tokens=32, temperature=0).choices[0].text
            for p in PROMPTS]
    before = loaded.scheduler.stats()["batch_sizes"]
    out: dict[int, str] = {}
    start = threading.Barrier(len(PROMPTS))

    def one(i: int) -> None:
        start.wait()
        out[i] = streamed(c.completions.create(model="embedded", prompt=PROMPTS[i], max_tokens=32, temperature=0,
                                               stream=True))[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [out.get(i) for i in range(len(PROMPTS))] == solo
    after = loaded.scheduler.stats()["batch_sizes"]
    assert any(after.get(k, 0) > before.get(k, 0) for k in after if k > 1)  # decoded together, not in turn


@server
def test_a_seeded_sampled_request_is_reproducible_at_openais_default_temperature(url, loaded):
    c = client(url)
    texts = {c.completions.create(model="embedded", prompt=PROMPTS[2], max_tokens=24, seed=123).choices[0].text
             for _ in range(2)}
    ref = specdec.generate(loaded, PROMPTS[2], max_new_tokens=24, temperature=1.0, seed=123).text
    assert texts == {ref}
    top = c.completions.create(model="embedded", prompt=PROMPTS[2], max_tokens=24, seed=123,
                               extra_body={"top_k": 5, "min_p": 0.1})  # vLLM's extra fields
    assert top.choices[0].text == specdec.generate(loaded, PROMPTS[2], max_new_tokens=24, temperature=1.0, seed=123,
                                                   top_k=5, min_p=0.1).text


@server
def test_stop_strings_cut_the_text_even_across_two_chunks(url):
    c = client(url)
    full, chunks = streamed(c.completions.create(model="embedded", prompt=PROMPTS[1], max_tokens=48, temperature=0,
                                                 stream=True))
    pieces = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
    ends = [sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces) - 1)]
    # a stop string made of the last 2 characters of one chunk and the first 2 of the next, found there first
    at = next(e for e, nxt in zip(ends, pieces[1:]) if len(nxt) >= 2 and full.find(full[e - 2 : e + 2]) == e - 2)
    stop = full[at - 2 : at + 2]
    for stops in (stop, ["\x00never", stop]):
        r = c.completions.create(model="embedded", prompt=PROMPTS[1], max_tokens=48, temperature=0, stop=stops)
        assert r.choices[0].text == full[: at - 2] and r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens < 48
        text, got = streamed(c.completions.create(model="embedded", prompt=PROMPTS[1], max_tokens=48, temperature=0,
                                                  stop=stops, stream=True))
        assert text == full[: at - 2] and got[-1].choices[0].finish_reason == "stop"


@server
def test_chat_goes_through_the_chat_template(chat_url, chat_model):
    c = client(chat_url)
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fibonacci(n):"}]
    ids = chat_model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]
    ref_ids, ref = hf_greedy(chat_model, list(ids), 20)
    r = c.chat.completions.create(model="embedded", messages=messages, max_completion_tokens=20, temperature=0)
    assert r.choices[0].message.content == ref and r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(ref_ids) and r.model_extra["speculation"]["new_tokens"] == len(ref_ids)
    chunks = list(c.chat.completions.create(model="embedded", messages=messages, max_tokens=20, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ref
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason and "speculation" in chunks[-1].model_extra
    parts = [{"role": "user", "content": [{"type": "text", "text": "def fibo"}, {"type": "text", "text": "nacci(n):"}]}]
    same = c.chat.completions.create(model="embedded", messages=parts, max_tokens=12, temperature=0)
    plain = c.chat.completions.create(model="embedded", messages=[{"role": "user", "content": "def fibonacci(n):"}],
                                      max_tokens=12, temperature=0)
    assert same.choices[0].message.content == plain.choices[0].message.content


# (field, value, the param the 400 names); each on a valid completions request
BAD = [("temperature", -1, "temperature"), ("temperature", "hot", "temperature"), ("top_p", 0, "top_p"),
       ("top_p", 1.5, "top_p"), ("top_k", -2, "top_k"), ("top_k", 2.5, "top_k"), ("min_p", 2, "min_p"),
       ("max_tokens", 0, "max_tokens"), ("max_tokens", 1.5, "max_tokens"), ("max_tokens", True, "max_tokens"),
       ("seed", -1, "seed"), ("seed", 2**64, "seed"), ("stop", ["a"] * 5, "stop"), ("stop", [""], "stop"),
       ("stream", "yes", "stream"), ("prompt", ["a", "b"], "prompt"), ("prompt", [10**6], "prompt"),
       ("prompt", "", "prompt"), ("prompt", "a " * 600, "prompt"), ("prompt", None, "prompt"),
       ("model", 7, "model")]
REFUSED = [("n", 2), ("best_of", 3), ("logprobs", 1), ("top_logprobs", 2), ("echo", True), ("suffix", "x"),
           ("logit_bias", {"5": 1}), ("presence_penalty", 0.5), ("frequency_penalty", 1),
           ("response_format", {"type": "json_object"}), ("tools", [{"type": "function"}]), ("tool_choice", "auto"),
           ("functions", [{"name": "f"}])]


def assert_refused(r: httpx.Response, param: str | None, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"], err
    return err


@server
def test_bad_values_are_400s_naming_the_field_and_the_server_keeps_serving(url, chat_url):
    ok = {"model": "embedded", "prompt": "def f(x):", "max_tokens": 4}
    for field, value, param in BAD:
        err = assert_refused(httpx.post(f"{url}/v1/completions", json={**ok, field: value}), param)
        assert f"`{param}`" in err["message"] or param == "seed", err
    for field, value in REFUSED:
        for endpoint, base in (("completions", ok), ("chat/completions", {"model": "embedded", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "hi"}]})):
            err = assert_refused(httpx.post(f"{chat_url}/v1/{endpoint}", json={**base, field: value}), field)
            assert err["code"] == "unsupported_parameter"
    for body in ({"prompt": "x"}, {"model": "embedded"}):
        assert_refused(httpx.post(f"{url}/v1/completions", json=body), next(iter({"model", "prompt"} - set(body))))
    json_type = {"Content-Type": "application/json"}
    for raw, param in ((b"{not json", None), (b"[1, 2]", None), (b"", None),
                       (b'{"model": "embedded", "prompt": "x", "temperature": NaN}', "temperature"),
                       (b'{"model": "embedded", "prompt": "x", "top_p": Infinity}', "top_p")):
        assert_refused(httpx.post(f"{url}/v1/completions", content=raw, headers=json_type), param)
    chat = {"model": "embedded", "max_tokens": 4}
    for messages in ([], [{"role": "tool", "content": "x"}], [{"role": "user", "content": [{"type": "image_url"}]}],
                     [{"content": "no role"}], "hi"):
        assert_refused(httpx.post(f"{chat_url}/v1/chat/completions", json={**chat, "messages": messages}), "messages")
    assert_refused(httpx.post(f"{chat_url}/v1/chat/completions", json={
        **chat, "max_completion_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}), "max_completion_tokens")
    err = assert_refused(httpx.post(f"{url}/v1/chat/completions", json={  # the embedded model has no chat template
        **chat, "messages": [{"role": "user", "content": "hi"}]}), "messages")
    assert "chat template" in err["message"]
    err = assert_refused(httpx.post(f"{url}/v1/completions", json={**ok, "model": "gpt-4o"}), "model", 404)
    assert err["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="temperature"):  # as the official client reports it
        client(url).completions.create(model="embedded", prompt="x", temperature=-1)
    assert client(url).completions.create(**ok).usage.completion_tokens == 4  # still serving
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


@server
def test_a_client_that_hangs_up_cancels_its_request(url, loaded):
    cancelled = 'specdec_requests_total{outcome="cancelled"}'
    before = counter(url, cancelled)
    body = {"model": "embedded", "prompt": PROMPTS[0], "max_tokens": 480, "seed": 1}  # sampled: many rounds
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    wait_until(lambda: counter(url, cancelled) == before + 1, what="the streamed request counted as cancelled")
    assert loaded.scheduler.idle(timeout=30)
    with pytest.raises(httpx.ReadTimeout):  # a client that gives up on a whole (not streamed) response
        httpx.post(f"{url}/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    wait_until(lambda: counter(url, cancelled) == before + 2, what="the unstreamed request counted as cancelled")
    assert loaded.scheduler.idle(timeout=30)


@server
def test_models_metrics_and_health(url, loaded):
    assert [m.id for m in client(url).models.list()] == ["embedded"]
    client(url).completions.create(model="embedded", prompt=PROMPTS[0], max_tokens=8, temperature=0)
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for name in ('specdec_requests_total{outcome="ok"}', "specdec_rounds_total", "specdec_batch_size_count",
                 "specdec_time_to_first_token_seconds_count"):
        assert counter(url, name) > 0, name
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["model"] == "embedded"


@server
def test_the_app_mounts_at_the_root_beside_the_api(loaded):
    metrics = Metrics()
    demo = demo_module().build_demo(loaded, metrics=metrics)
    with serving(build_server(loaded, metrics=metrics, ui=demo)) as base:
        assert "gradio" in httpx.get(f"{base}/", follow_redirects=True).text.lower()
        r = client(base).completions.create(model="embedded", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        assert r.usage.completion_tokens == 8
        assert counter(base, 'specdec_requests_total{outcome="ok"}') == 1


@pytest.mark.parametrize("argv, flag", [
    (["--port", "70000"], "--port"), (["--max-batch-size", "0"], "--max-batch-size"),
    (["--prefix-cache-mb", "0"], "--prefix-cache-mb"), (["--threads", "x"], "--threads"),
    (["--dtype", "float8"], "--dtype"), (["--engine-process", "maybe"], "--engine-process"),
    (["--device", "cuda:9"], "--device"), (["--model", "./no/such/model"], "--model")])
def test_bad_flags_are_refused_by_name_before_loading(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        serve_args(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's error line, after the usage
    assert e.value.code == 2 and last.startswith("specdec serve: error: ") and flag in last


def test_a_model_that_cannot_load_is_one_line_and_exit_code_2(tmp_path, capsys):
    (tmp_path / "broken").mkdir()  # a folder, but no model in it
    assert main(["--model", str(tmp_path / "broken"), "--engine-process", "off"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
