"""The embedded model's evaluation (scripts/eval_embedded.py): windowed NLL and bits per byte.

These figures decide whether a GPU-trained model replaces the shipped one, so the arithmetic is
checked against a direct computation, with a planted double-count as the negative control.
"""
from __future__ import annotations

import math

import pytest
import torch

from conftest import load_script


@pytest.fixture(scope="module")
def ev():
    return load_script("eval_embedded")


def direct_nll(model, ids: list[int]) -> float:
    """NLL in nats of ids[1:] from one forward over the whole sequence."""
    with torch.inference_mode():
        x = torch.tensor(ids)
        logits = model(x[None]).logits[0, :-1].float()
        return float(torch.nn.functional.cross_entropy(logits, x[1:], reduction="sum"))


def test_a_text_within_the_context_is_scored_by_one_forward(ev, byte_model):
    ids = [256] + list(b"def f(x):\n    return x * 2\n")
    nats, scored = ev.text_nll(byte_model, ids, context=64)
    assert scored == len(ids) - 1
    assert nats == pytest.approx(direct_nll(byte_model, ids), rel=1e-5)


@pytest.mark.parametrize("length,context", [(30, 8), (31, 8), (64, 16), (9, 8), (100, 7)])
def test_windows_score_every_token_once(ev, byte_model, length, context):
    ids = [256] + [(7 * i + 3) % 256 for i in range(length - 1)]
    nats, scored = ev.text_nll(byte_model, ids, context=context)
    assert scored == length - 1
    assert nats > 0 and math.isfinite(nats)


def test_the_count_catches_a_windowing_that_scores_overlaps_twice(ev, byte_model, monkeypatch):
    """Negative control: scoring every window whole (overlaps twice) over-counts tokens."""
    def whole_windows(model, ids, context):
        x, total, scored, start = torch.tensor(ids), 0.0, 0, 0
        while start + 1 < len(ids):
            window = x[start : start + context]
            logits = model(window[None]).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, window[1:], reduction="sum"))
            scored += len(window) - 1
            start += context // 2
        return total, scored

    ids = [256] + list(range(40))
    assert whole_windows(byte_model, ids, 8)[1] != len(ids) - 1
    assert ev.text_nll(byte_model, ids, 8)[1] == len(ids) - 1


def test_bits_per_byte_divides_bits_by_utf8_bytes(ev, byte_model, byte_tokenizer):
    texts = ["x = 1\n", "naïve = 'é'\n"]  # non-ASCII: bytes, not characters
    out = ev.bits_per_byte(byte_model, byte_tokenizer, texts, context=64)
    nats = sum(direct_nll(byte_model, [256] + byte_tokenizer(t)["input_ids"]) for t in texts)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    assert out["bytes"] == nbytes > sum(len(t) for t in texts)
    assert out["bits_per_byte"] == pytest.approx(nats / math.log(2) / nbytes, rel=1e-5)
    assert out["nats_per_token"] == pytest.approx(nats / out["tokens"], rel=1e-5)


def test_the_held_out_texts_are_python(ev):
    import ast

    texts = ev.heldout_texts()
    assert len(texts) >= 8
    assert len({name for name, _ in texts}) == len(texts)
    for name, text in texts:
        assert name.endswith(".py") and text.strip()
        ast.parse(text, filename=name)


def test_the_held_out_texts_are_read_whole(ev, tmp_path):
    path = tmp_path / "held.jsonl"
    path.write_text('{"name": "a.py", "text": "x = 1\\n"}\n\n{"name": "b.py", "text": "y = \'é\'\\r\\n"}\n',
                    encoding="utf-8")
    assert ev.heldout_texts(path) == [("a.py", "x = 1\n"), ("b.py", "y = 'é'\r\n")]
