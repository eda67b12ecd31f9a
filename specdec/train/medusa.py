"""Medusa-1 head training by self-distillation.

The backbone is frozen. Training text is the backbone's own continuation
of corpus prompts (Medusa's recommendation): heads then learn what the
target will actually say, which is what verification rewards. Head k
(0-based) reads the hidden state at t and predicts token t+k+2; its loss
is weighted 0.8**k. Several head variants can train side by side on the
same hidden states, so a choice between them is a measurement.
"""
from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import DynamicCache

from ..draft_tree import best_tree, expected_length
from ..heads import HeadsConfig, MedusaHeads, target_dims
from ..sampler import SamplingParams, filter_logits
from .corpus import iter_source_files, read_text

log = logging.getLogger("specdec.train")


def corpus_prompts(tokenizer, split: str, n: int, length: int, seed: int = 0, max_files: int = 20000) -> torch.Tensor:
    """n random windows of `length` tokens from the local Python corpus: [n, length] long.

    Works with any tokenizer, so heads can be trained for any model.
    """
    files = [f for f in iter_source_files() if f.split == split]
    rng = random.Random(seed)
    rng.shuffle(files)
    out: list[list[int]] = []
    for f in files[:max_files]:
        text = read_text(f)
        if not text:
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= length:
            continue
        for _ in range(min(4, max(1, len(ids) // (4 * length)))):
            s = rng.randrange(0, len(ids) - length)
            out.append(ids[s : s + length])
        if len(out) >= n:
            break
    if not out:
        raise ValueError(f"no corpus file in split {split!r} is longer than {length} tokens")
    while len(out) < n:  # tiny corpora (tests): reuse windows
        out.append(out[len(out) % max(1, len(out))])
    return torch.tensor(out[:n], dtype=torch.long)


@torch.no_grad()
def distill(model, prompts: torch.Tensor, gen_len: int, batch: int, greedy_frac: float = 0.75,
            temperature: float = 0.7, top_p: float = 0.95, seed: int = 0, device="cpu") -> torch.Tensor:
    """The backbone's own continuations: [n, prompt + gen_len] long, on the CPU.

    Most rows are greedy (what greedy verification checks against), the
    rest sampled with a typical sampler setting, so heads also see the
    kind of text lossless sampling produces.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    params = SamplingParams(temperature=temperature, top_p=top_p)
    rows = []
    n = prompts.shape[0]
    base, head = model.base_model, model.get_output_embeddings()
    for i in tqdm(range(0, n, batch), desc="distill"):
        x = prompts[i : i + batch].to(device)
        B = x.shape[0]
        greedy = torch.rand(B, generator=gen, device=device) < greedy_frac  # [B]
        cache = DynamicCache(config=model.config)
        h = base(input_ids=x, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        seq = [x]
        for _ in range(gen_len):
            logits = head(h).float()  # [B, V]
            g = logits.argmax(-1)
            s = torch.multinomial(torch.softmax(filter_logits(logits, params), -1), 1, generator=gen)[:, 0]
            tok = torch.where(greedy, g, s)[:, None]
            seq.append(tok)
            h = base(input_ids=tok, past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        rows.append(torch.cat(seq, 1).cpu())
    return torch.cat(rows)


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, seq: torch.Tensor, weight_decay_base: float = 0.8):
    """Weighted Medusa loss and per-head losses. hidden: [B, T, H], seq: [B, T]."""
    K = heads.config.num_heads
    total, parts = 0.0, []
    for k in range(K):
        shift = k + 2
        h = heads.blocks[k](hidden[:, :-shift])  # [B, T-shift, H]
        logits = heads.project(k, h).float()  # [B, T-shift, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, shift:].reshape(-1))
        total = total + (weight_decay_base ** k) * loss
        parts.append(float(loss.detach()))
    return total, parts


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, hidden: torch.Tensor, seq: torch.Tensor, ranks: int = 10) -> list[list[float]]:
    """acc[k][r]: fraction of positions where head k's rank-r guess is the true token t+k+2."""
    out = []
    for k in range(heads.config.num_heads):
        shift = k + 2
        logits = heads.project(k, heads.blocks[k](hidden[:, :-shift])).float()
        top = torch.topk(logits, ranks, dim=-1).indices  # [B, T-shift, R]
        hit = (top == seq[:, shift:, None]).float().reshape(-1, ranks).mean(0)  # [R]
        out.append(hit.tolist())
    return out


def train_heads(model, tokenizer, out_dir: str | Path, variants: dict[str, dict], *, num_seqs: int = 4096,
                prompt_len: int = 48, gen_len: int = 192, gen_batch: int = 256, batch: int = 32,
                lr: float = 1e-3, max_seconds: float = 120.0, max_steps: int = 0, valid_seqs: int = 256,
                tree_budgets=(15, 31, 63), device: str = "cpu", seed: int = 0, data_seconds: float = 0.0) -> dict:
    """Distil, train every head variant on the same hidden states, evaluate, save.

    Returns metrics per variant: per-head top-1/top-5 accuracy on held-out
    (validation-split) prompts, the accuracy table, and the best tree for
    each node budget with its expected accepted length.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    model = model.to(dev).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    hidden_size, vocab = target_dims(model)
    t0 = time.perf_counter()
    valid = distill(model, corpus_prompts(tokenizer, "valid", valid_seqs, prompt_len, seed + 1), gen_len,
                    gen_batch, greedy_frac=1.0, seed=seed + 1, device=dev)
    train = distill(model, corpus_prompts(tokenizer, "train", num_seqs, prompt_len, seed), gen_len, gen_batch,
                    seed=seed, device=dev)
    distill_s = time.perf_counter() - t0
    log.info("distilled %d train and %d valid sequences in %.0f s", len(train), len(valid), distill_s)
    name = getattr(model.config, "_name_or_path", None) or type(model).__name__
    heads = {k: MedusaHeads(HeadsConfig(hidden_size, vocab, base_model=name, **v), model.get_output_embeddings()).to(dev)
             for k, v in variants.items()}
    params = [p for h in heads.values() for p in h.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    rng = np.random.default_rng(seed)
    step, t_start = 0, time.perf_counter()
    base = model.base_model
    bar = tqdm(desc="heads", total=max_steps or None)

    def done() -> bool:
        if max_steps:
            return step >= max_steps
        return time.perf_counter() - t_start >= max_seconds

    est_total = max_steps or 10**9
    while not done():
        idx = torch.from_numpy(rng.integers(0, len(train), size=batch))
        seq = train[idx].to(dev)
        with torch.no_grad(), autocast:
            hidden = base(input_ids=seq).last_hidden_state
        hidden = hidden.float()
        frac = step / est_total if max_steps else (time.perf_counter() - t_start) / max_seconds
        for g in opt.param_groups:  # cosine decay after a short warm-up
            g["lr"] = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        loss = 0.0
        with autocast:
            for h in heads.values():
                l, _ = head_losses(h, hidden, seq)
                loss = loss + l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        bar.update(1)
        if step % 100 == 0:
            bar.set_postfix(loss=f"{float(loss):.3f}")
            log.info("heads step %d loss %.4f", step, float(loss))
    bar.close()
    train_s = time.perf_counter() - t_start
    metrics = {"distill_seconds": distill_s, "train_seconds": train_s, "steps": step,
               "train_sequences": len(train), "valid_sequences": len(valid), "prompt_len": prompt_len,
               "gen_len": gen_len, "variants": {}}
    for key, h in heads.items():
        h.eval()
        accs = []
        for i in range(0, len(valid), batch):
            seq = valid[i : i + batch].to(dev)
            with torch.no_grad(), autocast:
                hidden = base(input_ids=seq).last_hidden_state.float()
            # only the generated part: that is the text the target writes
            accs.append(np.array(head_accuracy(h, hidden[:, prompt_len - 1 :], seq[:, prompt_len - 1 :])))
        acc = np.mean(accs, axis=0).tolist()  # [K, R]
        trees = {}
        for b in tree_budgets:
            paths = best_tree(acc, b)
            trees[str(b + 1)] = {"paths": [list(p) for p in paths], "expected_length": expected_length(paths, acc)}
        metrics["variants"][key] = {
            "config": asdict(h.config), "acc": acc,
            "top1": [a[0] for a in acc], "top5": [sum(a[:5]) for a in acc], "trees": trees,
            "params": sum(p.numel() for p in h.parameters()),
        }
        d = out / key
        default_budget = str(tree_budgets[len(tree_budgets) // 2] + 1)
        h.save(d, [tuple(p) for p in trees[default_budget]["paths"]], dtype=torch.float16)
        log.info("variant %s top1 %s top5 %s", key, [round(a, 3) for a in metrics["variants"][key]["top1"]],
                 [round(a, 3) for a in metrics["variants"][key]["top5"]])
    (out / "heads_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


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
