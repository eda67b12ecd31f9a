"""Compare as a race: speculative and plain decoding side by side, and why one wins.

Pure functions of the two runs' round events and their measured engine
seconds. The explanation is arithmetic on the run's own numbers: a
speculative round costs `round_cost` plain steps and yields
`tokens_per_forward` tokens, so it wins exactly when the second is larger.
One race is noisy (a busy machine moves a lane's time by a tenth or more), so
the ratio is the median over interleaved pairs of runs, with its range.
"""
from __future__ import annotations

from specdec import RoundEvent
from specdec.stats import decode_rounds, is_lossy, throughput


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def tokens_per_forward(events: list[RoundEvent]) -> float | None:
    """Tokens per target forward over the decoding rounds (the prefill's forward and first token excluded):
    the table's figure and the explanation's."""
    return _mean([len(ev.emitted) for ev in decode_rounds(events)])


def lane_numbers(events: list[RoundEvent], seconds: float) -> dict:
    """One lane's totals: wall (engine) seconds, target forwards (prefill included), tokens per forward."""
    tokens = sum(len(ev.emitted) for ev in events)
    forwards = len(events)  # one target forward per round; round 0 is the prefill
    return {"tokens": tokens, "forwards": forwards, "seconds": seconds,
            "tokens_per_forward": tokens_per_forward(events), "tokens_per_second": throughput(tokens, seconds)}


def pair_ratios(spec_events: list[RoundEvent], base_events: list[RoundEvent],
                pairs: list[tuple[float, float]]) -> list[float]:
    """Each pair's ratio from its (first lane, second lane) engine seconds; a seeded race repeats its tokens."""
    out = [race_ratio(lane_numbers(spec_events, a), lane_numbers(base_events, b)) for a, b in pairs]
    return [r for r in out if r is not None]


def race_ratio(spec: dict, base: dict) -> float | None:
    """Speculative tokens/s over plain tokens/s (> 1: speculation is faster)."""
    a, b = spec["tokens_per_second"], base["tokens_per_second"]
    return a / b if a and b else None


def round_costs(spec_events: list[RoundEvent], base_events: list[RoundEvent]) -> dict | None:
    """Per decoding round (prefill excluded), from the engines' own timings (ms):

    tokens_per_forward: tokens a speculative round emitted; round_cost: its time over a plain
    step's; forward_cost: its target forward alone over a one-token forward; overhead_ms: the
    rest of the round (drafting, verifying, cache moves); nodes: tree size, root included.
    """
    spec, base = decode_rounds(spec_events), decode_rounds(base_events)
    step = _mean([ev.timings.get("total", 0.0) for ev in base])
    base_fwd = _mean([ev.timings.get("forward", ev.timings.get("total", 0.0)) for ev in base])
    if not spec or not step:
        return None
    total = _mean([ev.timings.get("total", 0.0) for ev in spec])
    fwd = _mean([ev.timings.get("forward", 0.0) for ev in spec])
    return {"tokens_per_forward": tokens_per_forward(spec_events), "round_cost": total / step,
            "forward_cost": (fwd / base_fwd) if base_fwd else None, "overhead_ms": total - fwd,
            "nodes": _mean([len(ev.nodes) for ev in spec if ev.nodes]) or 1.0}


def explain(spec_events: list[RoundEvent], base_events: list[RoundEvent], ratio: float | None,
            device: str = "CPU", temperature: float = 0.0) -> str:
    """Why the race ended as it did, in plain words and the run's own numbers."""
    c = round_costs(spec_events, base_events)
    if ratio is None or c is None:
        return ""
    tpf, cost = c["tokens_per_forward"], c["round_cost"]
    fwd = "" if c["forward_cost"] is None else \
        f"the {c['nodes']:.0f}-node tree forward alone costs {c['forward_cost']:.2f}× a one-token forward, plus "
    why = (f"one speculative round cost {cost:.2f}× a plain step on this {device} ({fwd}"
           f"{c['overhead_ms']:.1f} ms of drafting and verifying)")
    if ratio >= 1:
        return (f"**Why speculation won:** each target forward made **{tpf:.2f}** tokens on average, and "
                f"{why}; {tpf:.2f} > {cost:.2f}, so it is ahead.")
    hint = (f" Sampling at temperature {temperature:g} makes the target harder to guess, so fewer drafts are "
            "accepted: try temperature 0, or a prompt that repeats itself (prompt lookup copies it)."
            if temperature > 0 else
            " Try a prompt that repeats itself (prompt lookup copies it), a smaller tree, or a GPU, where a "
            "tree forward costs about as much as a one-token forward.")
    return (f"**Why speculation lost here:** each target forward made **{tpf:.2f}** tokens on average, but "
            f"{why}. It needs more than {cost:.2f} tokens per forward to win, so this round mix loses.{hint}")


