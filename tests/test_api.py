"""specdec.api: chat prompts through the tokenizer's template, and heads from folders or hub ids."""
from __future__ import annotations

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
    with pytest.raises(ValueError, match="neither a local folder nor a downloadable hub repo"):
        specdec.load(embedded.model, heads="no-such-owner/no-such-heads")  # offline here: a clear error
