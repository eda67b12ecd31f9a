"""specdec.api: chat prompts through the tokenizer's template, and heads from folders or hub ids."""
from __future__ import annotations

import time

import pytest
from transformers import AutoTokenizer

import specdec
from specdec.api import DEFAULT_MODEL, encode

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def embedded():
    return specdec.load(device="cpu")


@pytest.fixture(scope="module")
def chat_loaded(embedded):
    tok = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))  # a real tokenizer, given a chat template
    tok.chat_template = TEMPLATE
    return specdec.load(embedded.model, heads=embedded.heads, tokenizer=tok, device="cpu")


def test_chat_wraps_the_prompt_in_the_template(chat_loaded):
    assert chat_loaded.has_chat_template
    want = chat_loaded.tokenizer.apply_chat_template([{"role": "user", "content": "def add(a, b):"}],
                                                     add_generation_prompt=True, tokenize=True, return_dict=True)
    ids = encode(chat_loaded, "def add(a, b):", chat=True)
    assert ids == list(want["input_ids"])
    assert chat_loaded.tokenizer.decode(ids).endswith("<|assistant|>\n")
    out = specdec.generate(chat_loaded, "def add(a, b):", chat=True, max_new_tokens=12)
    raw = specdec.generate(chat_loaded, prompt_ids=ids, max_new_tokens=12)
    assert out.token_ids == raw.token_ids and out.rounds[0].prompt_tokens == len(ids)
    plain = specdec.generate(chat_loaded, "def add(a, b):", chat=False, max_new_tokens=12)
    assert plain.rounds[0].prompt_tokens < len(ids)


def test_chat_without_a_template_is_a_clear_error(embedded):
    assert not embedded.has_chat_template
    with pytest.raises(ValueError, match="`chat=True` needs a chat template"):
        specdec.generate(embedded, "hello", chat=True)
    with pytest.raises(ValueError, match="pass `prompt`, not `prompt_ids`"):
        encode(embedded, None, [1, 2, 3], chat=True)
    with pytest.raises(ValueError, match="`chat` must be True or False, got 'yes'"):
        specdec.generate(embedded, "hello", chat="yes")


def test_heads_argument_errors(embedded, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        specdec.load(embedded.model, heads=str(tmp_path / "nope" / "heads"))
    with pytest.raises(ValueError, match="neither a local folder nor a repository on the Hugging Face hub|is not in the local Hugging Face cache"):
        specdec.load(embedded.model, heads="no-such-owner/no-such-heads")  # offline here: a clear error


# -- every generation goes through the scheduler -------------------------------------------------

def test_generate_batch_equals_generate_per_prompt(embedded):
    prompts = ["def fibonacci(n):", "class Stack:", "import os"]
    batch = specdec.generate_batch(embedded, prompts, max_new_tokens=24)
    assert [r.text for r in batch] == [specdec.generate(embedded, p, max_new_tokens=24).text for p in prompts]
    assert all(r.error is None and r.stats["new_tokens"] == 24 for r in batch)
    ids = specdec.generate_batch(embedded, prompt_ids=[[5, 6, 7], [8, 9]], max_new_tokens=4, lookup=0)
    assert [len(r.token_ids) for r in ids] == [4, 4]
    for bad in ([], "one string", None):
        with pytest.raises(ValueError, match="prompts"):
            specdec.generate_batch(embedded, bad)


def test_generate_batch_names_the_prompt_at_fault(embedded):
    with pytest.raises(ValueError, match=r"^`prompts\[2\]`: `prompt` is empty"):
        specdec.generate_batch(embedded, ["a", "b", "  "])
    with pytest.raises(ValueError, match=r"^`prompt_ids\[1\]`: `prompt_ids` must be in \[0, 4095\]"):
        specdec.generate_batch(embedded, prompt_ids=[[5, 6], [5, 99999]], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"^`temperature` must be"):  # a shared setting names itself
        specdec.generate_batch(embedded, ["a", "b"], temperature=-1)
    deadline = time.monotonic() + 30  # the prompts before the bad one were cancelled, not left running
    while (embedded.scheduler.stats()["decoding"] or embedded.scheduler.stats()["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not embedded.scheduler.stats()["decoding"] and not embedded.scheduler.stats()["waiting"]


def test_generate_raises_request_failed_with_the_partial_output(embedded):
    def bad(ev):
        if ev.index == 2:
            raise ValueError("callback broke")

    with pytest.raises(specdec.RequestFailed, match=r"round 2 \(callback, callback\).*callback broke") as e:
        specdec.generate(embedded, "def f(x):", max_new_tokens=40, on_round=bad)
    assert [ev.index for ev in e.value.events] == [0, 1, 2]
    assert specdec.generate(embedded, "def f(x):", max_new_tokens=4).stats["new_tokens"] == 4  # the model is fine


def test_max_batch_size_is_checked_and_reaches_the_scheduler(embedded):
    with pytest.raises(ValueError, match="max_batch_size"):
        specdec.load(embedded.model, heads=None, max_batch_size=0)
    one = specdec.load(embedded.model, heads=embedded.heads, tokenizer=embedded.tokenizer, max_batch_size=1)
    assert one.scheduler.max_batch_size == 1 and one.scheduler is one.scheduler


def test_cost_cache_is_checked_and_keeps_the_cost_model(embedded, tmp_path):
    with pytest.raises(ValueError, match="`cost_cache` must be None, True, False or a folder path"):
        specdec.load(embedded.model, heads=None, cost_cache=3)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="`cost_cache` must be a folder"):
        specdec.load(embedded.model, heads=None, cost_cache=tmp_path / "file")
    kept = specdec.load(embedded.model, heads=None, tokenizer=embedded.tokenizer, cost_cache=tmp_path / "costs")
    model = kept.engine.cost_model()
    assert (tmp_path / "costs" / f"cost-{model.key}.json").is_file()
