"""Train the small Llama backbone on the Python corpus.

Plain next-token training with AdamW, warm-up then cosine decay. The
schedule runs on a token budget or a wall-clock budget (whichever is
given), so the same command fits a 5-minute GPU lease or a night on a CPU.
It logs to a file, checkpoints every few minutes and resumes from the
last checkpoint.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from .data import load_tokens

log = logging.getLogger("specdec.train")


@dataclass
class LMConfig:
    hidden_size: int = 256  # small: a CPU forward must stay cheap next to speculation's gain
    num_layers: int = 8
    num_heads: int = 4  # head dim 64
    intermediate_size: int = 768  # 3x hidden (SwiGLU)
    context: int = 1024
    seq_len: int = 1024  # training window = the full context, so late positions are trained too
    batch_size: int = 64
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 300
    weight_decay: float = 0.1
    max_tokens: int = 0  # token budget; 0 = use max_seconds
    max_seconds: float = 0.0  # wall-clock budget for the schedule
    eval_batches: int = 40
    checkpoint_seconds: float = 300.0
    seed: int = 0


def llama_config(cfg: LMConfig, vocab_size: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.context, tie_word_embeddings=True,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )


def batches(tokens: np.ndarray, batch: int, seq: int, gen: np.random.Generator, device) -> torch.Tensor:
    """Random windows of seq+1 tokens: [B, seq+1] long."""
    starts = gen.integers(0, len(tokens) - seq - 1, size=batch)
    x = np.stack([np.asarray(tokens[s : s + seq + 1], dtype=np.int64) for s in starts])
    return torch.from_numpy(x).to(device, non_blocking=True)


def lr_at(progress: float, step: int, cfg: LMConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate(model, tokens: np.ndarray, cfg: LMConfig, device, autocast) -> float:
    """Mean validation loss (nats/token) over fixed, seeded windows."""
    model.eval()
    gen = np.random.default_rng(1234)
    losses = []
    for _ in range(cfg.eval_batches):
        x = batches(tokens, cfg.batch_size, cfg.seq_len, gen, device)
        losses.append(float(_loss(model, x, autocast)))
    model.train()
    return float(np.mean(losses))


def _loss(model, x, autocast):
    with autocast:
        logits = model(input_ids=x[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


def train_lm(data_dir: str | Path, tokenizer, out_dir: str | Path, cfg: LMConfig, device: str = "cpu",
             resume: bool = True) -> dict:
    """Train (or resume) and save the final model in fp16 safetensors, sharded at 15 MB."""
    out = Path(out_dir)
    ckpt_dir = out / "checkpoint"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    dev = torch.device(device)
    train_tok, valid_tok = load_tokens(data_dir, "train"), load_tokens(data_dir, "valid")
    model = LlamaForCausalLM(llama_config(cfg, len(tokenizer), tokenizer.eos_token_id)).to(dev)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95),
                            fused=dev.type == "cuda")
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    step, tokens_seen, elapsed = 0, 0, 0.0
    if resume and (ckpt_dir / "state.pt").is_file():
        state = torch.load(ckpt_dir / "state.pt", map_location=dev, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, tokens_seen, elapsed = state["step"], state["tokens"], state["elapsed"]
        log.info("resumed from step %d (%d tokens, %.0f s)", step, tokens_seen, elapsed)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model: %.2fM parameters; train %d tokens, valid %d tokens", n_params / 1e6, len(train_tok), len(valid_tok))
    rng = np.random.default_rng(cfg.seed + step)
    per_step = cfg.batch_size * cfg.seq_len
    if not cfg.max_tokens and not cfg.max_seconds:
        raise ValueError("give a budget: max_tokens > 0 or max_seconds > 0")

    def progress() -> float:
        if cfg.max_tokens:
            return tokens_seen / cfg.max_tokens
        return elapsed / cfg.max_seconds

    bar = tqdm(total=1000, desc="lm", unit="‰")
    bar.update(int(progress() * 1000))
    t_last, t_ckpt = time.perf_counter(), time.perf_counter()
    while progress() < 1.0:
        lr = lr_at(progress(), step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batches(train_tok, cfg.batch_size, cfg.seq_len, rng, dev)
        loss = _loss(model, x, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += per_step
        now = time.perf_counter()
        elapsed += now - t_last
        t_last = now
        done = int(progress() * 1000) - bar.n
        if done > 0:
            bar.update(done)
        if step % 50 == 0:
            l = float(loss)
            bar.set_postfix(loss=f"{l:.3f}", lr=f"{lr:.1e}")
            log.info("step %d tokens %d elapsed %.0fs loss %.4f lr %.2e tok/s %.0f", step, tokens_seen, elapsed, l,
                     lr, tokens_seen / max(elapsed, 1e-9))
        if now - t_ckpt > cfg.checkpoint_seconds:
            _checkpoint(ckpt_dir, model, opt, step, tokens_seen, elapsed)
            t_ckpt = time.perf_counter()
            t_last = t_ckpt
    bar.close()
    _checkpoint(ckpt_dir, model, opt, step, tokens_seen, elapsed)
    val = evaluate(model, valid_tok, cfg, dev, autocast)
    metrics = {"steps": step, "tokens": tokens_seen, "train_seconds": elapsed, "params": n_params,
               "valid_loss": val, "valid_ppl": math.exp(val), "tokens_per_second": tokens_seen / max(elapsed, 1e-9),
               "config": asdict(cfg), "device": str(dev),
               "hardware": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    log.info("done: %s", json.dumps({k: v for k, v in metrics.items() if k != "config"}))
    save_model(model, tokenizer, out / "model")
    (out / "lm_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _checkpoint(d: Path, model, opt, step, tokens, elapsed) -> None:
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "state.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                "elapsed": elapsed}, tmp)
    tmp.replace(d / "state.pt")


def save_model(model, tokenizer, d: Path) -> None:
    """fp16 safetensors in shards of at most 15 MB, plus tokenizer and generation config."""
    m = LlamaForCausalLM(model.config)
    m.load_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    eos = tokenizer.eos_token_id
    m.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    m.to(torch.float16).save_pretrained(str(d), max_shard_size="15MB")
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(str(d))
