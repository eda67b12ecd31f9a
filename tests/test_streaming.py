"""specdec.streaming: the deltas join into `generate`'s text, stop strings cut it (across deltas too), finish
reasons and token counts, every value checked before a token, and closing or cancelling ends the request."""
from __future__ import annotations

import threading

import pytest
from transformers import AutoTokenizer

import specdec
from specdec import EmittedToken, RoundEvent, engine_process
from specdec.streaming import Delta, Stream, stop_strings, stream
from conftest import wait_until

pytestmark = pytest.mark.usefixtures("schedulers_idle")  # every request a test makes has ended after it
PROMPTS = ("def fibonacci(n):", "import json\n\ndef load_config(path):", "héllo wörld, 日本語 ", "class Stack:")


@pytest.fixture(scope="module")
def loaded():
    return specdec.load(device="cpu")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(specdec.api.DEFAULT_MODEL))


class FakeTicket:
    """Round events to iterate, and a record of `cancel()` (the scheduler's Ticket, minus the scheduler)."""

    def __init__(self, rounds: list[list[int]], finished: str | None = "length") -> None:
        last = len(rounds) - 1
        self.events = [RoundEvent(i, (), (), tuple(EmittedToken(t, "", "bonus", None, None) for t in ids), {},
                                  "plain", False, {}, 0, finished if i == last else None)
                       for i, ids in enumerate(rounds)]
        self.cancelled = False

    def __iter__(self):
        yield from self.events

    def cancel(self) -> None:
        self.cancelled = True


def one_per_round(ids: list[int]) -> list[list[int]]:
    return [[i] for i in ids]


def remote_idle(scheduler) -> bool:
    """An engine process's scheduler holds no request (`Scheduler.idle`, read through its stats)."""
    st = scheduler.stats()
    return not any(st[k] for k in ("waiting", "prefilling", "decoding", "tracked", "calls"))


# -- the text logic, on scripted rounds -------------------------------------------------------------