def explain_drafters(a_events: list[RoundEvent], b_events: list[RoundEvent], a: str, b: str,
                     ratio: float | None = None) -> str:
    """Why one drafter beat another (the measured `ratio`'s winner; without it, the faster per ms of rounds):
    tokens per forward against what a round costs, in the run's own numbers."""
    def numbers(events):
        dec = decode_rounds(events)
        if not dec:
            return None
        total = sum(ev.timings.get("total", 0.0) for ev in dec)
        draft = sum(ev.timings.get("draft", 0.0) for ev in dec)
        tokens = sum(len(ev.emitted) for ev in dec)
        return (tokens_per_forward(events), total / len(dec), draft / total if total else 0.0,
                tokens / total if total else 0.0)

    x, y = numbers(a_events), numbers(b_events)
    if x is None or y is None:
        return ""
    lane = lambda name, n: (f"**{name}** made {n[0]:.2f} tokens per target forward in rounds of {n[1]:.1f} ms "  # noqa: E731
                            f"({n[2]:.0%} of it drafting): {n[3]:.2f} tokens per ms of rounds")
    won = (a if x[3] >= y[3] else b) if ratio is None else (a if ratio >= 1 else b)
    return (f"**Why {won} won:** {lane(a, x)}; {lane(b, y)}. More tokens per forward win only when the rounds "
            "that draft them do not cost more in proportion.")


def identity_line(spec_events: list[RoundEvent], base_events: list[RoundEvent], greedy: bool,
                  acceptance: str, drafters: bool = False) -> str:
    """Greedy and seeded lossless sampling: the two texts are identical (a seed fixes each position's draw).
    Typical acceptance: lossy."""
    s_ids = [t.token_id for ev in spec_events for t in ev.emitted]
    b_ids = [t.token_id for ev in base_events for t in ev.emitted]
    if greedy:
        if s_ids == b_ids:
            return ("✓ **identical** texts (greedy: " + ("both drafters must reproduce plain greedy exactly)" if drafters
                    else "speculative decoding must reproduce the baseline exactly)"))
        k = next((i for i, (x, y) in enumerate(zip(s_ids, b_ids)) if x != y), min(len(s_ids), len(b_ids)))
        return (f"✗ texts **differ** from token {k} (greedy should match exactly; in fp16/bf16 tiny numeric "
                "differences between a tree forward and a single-token forward can flip a tie)")
    if is_lossy(acceptance):
        return f"{acceptance} acceptance is **LOSSY**: the output no longer follows the target distribution"
    if s_ids == b_ids:
        return ("✓ **identical** texts (lossless sampling with one seed: the seed fixes each position's draw, so "
                "speculation emits the very tokens plain sampling draws)")
    return ("the texts differ (each follows the target's law; with one seed they match unless a tie between a tree "
            "forward's and a one-token forward's rounding flipped a draw)")


def race_markdown(spec_events: list[RoundEvent], base_events: list[RoundEvent], pairs: list[tuple[float, float]],
                  *, done: bool, max_new_tokens: int, greedy: bool, acceptance: str, device: str = "CPU",
                  temperature: float = 0.0, how: str = "", names: tuple[str, str] | None = None,
                  drafters: bool = False) -> str:
    """The race table (live while running), then the median ratio, its range and its explanation when done.

    `pairs`: each run pair's (first lane, second lane) engine seconds, the shown race first; the table's times
    are their medians. `names`: the two lanes' names; `drafters`: the second lane is another drafter, not plain
    decoding.
    """
    seconds = [_median([p[k] for p in pairs]) for k in (0, 1)] if pairs else [0.0, 0.0]
    s, b = lane_numbers(spec_events, seconds[0]), lane_numbers(base_events, seconds[1])

    def cell(x, fmt):
        return "–" if x is None else format(x, fmt)

    rows = list(zip(names or ("speculative" + how, "plain decoding"), (s, b)))
    table = ("| | tokens | target forwards | tokens / forward | time (s) | tok/s |\n"
             "|---|---|---|---|---|---|\n" +
             "".join(f"| {name} | {n['tokens']}/{max_new_tokens} | {n['forwards']} | "
                     f"{cell(n['tokens_per_forward'], '.2f')} | {n['seconds']:.2f} | "
                     f"{cell(n['tokens_per_second'], '.1f')} |\n"
                     for name, n in rows))
    if not done:
        return "**Race running…** (both lanes share one engine clock: engine time only)\n\n" + table
    ratios = pair_ratios(spec_events, base_events, pairs)
    ratio = _median(ratios) if ratios else None
    head = "n/a" if ratio is None else f"{ratio:.2f}×"
    spread = (f", range {min(ratios):.2f}–{max(ratios):.2f}× over {len(ratios)} interleaved pairs"
              if len(ratios) > 1 else "")
    note = ("tokens / forward: over the decoding rounds (the prefill's forward excluded); time: the median "
            f"pair's engine seconds after an untimed warm-up, UI excluded ({len(pairs)} pair{'s' * (len(pairs) != 1)})")
    if drafters:
        a, z = rows[0][0], rows[1][0]
        verdict = "" if ratio is None else (f" ({a} faster" if ratio >= 1 else f" ({z} faster") + f"{spread})"
        return (f"**Median ratio {head}**{verdict}: {a} tok/s ÷ {z} tok/s, same prompt, settings and seed.\n\n"
                f"{table}\n<small>{note}</small>\n\n"
                f"{explain_drafters(spec_events, base_events, a, z, ratio)}\n\n"
                f"{identity_line(spec_events, base_events, greedy, acceptance, drafters=True)}.")
    verdict = "" if ratio is None else (" (faster" if ratio >= 1 else " (**slower**: below 1") + f"{spread})"
    return (f"**Median ratio {head}**{verdict}: speculative tok/s ÷ plain tok/s, same prompt, settings and seed.\n\n"
            f"{table}\n<small>{note}</small>\n\n"
            f"{explain(spec_events, base_events, ratio, device, temperature)}\n\n"
            f"{identity_line(spec_events, base_events, greedy, acceptance)}.")
