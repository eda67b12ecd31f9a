"""Medusa-1 head training on self-distilled data.

The backbone is frozen. Training text is the backbone's own continuation
of prompts (`distill.py`): heads then learn what the target will actually
say, which is what verification rewards, and only the generated tokens are
targets. Head k (0-based) reads the hidden state at t and predicts token
t+k+2; its loss is weighted 0.8**k. Several head variants can train side
by side on the same hidden states, so a choice between them is a measurement.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..draft_tree import best_tree, expected_length
from ..heads import HeadsConfig, MedusaHeads, target_dims
from .distill import eos_ids, frozen_and_distilled, pad_id
from .prompts import corpus_prompts

__all__ = ["corpus_prompts", "train_heads", "head_losses", "head_accuracy", "measure_tau", "choose_tree"]

log = logging.getLogger("specdec.train")


def _targets(hidden: torch.Tensor, seq: torch.Tensor, gen: torch.Tensor, shift: int):
    """Hidden states [M, H] and targets [M] at the positions whose token t+shift was generated."""
    keep = gen[:, shift:]  # [B, T-shift]
    return hidden[:, :-shift][keep], seq[:, shift:][keep]


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, seq: torch.Tensor, gen: torch.Tensor,
                weight_decay_base: float = 0.8):
    """Weighted Medusa loss and per-head losses. hidden: [B, T, H], seq and gen (targets): [B, T]."""
    total, parts = 0.0, []
    for k in range(heads.config.num_heads):
        h, y = _targets(hidden, seq, gen, k + 2)  # [M, H], [M]
        if y.numel() == 0:
            parts.append(float("nan"))
            continue
        logits = heads.head(k, h).float()  # [M, V]
        loss = torch.nn.functional.cross_entropy(logits, y)
        total = total + (weight_decay_base ** k) * loss
        parts.append(float(loss.detach()))
    return total, parts


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, hidden: torch.Tensor, seq: torch.Tensor, gen: torch.Tensor,
                  ranks: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Hits [K, R] (head k's rank-r guess is the true token t+k+2) and the positions counted [K]."""
    K = heads.config.num_heads
    hits, counts = np.zeros((K, ranks)), np.zeros(K)
    for k in range(K):
        h, y = _targets(hidden, seq, gen, k + 2)
        if y.numel() == 0:
            continue
        top = torch.topk(heads.head(k, h).float(), ranks, dim=-1).indices  # [M, R]
        hits[k] = (top == y[:, None]).float().sum(0).cpu().numpy()
        counts[k] = y.numel()
    return hits, counts


