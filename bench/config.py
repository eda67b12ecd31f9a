"""What one benchmark run measures: the prompts, the model and heads, and the decoding settings."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specdec.lookup import DEFAULT_LOOKUP
from specdec.request import GenerationRequest

# Held-out Python prompts: hand-written, not taken from the training corpus
# (which is the Python source of installed packages). --quick uses the first 4.
DEFAULT_PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\n\ndef walk(root):",
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1",
    "import json\n\ndef load_config(path):",
    "class LRUCache:\n    def __init__(self, capacity):",
    "def merge_sort(values):",
    "from dataclasses import dataclass\n\n@dataclass\nclass Point:",
    "import argparse\n\ndef parse_args():\n    parser = argparse.ArgumentParser(",
    "def read_csv(path):\n    rows = []\n    with open(path) as f:",
    "class Matrix:\n    def __init__(self, rows, cols):",
    "def is_prime(n):\n    if n < 2:\n        return False",
]


@dataclass
class BenchConfig:
    model: str | None = None  # None: embedded; "random:qwen2-0.5b" / "random:tiny"; hub id or path
    heads: str | None = None  # None: shipped heads; "random", "none", "oracle[:accuracy]" or a folder
    device: str = "cpu"
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on CUDA
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    max_new_tokens: int = 128
    repeats: int = 3  # timed repeats; the median is reported
    warmup: int = 1  # untimed runs of every method on the first prompt
    methods: tuple[str, ...] | None = None  # None: all that the heads allow
    temperature: float = 0.7  # sampling methods, HF and ours alike
    top_p: float = 0.9
    lookup: int = DEFAULT_LOOKUP  # prompt-lookup tokens per round, for HF's prompt lookup and ours alike
    stop_at_eos: bool = False  # False: every method decodes exactly max_new_tokens
    threads: int | None = None  # torch CPU threads (default: all cores)
    seed: int = 0
    cuda_graphs: bool = True  # specdec's captured forwards where the model runs on CUDA (False: eager)

    def check(self) -> None:
        """Raise ValueError for settings the benchmark cannot run; the request's own limits are checked by
        building one (GenerationRequest), so they are stated once, there."""
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"need repeats >= 1 and warmup >= 0; got {self.repeats}, {self.warmup}")
        if not self.prompts:
            raise ValueError("no prompts")
        # Two emissions at least: per-token latency is the gap between them.
        if self.max_new_tokens < 2:
            raise ValueError(f"`max_new_tokens` must be >= 2 for a benchmark, got {self.max_new_tokens}")
        # HF's prompt lookup gets the same number and needs one token at least.
        if self.lookup < 1:
            raise ValueError(f"`lookup` must be >= 1 for a benchmark (HF's prompt lookup drafts as many), "
                             f"got {self.lookup}")
        GenerationRequest((0,), self.max_new_tokens, lookup=self.lookup)


def read_prompts(path: str) -> list[str]:
    """A JSON list of strings, or JSONL with one {"prompt": ...} per line."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    prompts = [d["prompt"] if isinstance(d, dict) else d for d in data]
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"{path}: expected a non-empty list of non-empty prompt strings")
    return prompts
