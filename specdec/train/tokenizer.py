"""Byte-level BPE tokenizer trained on the local Python corpus."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .corpus import iter_texts

EOS = "<|endoftext|>"


def train_tokenizer(out_dir: str | Path, vocab_size: int = 8192, max_chars: int = 60_000_000) -> PreTrainedTokenizerFast:
    """Train a GPT-2 style byte-level BPE and save it for `AutoTokenizer.from_pretrained`."""
    if not 256 < vocab_size <= 65535:
        raise ValueError(f"vocab_size must be in (256, 65535] (ids are stored as uint16), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(iter_texts("train", max_chars=max_chars), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None, pad_token=EOS,
        model_max_length=1024, clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
    return fast
