"""Incremental detokenisation that never splits a multi-byte character.

Decoding one token at a time breaks UTF-8 characters spread over byte-level tokens, so a short window of
the running ids is decoded and only the new, complete text is emitted (as TGI and vLLM do).
"""
from __future__ import annotations

from typing import Callable


def window_decoder(tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode(ids, skip_special_tokens=False)`, through the Rust tokenizer where that is identical.

    The Python wrapper costs more than decoding a few ids, and this runs twice per emitted token.
    """
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the tokenizer's own decode
        TokenizersBackend = None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (TokenizersBackend is not None and isinstance(tokenizer, TokenizersBackend) and backend is not None
            and type(tokenizer)._decode is TokenizersBackend._decode and not tokenizer.clean_up_tokenization_spaces):
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


class IncrementalDecoder:
    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self._decode = window_decoder(tokenizer) if tokenizer is not None else None
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window we re-decode
        self.read_offset = 0  # ids[:read_offset] have been emitted as text

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" while a character is partial)."""
        if self.tok is None:
            return ""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still pending at the end (may hold a replacement character)."""
        if self.tok is None or self.read_offset == len(self.ids):
            return ""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]
