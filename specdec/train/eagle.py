"""EAGLE-3 drafter training on self-distilled data, with EAGLE-3's training-time test.

The target is frozen. Each batch runs it once over the distilled sequences for the three tapped hidden
states and its own next-token laws. The drafter then runs `steps` times over the whole batch:

- step 0 reads the target's fused states g_t with the token x_{t+1}, as the committed context does at
  inference;
- step j >= 1 reads, at position t, its own step j-1 output at t-1 in place of g_t, and attends to the
  real context up to t-j plus its own entries of steps 1..j along the diagonal: exactly what a depth-j
  node of an inference tree sees (the committed positions, its ancestors, itself).

Every step at position t predicts x_{t+2}, against the target's law there (soft labels, restricted to
the draft vocabulary), where x_{t+2} is a generated token; step j weighs 0.8**j.
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..eagle import Eagle3, EagleConfig, Shape, default_layers
from ..eagle_io import save_eagle
from .distill import eos_ids, frozen_and_distilled, pad_id

log = logging.getLogger("specdec.train")
STEP_DECAY = 0.8


def drafter_for(model, draft_vocab: int, counts: np.ndarray | None = None) -> Eagle3:
    """A fresh drafter shaped like one layer of `model`, over the `draft_vocab` most frequent target ids
    (by `counts`; all of them when draft_vocab >= the vocabulary)."""
    cfg = model.config
    V, H = int(cfg.vocab_size), int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    rope = getattr(cfg, "rope_parameters", None) or {}
    ec = EagleConfig(hidden_size=H, num_attention_heads=heads,
                     num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
                     head_dim=int(getattr(cfg, "head_dim", None) or H // heads),
                     intermediate_size=int(getattr(cfg, "intermediate_size", None) or 4 * H),
                     vocab_size=V, draft_vocab_size=min(draft_vocab, V),
                     layers=default_layers(int(cfg.num_hidden_layers)),
                     rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
                     rope_theta=float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))),
                     max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048) or 2048),
                     base_model=getattr(cfg, "_name_or_path", None) or type(model).__name__,
                     target_layers=int(cfg.num_hidden_layers))
    d = Eagle3(ec, model.get_input_embeddings())
    ids = torch.arange(V)
    if ec.draft_vocab_size < V:
        order = np.argsort(-(counts if counts is not None else np.zeros(V)), kind="stable")[: ec.draft_vocab_size]
        ids = torch.tensor(np.sort(order), dtype=torch.long)
        d.d2t.copy_(ids - torch.arange(len(ids)))
        d.t2d.zero_()
        d.t2d[ids] = True
    with torch.no_grad():  # start from the target's own output projection over the draft vocabulary
        d.lm_head.weight.copy_(model.get_output_embeddings().weight[ids].float())
        torch.nn.init.normal_(d.fc.weight, std=0.02)
    return d


def target_pass(model, taps, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target over [B, T]: its tapped states [B, T, 3H] and logits [B, T, V]."""
    out = model.model(input_ids=seq, output_hidden_states=True) if hasattr(model, "model") else \
        model.base_model(input_ids=seq, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in taps], -1)
    return feats, model.get_output_embeddings()(out.last_hidden_state)