def test_never_splits_a_character_and_skips_special_tokens(tok):
    ids = tok("日本語 naïve ✓", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    s = Stream(FakeTicket(one_per_round(ids), finished="eos"), tok, prompt_tokens=3)
    deltas = list(s)
    assert "".join(d.text for d in deltas) == tok.decode(ids, skip_special_tokens=True) == "日本語 naïve ✓"
    assert all(d.text and "\ufffd" not in d.text for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == ids[:-1]  # the EOS released no text, so no delta
    assert s.token_ids == ids and s.completion_tokens == len(ids) and s.prompt_tokens == 3
    assert s.finish_reason == "stop" and not s.ticket.cancelled  # EOS is OpenAI's "stop"; it ended by itself


def test_stop_string_split_across_rounds_cuts_the_text_and_cancels(tok):
    text = "alpha beta gamma delta"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    s = Stream(FakeTicket(one_per_round(ids)), tok, 1, stop_strings(["zzz", "ta gam"]))
    deltas = [d.text for d in s]
    assert "".join(deltas) == "alpha be" and s.finish_reason == "stop" and s.ticket.cancelled
    upto = next(n for n in range(1, len(ids) + 1) if "ta gam" in tok.decode(ids[:n]))
    assert s.completion_tokens == upto  # counted up to the token that completed the stop string
    # a tail that could begin a stop string is held back, then released when it cannot
    s = Stream(FakeTicket(one_per_round(ids)), tok, 1, stop_strings("delta!"))
    assert "".join(d.text for d in s) == text and s.finish_reason == "length" and not s.ticket.cancelled


def test_events_mode_yields_every_round_with_its_event(tok):
    ids = tok("日本", add_special_tokens=False)["input_ids"]
    ticket = FakeTicket(one_per_round(ids))
    deltas = list(Stream(ticket, tok, 1, events=True))
    assert [d.event for d in deltas] == ticket.events and "".join(d.text for d in deltas) == "日本"
    assert [d.token_ids for d in deltas] == [(i,) for i in ids]


@pytest.mark.parametrize("stop", ["", [""], ["a"] * 5, 3, ["a", None]])
def test_bad_stop_values_are_refused_by_name(stop):
    with pytest.raises(ValueError, match="`stop`"):
        stop_strings(stop)


# -- on the embedded model ---------------------------------------------------------------------------

def test_deltas_join_into_generates_text(loaded):
    for prompt in PROMPTS:
        s = stream(loaded, prompt, max_new_tokens=40)
        deltas = list(s)
        ref = specdec.generate(loaded, prompt, max_new_tokens=40)
        assert all(isinstance(d, Delta) and d.text and d.event is None for d in deltas)
        assert "".join(d.text for d in deltas) == s.text == ref.text
        assert s.token_ids == ref.token_ids and s.completion_tokens == 40 and s.finish_reason == "length"
        assert s.prompt_tokens == len(loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        st = s.stats
        assert st["new_tokens"] == 40 and st["target_forwards"] < 40 and st["mean_accepted_length"] > 1


def test_a_stop_string_ends_the_request(loaded):
    ref = specdec.generate(loaded, PROMPTS[1], max_new_tokens=48).text
    stop = ref[20:24]
    s = stream(loaded, PROMPTS[1], max_new_tokens=48, stop=["\x00never", stop])
    assert "".join(d.text for d in s) == ref[: ref.find(stop)] and s.finish_reason == "stop"
    assert s.completion_tokens < 48
    assert loaded.scheduler.idle(timeout=30)


def test_every_value_is_checked_before_a_request_is_queued(loaded):
    assert loaded.scheduler.idle()
    for bad in (dict(temperature=-1), dict(top_p=0), dict(max_new_tokens=0), dict(stop=[""]), dict(events=1),
                dict(chat=True), dict(tree="nope")):
        with pytest.raises(ValueError):
            stream(loaded, "def f(x):", **bad)
    with pytest.raises(ValueError, match="prompt_ids"):
        stream(loaded, prompt_ids=[10**6])  # the vocabulary is checked by the scheduler's submit, in this thread
    assert loaded.scheduler.idle()  # nothing was queued


def test_closing_or_cancelling_ends_the_request(loaded):
    s = stream(loaded, PROMPTS[0], max_new_tokens=400)
    s.close()  # before reading anything
    assert loaded.scheduler.idle(timeout=30) and s.completion_tokens == 0
    s = stream(loaded, PROMPTS[0], max_new_tokens=400)
    first = next(s)
    assert first.text
    s.close()
    assert loaded.scheduler.idle(timeout=30)
    assert s.finish_reason is None and s.completion_tokens < 400
    s = stream(loaded, PROMPTS[0], max_new_tokens=400)
    got: list[Delta] = []
    reader = threading.Thread(target=lambda: got.extend(s))
    reader.start()
    wait_until(lambda: got, what="a first delta")
    s.cancel()  # from another thread than the reader's
    reader.join(30)
    assert not reader.is_alive() and s.finish_reason is None and s.completion_tokens < 400
    assert loaded.scheduler.idle(timeout=30)


@pytest.mark.slow
def test_an_engine_process_streams_the_same_text(loaded):
    remote = engine_process.start(threads=1, device="cpu")
    try:
        for prompt in PROMPTS[:2]:
            s = stream(remote, prompt, max_new_tokens=32)
            assert "".join(d.text for d in s) == specdec.generate(loaded, prompt, max_new_tokens=32).text
            assert s.finish_reason == "length" and s.completion_tokens == 32
        s = stream(remote, PROMPTS[0], max_new_tokens=400, stop="get_get")
        assert "get_get" not in "".join(d.text for d in s) and s.finish_reason == "stop"
        with pytest.raises(ValueError, match="prompt_ids"):
            stream(remote, prompt_ids=[10**6])  # refused by the engine's process, raised here
        wait_until(lambda: remote_idle(remote.scheduler), what="the engine's scheduler going idle")
    finally:
        remote.close()
