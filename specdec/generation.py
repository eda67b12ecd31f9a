"""`generate` and `generate_batch`: a prompt in, tokens, text, events and stats out, through the scheduler."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .api import Loaded, encode
from .events import RoundEvent
from .failure import RequestFailed
from .lookup import DEFAULT_LOOKUP
from .request import GenerationRequest
from .sampler import SamplingParams
from .stats import summarize


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]  # new tokens only
    text: str
    rounds: list[RoundEvent]
    stats: dict
    error: str | None = None  # generate_batch: why this request ended early (its partial output is above)

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "stats": self.stats,
                "rounds": [r.to_dict() for r in self.rounds]}


def result_stats(rounds: list[RoundEvent], seconds: float) -> dict:
    """The documented `GenerationResult.stats` (see specdec.stats for the definitions); tokens/s on the wall clock."""
    s = summarize(rounds, wall_seconds=seconds)
    mal = s["mean_accepted_length"]
    return {"new_tokens": s["new_tokens"], "target_forwards": s["target_forwards"],
            # a run that ended in its prefill made its tokens with that one forward
            "mean_accepted_length": float(s["new_tokens"]) if mal is None else mal,
            "tokens_per_second": s["wall_tokens_per_second"] or 0.0, "seconds": seconds, "finished": s["finished"]}


def generate(loaded: Loaded, prompt: str | None = None, prompt_ids=None, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             seed: int | None = None, tree="auto", speculative: bool = True, acceptance: str = "auto",
             on_round: Callable[[RoundEvent], None] | None = None, eos_token_id="auto",
             lookup: int = DEFAULT_LOOKUP, lookup_ngram: int = 3, lookup_mode: str = "first",
             chat: bool = False, drafter: str = "auto") -> GenerationResult:
    """Generate from a prompt (text or ids) on `loaded.scheduler`; return tokens, text, events and stats.

    Args:
        lookup: prompt-lookup tokens drafted per round (0: heads only).
        lookup_mode: "first" (a round with an n-gram match drafts the chain alone) or "merge" (with heads).
        chat: send the prompt as one user turn through the tokenizer's chat template.
        drafter: "auto" (the model's default), "medusa" or "eagle3", where the model has that drafter.

    Raises:
        RequestFailed: an error in the request's round (its `on_round` raising, say), with its events so far.
    """
    request = build_request(loaded, prompt, prompt_ids, max_new_tokens, temperature, top_k, top_p, min_p, seed, tree,
                       speculative, acceptance, eos_token_id, lookup, lookup_ngram, lookup_mode, chat, drafter)
    t0 = time.perf_counter()
    ticket = loaded.scheduler.submit(request, on_round=on_round)
    ticket.done.wait()
    if ticket.failure is not None:
        raise RequestFailed(ticket.failure, ticket.events)
    return _result_of(loaded, ticket.events, time.perf_counter() - t0)


def generate_batch(loaded: Loaded, prompts: list[str] | None = None, prompt_ids: list | None = None,
                   max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0, seed: int | None = None, tree="auto", speculative: bool = True,
                   acceptance: str = "auto", eos_token_id="auto", lookup: int = DEFAULT_LOOKUP,
                   lookup_ngram: int = 3, lookup_mode: str = "first", chat: bool = False,
                   drafter: str = "auto") -> list[GenerationResult]:
    """Generate from several prompts (texts, or lists of ids) at once, decoded together on `loaded.scheduler`.

    Results come in the prompts' order; a request that failed keeps its partial output, with `error` set.

    Args:
        seed: seeds each request's own generator, every one with the same value.
    """
    if (prompts is None) == (prompt_ids is None):
        raise ValueError("pass `prompts` (texts) or `prompt_ids` (lists of token ids), not both")
    items = prompts if prompts is not None else prompt_ids
    if isinstance(items, str) or not isinstance(items, (list, tuple)) or not items:
        raise ValueError("`prompts` / `prompt_ids` must be a non-empty list")
    field = "prompts" if prompts is not None else "prompt_ids"
    # The shared settings first, so that their errors name the setting, not a prompt.
    build_request(loaded, None, [0], max_new_tokens, temperature, top_k, top_p, min_p, seed, tree, speculative,
             acceptance, eos_token_id, lookup, lookup_ngram, lookup_mode, False, drafter)
    requests = []
    for i, p in enumerate(items):
        try:
            requests.append(build_request(loaded, p if prompts is not None else None, p if prompts is None else None,
                                     max_new_tokens, temperature, top_k, top_p, min_p, seed, tree, speculative,
                                     acceptance, eos_token_id, lookup, lookup_ngram, lookup_mode, chat, drafter))
        except ValueError as e:
            raise ValueError(f"`{field}[{i}]`: {e}") from None
    t0 = time.perf_counter()
    tickets = []
    for i, r in enumerate(requests):
        try:
            tickets.append(loaded.scheduler.submit(r))  # checked against the model here (vocabulary, context)
        except ValueError as e:
            for t in tickets:
                t.cancel()
            raise ValueError(f"`{field}[{i}]`: {e}") from None
    out = []
    for t in tickets:
        t.done.wait()
        res = _result_of(loaded, t.events, time.perf_counter() - t0)
        out.append(res if t.failure is None else GenerationResult(res.token_ids, res.text, res.rounds, res.stats,
                                                                    str(t.failure)))
    return out


def build_request(loaded: Loaded, prompt, prompt_ids, max_new_tokens, temperature, top_k, top_p, min_p, seed, tree,
             speculative, acceptance, eos_token_id, lookup, lookup_ngram, lookup_mode, chat,
             drafter="auto") -> GenerationRequest:
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    ids = encode(loaded, prompt, prompt_ids, chat)
    return GenerationRequest(ids, max_new_tokens, params, tree, speculative, acceptance, eos_token_id, lookup,
                             lookup_ngram, lookup_mode, drafter=drafter)


def _result_of(loaded: Loaded, rounds: list[RoundEvent], seconds: float) -> GenerationResult:
    token_ids = [t.token_id for r in rounds for t in r.emitted]
    text = loaded.tokenizer.decode(token_ids, skip_special_tokens=True) if loaded.tokenizer is not None else ""
    return GenerationResult(token_ids, text, list(rounds), result_stats(rounds, seconds))
