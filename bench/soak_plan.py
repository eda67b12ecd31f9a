"""What the soak test sends: each request's plan (server, prompt, length, sampling, how its client ends it),
drawn from its own seeded generator, and the greedy prompts run alone first to compare with."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = json.loads((ROOT / "assets" / "static" / "examples.json").read_text())
NEW_TOKENS = (8, 16, 32, 64, 96)
LONG_TOKENS = 200  # cancelled and dropped requests ask for this many, so they are still running when cut
GREEDY = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)


@dataclass
class Call:
    """One request: what is sent, how the client behaves, and how it ended."""

    id: int
    server: str  # app / serve
    how: str  # whole / stream / cancel / drop
    prompt: str
    max_new_tokens: int
    sampling: dict  # temperature, top_k, top_p, min_p, seed
    start: float = 0.0
    end: float | None = None
    outcome: str = ""  # finished / cancelled / failed_injected / failed_other (lost: end stays None)
    fault: str = ""  # for failed_injected: chaos_oom / chaos_error / engine_killed
    error: str = ""
    text: str = ""

    @property
    def greedy(self) -> bool:
        return self.sampling["temperature"] == 0


def prompt_variant(rng: random.Random) -> str:
    """An example prompt cut to a prefix, kept whole, or repeated up to 6 times: 1 to ~150 tokens."""
    text = rng.choice(EXAMPLES)
    shape = rng.random()
    if shape < 0.3:
        return text[: rng.randint(4, max(4, len(text)))]
    return text if shape < 0.6 else "\n".join([text] * rng.randint(2, 6))


def greedy_menu(seed: int, size: int) -> list[tuple[str, int]]:
    """The (prompt, max_new_tokens) pairs greedy requests draw from: each is run alone once per server first."""
    rng = random.Random(seed)
    menu = dict.fromkeys((prompt_variant(rng), rng.choice(NEW_TOKENS)) for _ in range(size * 4))
    return list(menu)[:size]


def plan(i: int, args, menu: list[tuple[str, int]]) -> Call:
    """Request i of the soak, drawn from its own seeded generator (the same whichever thread sends it)."""
    rng = random.Random(args.seed * 1_000_003 + i)
    server = rng.choice(("app", "serve"))
    r = rng.random()
    how = "cancel" if r < 0.12 else "drop" if r < 0.2 and server == "serve" else "whole"
    if how == "whole" and server == "serve" and rng.random() < 0.5:
        how = "stream"
    if how in ("cancel", "drop"):
        prompt, n = prompt_variant(rng), LONG_TOKENS
    elif rng.random() < 0.5:
        return Call(i, server, how, *rng.choice(menu), dict(GREEDY))
    else:
        prompt, n = prompt_variant(rng), rng.choice(NEW_TOKENS)
    sampling = dict(temperature=round(rng.uniform(0.3, 1.2), 3), top_k=rng.choice((0, 20, 50)),
                    top_p=rng.choice((1.0, 0.95, 0.9)), min_p=rng.choice((0.0, 0.05)), seed=rng.randrange(10**6))
    return Call(i, server, how, prompt, n, sampling)
