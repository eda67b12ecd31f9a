"""Token streams for training: the corpus tokenised into flat uint16 arrays.

Files are separated by the EOS token, so the model learns where a module
ends. Arrays are saved as .npy next to a small JSON of what went in.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .corpus import describe_environment, iter_source_files, read_text


def build_token_arrays(tokenizer, out_dir: str | Path, max_chars: int = 300_000_000, seed: int = 0,
                       batch_files: int = 256) -> dict:
    """Tokenise the local Python installation into train.npy / valid.npy (uint16).

    Files are shuffled (seeded) before the `max_chars` cap, so a capped
    corpus still samples every package rather than the alphabetically first.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if len(tokenizer) > 65535:
        raise ValueError(f"vocabulary of {len(tokenizer)} does not fit uint16")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    files = list(iter_source_files())
    random.Random(seed).shuffle(files)
    eos = tokenizer.eos_token_id
    chunks = {"train": [], "valid": []}
    stats = {"train": {"files": 0, "chars": 0}, "valid": {"files": 0, "chars": 0}}
    total = 0
    bar = tqdm(total=max_chars, unit="char", unit_scale=True, desc="tokenize")
    for i in range(0, len(files), batch_files):
        group = files[i : i + batch_files]
        texts, splits = [], []
        for f in group:
            t = read_text(f)
            if t:
                texts.append(t)
                splits.append(f.split)
        if not texts:
            continue
        enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
        for ids, split, t in zip(enc, splits, texts):
            chunks[split].append(np.asarray([eos] + ids, dtype=np.uint16))
            stats[split]["files"] += 1
            stats[split]["chars"] += len(t)
        n = sum(len(t) for t in texts)
        total += n
        bar.update(n)
        if total >= max_chars:
            break
    bar.close()
    info = {"environment": describe_environment(), "max_chars": max_chars, "seed": seed}
    for split, parts in chunks.items():
        arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
        np.save(out / f"{split}.npy", arr)
        info[split] = {**stats[split], "tokens": int(arr.size)}
    (out / "data.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def load_tokens(data_dir: str | Path, split: str) -> np.ndarray:
    return np.load(Path(data_dir) / f"{split}.npy", mmap_mode="r")