def unrolled(d: Eagle3, feats: torch.Tensor, seq: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The training-time test: draft logits [B, T, Vd] of steps 0..steps-1 (position t predicts x_{t+2})."""
    B, T = seq.shape
    layer, attn = d.midlayer, d.midlayer.self_attn
    nh, nkv, hd = attn.heads, attn.kv_heads, attn.head_dim
    nxt = torch.cat([seq[:, 1:], seq[:, -1:]], 1)  # x_{t+1} at t (the last one is never a target)
    emb = layer.input_layernorm(d.embed_tokens(nxt).to(d.fc.weight.dtype))
    pos = torch.arange(T, device=seq.device)
    cos, sin = d.rotary(emb, pos[None].expand(B, T))  # [B, T, hd]
    cos, sin = cos[:, None], sin[:, None]

    def rope(x):
        a, b = x.chunk(2, -1)
        return x * cos + torch.cat([-b, a], -1) * sin

    g = d.fuse(feats)
    keys, values, logits = [], [], []
    causal = torch.ones(T, T, dtype=torch.bool, device=seq.device).tril()
    for j in range(steps):
        if j:  # the previous step's output at t-1 stands in for the target's state at t
            g = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
        x = torch.cat([emb, layer.hidden_norm(g)], -1)
        q = rope(attn.q_proj(x).view(B, T, nh, hd).transpose(1, 2))  # [B, nh, T, hd]
        k = rope(attn.k_proj(x).view(B, T, nkv, hd).transpose(1, 2)).repeat_interleave(nh // nkv, 1)
        v = attn.v_proj(x).view(B, T, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, 1)
        keys.append(k)
        values.append(v)
        scale = 1.0 / math.sqrt(hd)
        s0 = (q @ keys[0].transpose(-1, -2)) * scale  # [B, nh, T, T]: the real context, up to t - j
        s0 = s0.masked_fill(~causal.tril(-j) if j else ~causal, float("-inf"))
        diag, vs = [], []
        for i in range(1, j + 1):  # step i's entry of this node's own path: position t - (j - i)
            shift = j - i
            ki = F.pad(keys[i], (0, 0, shift, 0))[:, :, :T] if shift else keys[i]
            vi = F.pad(values[i], (0, 0, shift, 0))[:, :, :T] if shift else values[i]
            diag.append((q * ki).sum(-1, keepdim=True) * scale)  # [B, nh, T, 1]
            vs.append(vi)
        scores = torch.cat([s0] + diag, -1)  # positions t < j (no real context) are never in the loss
        p = torch.softmax(scores.float(), -1).to(q.dtype)
        o = p[..., :T] @ values[0]
        for i, vi in enumerate(vs):
            o = o + p[..., T + i : T + i + 1] * vi
        h = g + attn.o_proj(o.transpose(1, 2).reshape(B, T, nh * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits.append(d.lm_head(d.norm(h)).float())
    return logits


def eagle_loss(d: Eagle3, logits: list[torch.Tensor], target_logits: torch.Tensor, gen: torch.Tensor,
               ids: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Soft cross-entropy of each step against the target's law for x_{t+2} (its logits at t+1), over the
    draft vocabulary `ids`, at positions whose x_{t+2} was generated and whose step has a real path."""
    B, T = gen.shape
    law = torch.softmax(target_logits[:, 1:, :].float()[..., ids], -1)  # [B, T-1, Vd]: position t+1's law
    total, parts = 0.0, []
    for j, lg in enumerate(logits):
        keep = gen[:, 2:].clone()  # [B, T-2] position t < T-2 predicts x_{t+2}
        keep[:, :j] = False  # step j needs positions t >= j
        if not bool(keep.any()):
            parts.append(float("nan"))
            continue
        lp = torch.log_softmax(lg[:, : T - 2], -1)[keep]  # [M, Vd]
        loss = -(law[:, : T - 2][keep] * lp).sum(-1).mean()
        total = total + STEP_DECAY ** j * loss
        parts.append(float(loss.detach()))
    return total, parts


@torch.no_grad()
def step_accuracy(logits: list[torch.Tensor], seq: torch.Tensor, gen: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    """Hits and counts [steps, 2] of each step's top-1 guess against the token actually there."""
    T = seq.shape[1]
    out = np.zeros((len(logits), 2))
    for j, lg in enumerate(logits):
        keep = gen[:, 2:].clone()
        keep[:, :j] = False
        guess = ids[lg[:, : T - 2].argmax(-1)]
        out[j] = [float((guess == seq[:, 2:])[keep].sum()), float(keep.sum())]
    return out


def train_eagle(model, tokenizer, out_dir: str | Path, *, num_seqs: int = 1536, prompt_len: int = 32,
                gen_len: int = 128, gen_batch: int = 0, batch: int = 8, lr: float = 2e-3, steps: int = 4,
                max_seconds: float = 600.0, max_steps: int = 0, valid_seqs: int = 128, draft_vocab: int = 32000,
                device: str = "cpu", seed: int = 0, train_prompts=None, valid_prompts=None, cache_dir=None,
                resume: bool = False, greedy_frac: float = 0.75, shape: Shape | None = None) -> dict:
    """Distil (or reuse the cached distillation), train an EAGLE-3 drafter, evaluate it, save it to out_dir/eagle3."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    model, train, valid, cache, distill_s = frozen_and_distilled(
        model, tokenizer, out, device, train_prompts=train_prompts, valid_prompts=valid_prompts, num_seqs=num_seqs,
        valid_seqs=valid_seqs, prompt_len=prompt_len, gen_len=gen_len, gen_batch=gen_batch, greedy_frac=greedy_frac,
        seed=seed, cache_dir=cache_dir, resume=resume)
    pad = pad_id(tokenizer, eos_ids(model, tokenizer))
    V = int(model.config.vocab_size)
    counts = np.bincount(np.concatenate([train.row(i) for i in range(len(train))]), minlength=V)[:V]
    d = drafter_for(model, draft_vocab, counts).to(dev, torch.float32)
    covered = float(counts[d.t2d.cpu().numpy()].sum() / max(counts.sum(), 1))
    log.info("draft vocabulary: %d of %d ids, %.2f%% of the distilled tokens", d.config.draft_vocab_size, V,
             100 * covered)
    d.train()
    ids = (torch.arange(d.config.draft_vocab_size, device=dev) + d.d2t.to(dev))
    taps = d.config.layers
    opt = torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    rng = np.random.default_rng(seed)
    step, t_start, smooth, first = 0, time.perf_counter(), None, None
    bar = tqdm(desc="eagle3", total=max_steps or max_seconds, unit="step" if max_steps else "s",
               bar_format=None if max_steps else "{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]")
    shown = 0.0

    def done() -> bool:
        return step >= max_steps if max_steps else time.perf_counter() - t_start >= max_seconds

    while not done():
        seq, gen = train.batch(rng.integers(0, len(train), size=batch), pad)
        seq, gen = seq.to(dev), gen.to(dev)
        with torch.no_grad(), autocast:
            feats, tlogits = target_pass(model, taps, seq)
        frac = step / max_steps if max_steps else (time.perf_counter() - t_start) / max_seconds
        for g in opt.param_groups:  # cosine decay after a short warm-up
            g["lr"] = lr * min(1.0, (step + 1) / 50) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        with autocast:
            loss, parts = eagle_loss(d, unrolled(d, feats.float(), seq, steps), tlogits, gen, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(d.parameters(), 1.0)
        opt.step()
        step += 1
        value = float(loss.detach())
        first = value if smooth is None else first
        smooth = value if smooth is None else 0.95 * smooth + 0.05 * value
        bar.set_postfix(step=step, loss=f"{smooth:.3f}", refresh=False)
        if step in (1, 10) or step % 100 == 0:
            log.info("eagle3 step %d loss %.4f steps %s", step, value, [round(x, 3) for x in parts])
        if max_steps:
            bar.update(1)
        else:
            now = min(time.perf_counter() - t_start, max_seconds)
            bar.update(now - shown)
            shown = now
    bar.close()
    train_s = time.perf_counter() - t_start
    d.eval()
    hits = np.zeros((steps, 2))
    with torch.no_grad(), autocast:
        for i in range(0, len(valid), batch):
            seq, gen = valid.batch(range(i, min(i + batch, len(valid))), pad)
            seq, gen = seq.to(dev), gen.to(dev)
            feats, _ = target_pass(model, taps, seq)
            hits += step_accuracy(unrolled(d, feats.float(), seq, steps), seq, gen, ids)
    acc = (hits[:, 0] / np.maximum(hits[:, 1], 1)).tolist()
    metrics = {"distill_seconds": distill_s, "train_seconds": train_s, "steps": step, "unrolled_steps": steps,
               "train_sequences": len(train), "valid_sequences": len(valid), "prompt_len": prompt_len,
               "gen_len": gen_len, "draft_vocab_size": d.config.draft_vocab_size, "layers": list(taps),
               "top1_by_step": acc, "draft_vocab_coverage": covered, "loss_first_step": first, "loss_smoothed_end": smooth, "params": sum(p.numel() for p in d.parameters()),
               "distill_cache": str(cache)}
    log.info("eagle3 held-out top-1 by step %s", [round(a, 3) for a in acc])
    save_eagle(d, out / "eagle3", shape or Shape(), dtype=torch.float16)
    (out / "eagle3_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


__all__ = ["train_eagle", "unrolled", "eagle_loss", "drafter_for", "target_pass"]