def train_heads(model, tokenizer, out_dir: str | Path, variants: dict[str, dict], *, num_seqs: int = 4096,
                prompt_len: int = 48, gen_len: int = 192, gen_batch: int = 0, batch: int = 32,
                lr: float = 1e-3, max_seconds: float = 120.0, max_steps: int = 0, valid_seqs: int = 256,
                tree_budgets=(15, 31, 63), device: str = "cpu", seed: int = 0,
                train_prompts: list[list[int]] | None = None, valid_prompts: list[list[int]] | None = None,
                cache_dir: str | Path | None = None, resume: bool = False, greedy_frac: float = 0.75) -> dict:
    """Distil (or load the cached distillation), train every head variant on the same hidden states, evaluate, save.

    Prompts default to `num_seqs` / `valid_seqs` windows of `prompt_len`
    tokens from the local Python corpus; pass token lists to use your own.
    The cache defaults to out_dir/distill. Returns metrics per variant:
    per-head top-1/top-5 accuracy on the held-out prompts' greedy
    continuations, the accuracy table, and the best tree for each node budget.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    model, train, valid, cache, distill_s = frozen_and_distilled(
        model, tokenizer, out, device, train_prompts=train_prompts, valid_prompts=valid_prompts, num_seqs=num_seqs,
        valid_seqs=valid_seqs, prompt_len=prompt_len, gen_len=gen_len, gen_batch=gen_batch, greedy_frac=greedy_frac,
        seed=seed, cache_dir=cache_dir, resume=resume)
    pad = pad_id(tokenizer, eos_ids(model, tokenizer))
    hidden_size, vocab = target_dims(model)
    distill_tokens = train.generated_now + valid.generated_now  # 0 when the cache had it all
    log.info("distilled %d train sequences (%d new tokens) and %d held-out in %.0f s", len(train),
             train.generated_tokens, len(valid), distill_s)
    name = getattr(model.config, "_name_or_path", None) or type(model).__name__
    heads = {k: MedusaHeads(HeadsConfig(hidden_size, vocab, base_model=name, **v), model.get_output_embeddings()
                            ).to(dev, torch.float32) for k, v in variants.items()}
    params = [p for h in heads.values() for p in h.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    rng = np.random.default_rng(seed)
    step, t_start = 0, time.perf_counter()
    base = model.base_model
    # Under a time budget the bar counts seconds, so its ETA is the budget's; the loss shows from step 1.
    bar = tqdm(desc="heads", total=max_steps or max_seconds, unit="step" if max_steps else "s",
               bar_format=None if max_steps else "{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]")
    shown, smooth = 0.0, None

    def done() -> bool:
        if max_steps:
            return step >= max_steps
        return time.perf_counter() - t_start >= max_seconds

    while not done():
        seq, gen = train.batch(rng.integers(0, len(train), size=batch), pad)
        seq, gen = seq.to(dev), gen.to(dev)
        with torch.no_grad(), autocast:
            hidden = base(input_ids=seq).last_hidden_state  # [B, T, H]; right padding: no mask needed
        hidden = hidden.float()
        frac = step / max_steps if max_steps else (time.perf_counter() - t_start) / max_seconds
        for g in opt.param_groups:  # cosine decay after a short warm-up
            g["lr"] = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        loss = 0.0
        with autocast:
            for h in heads.values():
                loss = loss + head_losses(h, hidden, seq, gen)[0]
        opt.zero_grad(set_to_none=True)
        if isinstance(loss, torch.Tensor):
            loss.backward()
            opt.step()
        step += 1
        if step <= 10 or step % 10 == 0:  # a read of the loss waits for the device: not every step on CUDA
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
            smooth = value if smooth is None else 0.8 * smooth + 0.2 * value
            bar.set_postfix(step=step, loss=f"{smooth:.3f}", refresh=False)
            if step in (1, 10) or step % 100 == 0:
                log.info("heads step %d loss %.4f", step, value)
        if max_steps:
            bar.update(1)
        else:
            now = min(time.perf_counter() - t_start, max_seconds)
            bar.update(now - shown)
            shown = now
    bar.close()
    train_s = time.perf_counter() - t_start
    metrics = {"distill_seconds": distill_s, "train_seconds": train_s, "steps": step,
               "steps_per_second": step / train_s if train_s > 0 else 0.0,
               "train_sequences": len(train), "valid_sequences": len(valid),
               "train_generated_tokens": train.generated_tokens, "distill_tokens": distill_tokens,
               "distill_tokens_per_second": distill_tokens / distill_s if distill_s > 0 else 0.0,
               "prompt_len": prompt_len,
               "gen_len": gen_len, "distill_cache": str(cache), "variants": {}}
    for key, h in heads.items():
        h.eval()
        hits, counts = 0.0, 0.0
        for i in range(0, len(valid), batch):
            seq, gen = valid.batch(range(i, min(i + batch, len(valid))), pad)
            seq, gen = seq.to(dev), gen.to(dev)
            with torch.no_grad(), autocast:
                hidden = base(input_ids=seq).last_hidden_state.float()
                hk, ck = head_accuracy(h, hidden, seq, gen)
            hits, counts = hits + hk, counts + ck
        acc = (hits / np.maximum(counts, 1)[:, None]).tolist()  # [K, R]
        trees = {}
        for b in tree_budgets:
            paths = best_tree(acc, b)
            trees[str(b + 1)] = {"paths": [list(p) for p in paths], "expected_length": expected_length(paths, acc)}
        metrics["variants"][key] = {
            "config": asdict(h.config), "acc": acc,
            "top1": [a[0] for a in acc], "top5": [sum(a[:5]) for a in acc], "trees": trees,
            "params": sum(p.numel() for p in h.parameters()), "eval_positions": counts.tolist(),
        }
        d = out / key
        default_budget = str(tree_budgets[len(tree_budgets) // 2] + 1)
        h.save(d, [tuple(p) for p in trees[default_budget]["paths"]], dtype=torch.float16)
        log.info("variant %s top1 %s top5 %s", key, [round(a, 3) for a in metrics["variants"][key]["top1"]],
                 [round(a, 3) for a in metrics["variants"][key]["top5"]])
    (out / "heads_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def measure_tau(model, tokenizer, heads_dir: str | Path, prompts: list[list[int]], new_tokens: int = 64,
                device: str = "cpu") -> dict:
    """Greedy mean accepted length (tokens per decoding forward, bonus included) of a saved drafter, Medusa heads or
    EAGLE-3, alone on its own tree (no lookup).

    Pooled over `prompts` (held-out): decoding-round tokens over decoding rounds.
    Also checks every output against plain greedy decoding.
    """
    from .. import api, generation

    loaded = api.load(model, str(heads_dir), device=device, tokenizer=tokenizer)
    tokens = rounds = same = 0
    for ids in prompts:
        res = generation.generate(loaded, prompt_ids=list(ids), max_new_tokens=new_tokens, lookup=0)
        plain = generation.generate(loaded, prompt_ids=list(ids), max_new_tokens=new_tokens, speculative=False)
        decode = [r for r in res.rounds if r.index > 0]
        tokens += sum(len(r.emitted) for r in decode)
        rounds += len(decode)
        same += res.token_ids == plain.token_ids
    return {"prompts": len(prompts), "new_tokens": new_tokens, "lookup": 0,
            "mean_accepted_length": tokens / rounds if rounds else float("nan"),
            "identical_to_greedy": same}


def forward_cost_ms(model, nodes: int, prefix: int = 128, repeats: int = 15) -> float:
    """Median wall time of one target forward of `nodes` tokens after a cached prefix."""
    from .. import kv_cache
    from ..target import TargetModel

    target = TargetModel(model)
    ids = torch.randint(0, target.vocab_size, (prefix,))
    times = []
    for _ in range(repeats):
        cache = kv_cache.new_cache(model)
        target.forward(ids, cache)
        mask = torch.tril(torch.ones(nodes, nodes, dtype=torch.bool))
        t = time.perf_counter()
        target.forward(torch.randint(0, target.vocab_size, (nodes,)), cache, mask, torch.arange(nodes))
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def choose_tree(acc: list[list[float]], model, budgets=(3, 7, 11, 15, 23, 31, 47, 63)) -> dict:
    """Pick the node budget with the best expected tokens per millisecond on this machine.

    For each budget, `best_tree` gives the tree with the highest expected
    accepted length E[L] (from measured head accuracies); we measure the
    target forward for that many nodes and rank by E[L] / cost.
    """
    rows = []
    for b in budgets:
        paths = best_tree(acc, b)
        e = expected_length(paths, acc)
        cost = forward_cost_ms(model, b + 1)
        rows.append({"nodes": b + 1, "expected_length": e, "forward_ms": cost, "tokens_per_ms": e / cost,
                     "paths": [list(p) for p in paths]})
    best = max(rows, key=lambda r: r["tokens_per_ms"])
    return {"chosen_nodes": best["nodes"], "candidates": rows}


def measure_trees(engine, rows: list[dict], prompts: list[list[int]], new_tokens: int, lookup: int,
                  repeats: int = 3) -> None:
    """Add each candidate's measured end-to-end greedy tokens/s to its row (in place).

    The E[L]-per-forward-ms model leaves out what a round costs besides the
    forward (the heads, verification, prompt-lookup rounds that skip the
    heads), so the final pick runs the engine itself: every candidate on the
    same held-out prompts, interleaved, median over repeats after a warm-up.
    """
    def run(paths) -> float:
        t = time.perf_counter()
        for ids in prompts:
            for _ in engine.stream(ids, new_tokens, tree=[tuple(p) for p in paths], lookup=lookup,
                                   eos_token_id=None):
                pass
        return len(prompts) * new_tokens / (time.perf_counter() - t)

    for r in rows:
        run(r["paths"])  # warm-up
    speeds: list[list[float]] = [[] for _ in rows]
    for rep in range(repeats):
        order = list(range(len(rows)))[rep % len(rows):] + list(range(len(rows)))[: rep % len(rows)]
        for i in order:
            speeds[i].append(run(rows[i]["paths"]))
    for r, s in zip(rows, speeds):
        r["measured_tok_s"] = float(np.median(s))
        r["measured_lookup"] = lookup
