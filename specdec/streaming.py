"""Streaming text: one request's output as text deltas, cut at stop strings, ended with OpenAI's finish reasons.

`stream(...)` checks every value and submits before it returns, so a bad value is a ValueError before any
token. The deltas joined equal `generate(...).text` (no character ever split); `finish_reason` is "stop" (EOS
or a stop string), "length", or None when cancelled. Closing the stream, or `cancel()` from any thread,
cancels the request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Iterator

from .generation import build_request, result_stats
from .detok import IncrementalDecoder
from .events import RoundEvent
from .lookup import DEFAULT_LOOKUP

MAX_STOPS = 4  # as OpenAI's `stop`


@dataclass(frozen=True)
class Delta:
    """Text a round released and the ids since the last delta (`event`: the round's, with `events=True`)."""

    text: str
    token_ids: tuple[int, ...]
    event: RoundEvent | None = None


def stop_strings(stop) -> tuple[str, ...]:
    """`stop` checked: None, a non-empty string, or a list of up to 4 of them (`[]` is none)."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or len(stops) > MAX_STOPS \
            or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"`stop` must be a non-empty string or a list of at most {MAX_STOPS} non-empty strings, "
                         f"got {stop!r}")
    return tuple(dict.fromkeys(stops))


def special_ids(tokenizer) -> frozenset[int]:
    """The ids `decode(..., skip_special_tokens=True)` drops: special tokens and added ones marked special."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for i, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(i)
    return frozenset(ids)


class Stream:
    """One request's text as it is made: iterate it for `Delta`s (then `RequestFailed` if it failed)."""

    def __init__(self, ticket: Iterable[RoundEvent], tokenizer, prompt_tokens: int, stops: tuple[str, ...] = (),
                 events: bool = False) -> None:
        """Args:
            ticket: the request's scheduler Ticket (iterable for its events; `cancel()` stops it).
            tokenizer: turns the ids into text (None: every delta's text is "").
            prompt_tokens: the prompt's length in tokens.
            stops: strings (checked by `stop_strings`) that end the text before them.
            events: yield a delta for every round, with its event.
        """
        self.ticket = ticket
        self.prompt_tokens = prompt_tokens
        self.finish_reason: str | None = None
        self.token_ids: list[int] = []
        self.events: list[RoundEvent] = []
        self._stops = stops
        self._events = events
        self._detok = IncrementalDecoder(tokenizer)
        self._special = special_ids(tokenizer)
        self._text = ""  # the text so far, stop-cut
        self._sent = 0  # _text[:_sent] went out in deltas
        self._t0 = time.perf_counter()
        self._seconds = 0.0
        self._run = self._deltas()

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def text(self) -> str:
        """The text the deltas carried so far."""
        return self._text[: self._sent]

    @property
    def stats(self) -> dict:
        """`generation.result_stats` of the rounds so far: mean accepted length, target forwards, tokens/s."""
        return result_stats(self.events, self._seconds or time.perf_counter() - self._t0)

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        return next(self._run)

    def cancel(self) -> None:
        """Stop the request by its next round (safe from any thread); the iteration then ends."""
        self.ticket.cancel()

    def close(self) -> None:
        """End the iteration here (from the iterating thread) and cancel the request if it still runs."""
        self._run.close()
        self._let_go()

    def _deltas(self) -> Iterator[Delta]:
        ids: list[int] = []
        try:
            for ev in self.ticket:
                self.events.append(ev)
                ids += self._take(ev)
                end = len(self._text) if self.finish_reason else len(self._text) - self._held()
                text, self._sent = self._text[self._sent : end], end
                if text or self._events:
                    yield Delta(text, tuple(ids), ev if self._events else None)
                    ids = []
                if self.finish_reason is not None:
                    break
        finally:
            self._seconds = time.perf_counter() - self._t0
            self._let_go()

    def _let_go(self) -> None:
        """Cancel the request unless it ended by itself: a stop string or a closed stream frees its batch slot now."""
        if not self.events or self.events[-1].finished is None:
            self.ticket.cancel()

    def _take(self, ev: RoundEvent) -> list[int]:
        """Add one round's tokens to the text, one at a time so that a stop string ends it at its own token."""
        taken = []
        for tok in ev.emitted:
            taken.append(tok.token_id)
            self.token_ids.append(tok.token_id)
            if tok.token_id not in self._special and self._add(self._detok.push(tok.token_id)):
                return taken
        if ev.finished is not None and not self._add(self._detok.flush()):
            self.finish_reason = "stop" if ev.finished == "eos" else "length"  # "context" is a length too
        return taken

    def _add(self, piece: str) -> bool:
        """Append text; True when it completes a stop string (the text is then cut before it)."""
        self._text += piece
        if not piece or not self._stops:
            return False
        # A match starts at or after _sent: `_held` kept back every tail that could begin one.
        hits = [i for i in (self._text.find(s, self._sent) for s in self._stops) if i >= 0]
        if not hits:
            return False
        self._text = self._text[: min(hits)]
        self.finish_reason = "stop"
        return True

    def _held(self) -> int:
        """How many unsent trailing characters could begin a stop string that the next tokens complete."""
        longest = max((len(s) for s in self._stops), default=1)
        for n in range(min(longest - 1, len(self._text) - self._sent), 0, -1):
            tail = self._text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0


def stream(loaded, prompt: str | None = None, prompt_ids=None, *, max_new_tokens: int = 64,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
           seed: int | None = None, tree="auto", speculative: bool = True, acceptance: str = "auto",
           eos_token_id="auto", lookup: int = DEFAULT_LOOKUP, lookup_ngram: int = 3, lookup_mode: str = "first",
           chat: bool = False, stop: str | list[str] | None = None, events: bool = False) -> Stream:
    """Submit a request as `specdec.generate` would and return its `Stream` of text deltas.

    Args:
        loaded: a `specdec.Loaded`, or an `engine_process.RemoteModel`.
        stop: a string or up to 4; the text ends before the first one that appears (finish reason "stop").
        events: yield a delta for every round, each with its RoundEvent.
        (the others: as `specdec.generate`)
    """
    stops = stop_strings(stop)
    if not isinstance(events, bool):
        raise ValueError(f"`events` must be True or False, got {events!r}")
    if stops and loaded.tokenizer is None:
        raise ValueError("`stop` matches text, but this model was loaded without a tokenizer")
    request = build_request(loaded, prompt, prompt_ids, max_new_tokens, temperature, top_k, top_p, min_p, seed, tree,
                       speculative, acceptance, eos_token_id, lookup, lookup_ngram, lookup_mode, chat)
    ticket = loaded.scheduler.submit(request)
    return Stream(ticket, loaded.tokenizer, len(request.prompt_ids), stops, events)
