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


def test_the_window_decoder_is_the_tokenizers_own_decode(bpe_tokenizer, byte_tokenizer):
    """Straight through the Rust tokenizer only where that is exactly `decode`: same text for every window,
    special tokens and split characters included; a tokenizer that cleans up spaces keeps its own decode."""
    import random

    from specdec.detok import window_decoder

    fast = window_decoder(bpe_tokenizer)
    assert "backend" in fast.__code__.co_freevars  # the embedded tokenizer takes the direct path
    rng = random.Random(0)
    vocab = len(bpe_tokenizer)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(0, 7))]
        assert fast(ids) == bpe_tokenizer.decode(ids, skip_special_tokens=False), ids
    for text in TEXTS:
        ids = bpe_tokenizer.encode(text, add_special_tokens=False)
        assert all(fast(ids[i:j]) == bpe_tokenizer.decode(ids[i:j]) for i in range(len(ids)) for j in range(i, i + 4))
    bpe_tokenizer.clean_up_tokenization_spaces = True
    try:
        assert "backend" not in window_decoder(bpe_tokenizer).__code__.co_freevars
    finally:
        bpe_tokenizer.clean_up_tokenization_spaces = False
    other = window_decoder(byte_tokenizer)  # the tests' byte-level tokenizer: whatever it is, the same text
    assert other([104, 105]) == byte_tokenizer.decode([104, 105], skip_special_tokens=False)
