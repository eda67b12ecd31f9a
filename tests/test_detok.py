"""specdec/detok.py: incremental detokenisation never splits a character (the engine's event text)."""
from __future__ import annotations

import pytest

import specdec
from specdec.detok import IncrementalDecoder

TEXTS = [
    "Hello 😀 world 🎉🎉 done",
    "日本語のテキスト、漢字とかな。中文也可以。",
    "mixé ünïcødé — “quotes” 👩‍👩‍👧 family, flag 🇫🇷, skin 👍🏽",
    "a\n\n  b\t 한국어 😀😀😀x",
    "combining: e\u0301 a\u0308 and a literal \ufffd replacement char",
    "ends mid-emoji? no: 🙂",
]


@pytest.fixture(scope="module")
def bpe_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(specdec.api.DEFAULT_MODEL))


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_decoder_never_splits_characters(bpe_tokenizer, text):
    ids = bpe_tokenizer.encode(text, add_special_tokens=False)
    assert bpe_tokenizer.decode(ids) == text
    dec = IncrementalDecoder(bpe_tokenizer)
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) + dec.flush() == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)
        assert dec.flush() == ""
    if any(ord(c) > 0x7FF for c in text):
        # the test only means something if single tokens split characters
        assert any("\ufffd" in bpe_tokenizer.decode([i]) for i in ids)
        assert "" in pieces


def test_incremental_decoder_flush_and_no_tokenizer(bpe_tokenizer):
    ids = bpe_tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1
    dec = IncrementalDecoder(bpe_tokenizer)
    assert dec.push(ids[0]) == ""
    assert dec.flush() != ""  # the incomplete bytes come out at the end, as replacement text
    assert IncrementalDecoder(None).push(5) == ""
