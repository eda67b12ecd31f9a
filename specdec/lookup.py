"""Prompt lookup: draft the tokens that followed the last time this n-gram occurred.

Repeats in code, chat and small models' output are drafted for free, with no weights and no forward (Saxena's
prompt lookup decoding, HF's `prompt_lookup_num_tokens`). A proposal is a deterministic function of the
committed tokens, so it is a point-mass draft and the verifier's rules stay lossless unchanged.
"""
from __future__ import annotations

from .draft_tree import graft_chain
from .drafter import Proposal

# Tokens proposed per round by `specdec.generate`, the CLI and the app; the Engine itself defaults to 0.
DEFAULT_LOOKUP = 10
MAX_LOOKUP = 64  # the longest chain a round may draft; every entry point checks against it


class NgramIndex:
    """Latest occurrence of each n-gram (n <= max_ngram) before the last token: no suffix matches itself."""

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
        """`propose`'s tokens and the length n of the suffix n-gram they follow (0: no match)."""
        toks = self.tokens
        if length < 1:
            return [], 0
        for n in range(min(self.max_ngram, len(toks)), 0, -1):
            end = self._last.get(tuple(toks[-n:]))
            if end is not None:
                # An overlapping copy, as in LZ77, so a short-period repeat still yields `length` tokens.
                out: list[int] = []
                for j in range(end + 1, end + 1 + length):
                    out.append(toks[j] if j < len(toks) else out[j - len(toks)])
                return out, n
        return [], 0


class LookupDrafter:
    """Prompt lookup behind `drafter.Drafter`: what followed the longest matching suffix, room allowing."""

    source = "lookup"

    def propose(self, state: NgramIndex, root: int, room: int) -> Proposal | None:
        chain, n = state.match(room)
        if not chain:
            return None
        return Proposal(graft_chain((), 0, len(chain)), [root, *chain], [None] * (len(chain) + 1), self.source, n)


LOOKUP = LookupDrafter()
