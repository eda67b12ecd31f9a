"""Prompt lookup: draft the tokens that followed the last time this n-gram occurred.

Code, chat transcripts and small models repeat themselves, and n-gram
matching drafts those repeats for free (no weights, no forward), as in
Saxena's prompt lookup decoding and HF's `prompt_lookup_num_tokens`.
`LookupDrafter` proposes the chain behind the `drafter.Drafter` interface;
the draft step grafts it into another drafter's tree, so one verify pass
checks both, or drafts with the chain alone when the context has a match
(the request's `lookup_mode`).

A proposal is a deterministic function of the committed tokens, so it is
a point-mass draft and the verifier's rules stay lossless unchanged.
"""
from __future__ import annotations

from .draft_tree import graft_chain
from .drafter import Proposal

# Tokens proposed per round by `specdec.generate`, the CLI and the app (HF's
# `prompt_lookup_num_tokens` is commonly 10 too). The Engine itself defaults to 0.
DEFAULT_LOOKUP = 10
MAX_LOOKUP = 64  # the longest chain a round may draft; every entry point checks against it


class NgramIndex:
    """The latest occurrence of every n-gram (1 <= n <= max_ngram) of a growing token list.

    The index covers n-grams that end before the last token, so the
    current suffix never matches itself. Updating costs O(max_ngram) per
    new token; a proposal costs max_ngram dict lookups.
    """

    def __init__(self, tokens: list[int], max_ngram: int = 3) -> None:
        if not isinstance(max_ngram, int) or isinstance(max_ngram, bool) or max_ngram < 1:
            raise ValueError(f"`lookup_ngram` must be an integer >= 1, got {max_ngram!r}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> index of its last token
        self._indexed = 0  # n-grams ending at positions < _indexed are in _last
        self.extend(tokens)

    def extend(self, new_tokens: list[int]) -> None:
        self.tokens.extend(new_tokens)
        toks, last = self.tokens, self._last
        for end in range(self._indexed, len(toks) - 1):
            for n in range(1, min(self.max_ngram, end + 1) + 1):
                last[tuple(toks[end - n + 1 : end + 1])] = end
        self._indexed = max(self._indexed, len(toks) - 1)

    def propose(self, length: int) -> list[int]:
        """Up to `length` tokens that followed the longest matching suffix n-gram; [] if none matches."""
        return self.match(length)[0]

    def match(self, length: int) -> tuple[list[int], int]:
        """`propose`'s tokens and the length n of the suffix n-gram they follow (0: no match).

        The longer the match, the likelier its chain: on the embedded model, the first token of a chain
        was the greedy token after 39% of 1-gram matches and 95% of 3-gram ones (and 16% against 62%
        at T = 1.0), so the dynamic tree calibrates chains per match length.
        """
        toks = self.tokens
        if length < 1:
            return [], 0
        for n in range(min(self.max_ngram, len(toks)), 0, -1):
            end = self._last.get(tuple(toks[-n:]))
            if end is not None:
                # An overlapping copy, as in LZ77: when the copy reaches the end of the context it
                # goes on reading what it has just proposed, so a repeat with a short period
                # (the latest match is then only a few tokens back) still yields `length` tokens.
                out: list[int] = []
                for j in range(end + 1, end + 1 + length):
                    out.append(toks[j] if j < len(toks) else out[j - len(toks)])
                return out, n
        return [], 0


class LookupDrafter:
    """Prompt lookup behind the `drafter.Drafter` interface: a chain of the tokens that followed the
    context's longest matching suffix n-gram, as long as the room allows."""

    source = "lookup"

    def propose(self, state: NgramIndex, root: int, room: int) -> Proposal | None:
        chain, n = state.match(room)
        if not chain:
            return None
        return Proposal(graft_chain((), 0, len(chain)), [root, *chain], [None] * (len(chain) + 1), self.source, n)


LOOKUP = LookupDrafter()
