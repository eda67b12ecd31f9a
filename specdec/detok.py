"""Incremental detokenisation that never splits a multi-byte character.

Decoding one token at a time breaks UTF-8 characters spread over several
byte-level tokens. We decode a short window of the running ids and emit
only the new, complete text (the approach of TGI and vLLM).
"""
from __future__ import annotations


class IncrementalDecoder:
    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window we re-decode
        self.read_offset = 0  # ids[:read_offset] have been emitted as text

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" while a character is partial)."""
        if self.tok is None:
            return ""
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=False)
        full = self.tok.decode(self.ids[self.prefix_offset :], skip_special_tokens=False)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still pending at the end (may hold a replacement character)."""
        if self.tok is None or self.read_offset == len(self.ids):
            return ""
        prefix = self.tok.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=False)
        full = self.tok.decode(self.ids[self.prefix_offset :], skip_special_tokens=False)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :]
