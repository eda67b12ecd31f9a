"""How well does the dynamic tree order the heads' candidates? Greedy decoding, judged in hindsight.

Greedy output is fixed, so whether any draft tree would have been accepted at any position is known
once the text is written. This script decodes each prompt greedily (the target alone), runs the
heads at every position, and then replays a request's rounds offline: each round orders the heads'
top-10 candidates best first by an acceptance estimator, cuts the order at a node budget, counts the
drafts a tree of that size would have accepted, learns from the nodes it drafted (as the engine's
`_learn` does), and moves on by what it accepted. No timing is involved, so the comparison has no
noise: it separates the policy's choice of nodes from what a round costs.

Estimators compared: the engine's `Calibrator` (as shipped, and with other constants), a
per-(depth, rank) hit rate without q, and the static trees (the heads' trained tree and the presets).

    python scripts/tree_order_study.py                 # 12 bench prompts + 22 held-out file chunks, 128 tokens
    python scripts/tree_order_study.py --tokens 64 --bench-only
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import specdec  # noqa: E402
from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec import tree_policy as tp  # noqa: E402
from specdec.draft_tree import PRESETS  # noqa: E402

TOP = 10  # candidates per head, as the policy's TOPK
BUDGETS = (4, 8, 12, 16, 24)  # tree sizes, root included
DRAFTED = 16  # the tree a replayed round drafts (and learns from)


def positions(loaded, prompts: list[str], tokens: int) -> list[list[dict]]:
    """Per prompt, per generated position: the heads' top ids and q per depth, and the true next tokens."""
    engine, tok = loaded.engine, loaded.tokenizer
    model, heads, depth = engine.target.model, engine.heads, engine.heads.config.num_heads
    out = []
    with torch.inference_mode():
        for text in prompts:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            seq = model.generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)[0]
            hidden = engine.target.base(input_ids=seq[None]).last_hidden_state[0]  # [T, H]
            first = len(ids) - 1  # the position whose argmax is the first new token: the root's
            h = hidden[first:-1]  # [P, H]; position t's root is token t+1
            rows = heads(h, seq[first + 1:]) if heads.config.root_token else heads(h)
            q, top = torch.topk(torch.softmax(rows.float(), -1), TOP, dim=-1)  # [K, P, TOP]
            seq = seq.tolist()
            out.append([{"q": q[:, j].tolist(), "ids": top[:, j].tolist(),
                         "next": seq[first + j + 2 : first + j + 2 + depth]}  # depth d's right token, d = 1..K
                        for j in range(q.shape[1]) if first + j + 2 + depth <= len(seq)])
    return out


def accepted(paths, ids, nxt) -> tuple[int, tuple]:
    """Drafts a tree (rank paths) accepts, and the deepest accepted path."""
    tree, node = set(paths), ()
    while len(node) < len(nxt):
        d = len(node)
        step = next((node + (r,) for r in range(TOP) if node + (r,) in tree and ids[d][r] == nxt[d]), None)
        if step is None:
            break
        node = step
    return len(node), node


class CalibratorOrder:
    """The policy's own estimates: `tree_policy.Calibrator` rows per depth and rank, bins of q."""

    def __init__(self, depth: int, ranks: int = tp.RANKS, decay: float = tp.DECAY) -> None:
        self.ranks, self.decay = ranks, decay
        self.cal = tp.Calibrator(depth * ranks, tp.PRIOR["greedy"], stride=ranks)

    def estimates(self, q):
        return [[self.cal.estimate(d * self.ranks + min(r, self.ranks - 1), x) for r, x in enumerate(row)]
                for d, row in enumerate(q)]

    def observe(self, seen):
        old, tp.DECAY = tp.DECAY, self.decay
        try:
            self.cal.observe([(d * self.ranks + min(r, self.ranks - 1), x, y) for d, r, x, y in seen])
        finally:
            tp.DECAY = old


class RankOrder:
    """A running hit rate per (depth, rank), blind to q: what a static tree is built from."""

    def __init__(self, depth: int) -> None:
        self.hits = [[0.5] * TOP for _ in range(depth)]
        self.tries = [[1.0] * TOP for _ in range(depth)]

    def estimates(self, q):
        return [[h / n for h, n in zip(hr, nr)] for hr, nr in zip(self.hits, self.tries)][: len(q)]

    def observe(self, seen):
        for d, r, _, y in seen:
            self.hits[d][r] += y
            self.tries[d][r] += 1


def replay(data, estimator) -> dict[int, float]:
    """Mean accepted drafts per round at each budget, and the expected-vs-actual bias at DRAFTED nodes."""
    got: dict[int, list[int]] = defaultdict(list)
    for rows in data:
        j = 0
        while j < len(rows):
            row = rows[j]
            acc = estimator.estimates(row["q"])
            order = [p for _, p, _ in tp._best_first(acc, [], max(BUDGETS + (DRAFTED,)) - 1)]
            for b in BUDGETS:
                got[b].append(accepted(order[: b - 1], row["ids"], row["next"])[0])
            tree = order[: DRAFTED - 1]
            n, node = accepted(tree, row["ids"], row["next"])
            reached = {node[:k] for k in range(len(node) + 1)}
            estimator.observe([(len(p) - 1, p[-1], row["q"][len(p) - 1][p[-1]],
                                float(row["ids"][len(p) - 1][p[-1]] == row["next"][len(p) - 1]))
                               for p in tree if p[:-1] in reached])
            j += n + 1  # the next round starts after the accepted drafts and the target's own token
    return {b: statistics.mean(v) for b, v in got.items()}


def static(data, paths) -> float:
    got = []
    for rows in data:
        j = 0
        while j < len(rows):
            n, _ = accepted(paths, rows[j]["ids"], rows[j]["next"])
            got.append(n)
            j += n + 1
    return statistics.mean(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--bench-only", action="store_true", help="the 12 bench prompts only")
    args = ap.parse_args()
    prompts = list(DEFAULT_PROMPTS)
    if not args.bench_only:  # three 300-character openings of each held-out file
        for f in sorted((Path(__file__).parent / "heldout_python").glob("*.py")):
            text = f.read_text()
            prompts += [text[s : s + 300] for s in range(0, min(len(text), 3000), 1000)]
    loaded = specdec.load()
    data = positions(loaded, prompts, args.tokens)
    depth = loaded.engine.heads.config.num_heads
    print(f"{len(prompts)} prompts, {sum(map(len, data))} positions; mean accepted drafts per round:")
    print("| order | " + " | ".join(f"{b} nodes" for b in BUDGETS) + " |")
    print("| --- |" + " ---: |" * len(BUDGETS))
    rows = [("calibrator (shipped)", CalibratorOrder(depth)), ("calibrator, decay 0.995", CalibratorOrder(depth, decay=0.995)),
            ("calibrator, a row per rank", CalibratorOrder(depth, ranks=TOP)), ("hit rate per rank, no q", RankOrder(depth))]
    for name, est in rows:
        res = replay(data, est)
        print(f"| {name} | " + " | ".join(f"{res[b]:.3f}" for b in BUDGETS) + " |")
    trained = loaded.engine.trained_tree
    for name, paths in ([("trained tree", trained)] if trained else []) + [(k, v) for k, v in PRESETS.items()]:
        print(f"| static {name} ({len(paths) + 1} nodes) | {static(data, paths):.3f} |")


if __name__ == "__main__":
    main()
