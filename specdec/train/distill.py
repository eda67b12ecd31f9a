"""Self-distillation: the target's own continuations, in large left-padded batches, cached on disk.

Medusa's recommendation: heads learn what the target will actually say,
which is what verification rewards. Prompts (token lists of any length) are
generated in shards of `batch` rows with HF `generate`. Each finished shard
is written to the cache folder at once, so a cut run continues where it
stopped (`resume=True`) and retraining the heads with other settings skips
generation. Most shards are greedy (what greedy verification checks
against); the rest are sampled with a typical setting from specdec's
filtered law (temperature, top-p), so heads also see the kind of text lossless
sampling produces.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import Cache, DynamicLayer

from ..sampler import finite_logits

log = logging.getLogger("specdec.train")

CPU_BATCH = 128  # rows per generate call on a CPU: larger batches were not faster on 2 cores
MAX_CUDA_BATCH = 1024


@dataclass(frozen=True)
class DistillConfig:
    gen_len: int = 192  # new tokens per prompt (fewer when the target ends with EOS)
    batch: int = 0  # rows per shard and generate call; 0 = auto (CPU_BATCH, or the largest that fits on CUDA)
    greedy_frac: float = 0.75  # fraction of shards decoded greedily; the rest are sampled
    temperature: float = 0.7  # sampled shards
    top_p: float = 0.95  # sampled shards
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gen_len < 1:
            raise ValueError(f"`gen_len` must be >= 1, got {self.gen_len}")
        if self.batch < 0:
            raise ValueError(f"`batch` must be >= 0 (0 = auto), got {self.batch}")
        if not 0 <= self.greedy_frac <= 1:
            raise ValueError(f"`greedy_frac` must be in [0, 1], got {self.greedy_frac}")


@dataclass
class Distilled:
    """Ragged sequences (prompt + the target's continuation), stored flat.

    ids: all tokens, row after row; offsets[i]:offsets[i+1] is row i;
    prompt_lens[i] tokens of row i are prompt, the rest were generated.
    """

    ids: np.ndarray  # [total] int32
    offsets: np.ndarray  # [N + 1] int64
    prompt_lens: np.ndarray  # [N] int32

    def __len__(self) -> int:
        return len(self.prompt_lens)

    @property
    def generated_tokens(self) -> int:
        return int((np.diff(self.offsets) - self.prompt_lens).sum())

    def row(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def batch(self, idx, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows idx, right-padded: tokens [B, T] long and `generated` [B, T] bool (the distillation targets)."""
        rows = [self.row(int(i)) for i in idx]
        T = max(len(r) for r in rows)
        seq = torch.full((len(rows), T), pad_id, dtype=torch.long)
        gen = torch.zeros((len(rows), T), dtype=torch.bool)
        for b, (i, r) in enumerate(zip(idx, rows)):
            seq[b, : len(r)] = torch.from_numpy(r.astype(np.int64))
            gen[b, int(self.prompt_lens[int(i)]) : len(r)] = True
        return seq, gen

    @staticmethod
    def concat(parts: list["Distilled"]) -> "Distilled":
        ids = np.concatenate([p.ids for p in parts])
        lens = np.concatenate([np.diff(p.offsets) for p in parts])
        return Distilled(ids, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                         np.concatenate([p.prompt_lens for p in parts]))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, ids=self.ids, offsets=self.offsets, prompt_lens=self.prompt_lens)
        tmp.replace(path)  # a shard exists whole or not at all

    @staticmethod
    def load(path: Path) -> "Distilled":
        with np.load(path) as z:
            return Distilled(z["ids"], z["offsets"], z["prompt_lens"])


class NucleusSampler(LogitsProcessor):
    """Temperature + top-p sampling by rejection, with an explicit generator.

    The nucleus (Holtzman et al.) keeps a token when the tokens more likely
    than it hold less than top_p of the mass: the rule of
    `specdec.sampler.filter_logits`. A draw from the temperature law p that
    is redrawn until it lands in the nucleus follows the filtered law
    exactly, and it lands there with probability >= top_p, so a row needs
    about 1/top_p draws of O(V) each. The filter sorts the vocabulary when a
    law is flat (an untrained model's always is), which cost 4x the rest of
    a CPU decoding step. The returned logits are -inf everywhere but the
    drawn token, so HF's greedy step takes it.
    """

    MAX_DRAWS = 64  # a row still outside after this many draws (odds < (1 - top_p)**64) takes its argmax

    def __init__(self, temperature: float, top_p: float, generator: torch.Generator) -> None:
        if not temperature > 0:
            raise ValueError(f"`temperature` must be > 0 for sampled shards, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1], got {top_p}")
        self.temperature, self.top_p, self.generator = temperature, top_p, generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # scores [B, V]
        x = finite_logits(scores.float())
        p = torch.softmax((x - x.amax(-1, keepdim=True)) / self.temperature, -1)  # [B, V]
        cdf = p.cumsum(-1)  # [B, V]
        tok = p.argmax(-1)  # [B]
        todo = torch.arange(p.shape[0], device=p.device)
        for i in range(self.MAX_DRAWS):
            pr, cr = (p, cdf) if i == 0 else (p[todo], cdf[todo])  # [b, V]: every row first, then the redraws
            u = torch.rand((len(todo), 1), generator=self.generator, device=p.device)
            t = torch.searchsorted(cr, u * cr[:, -1:]).clamp_(max=p.shape[-1] - 1)  # [b, 1]
            before = torch.where(pr > pr.gather(1, t), pr, 0.0).sum(-1)  # [b]: mass of the more likely tokens
            ok = before < self.top_p
            tok[todo[ok]] = t[ok, 0]
            todo = todo[~ok]
            if len(todo) == 0:
                break
        return torch.full_like(scores, float("-inf")).scatter_(1, tok[:, None], 0.0)


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values live in a buffer reserved for the whole generation.

    HF's DynamicLayer concatenates every step, copying the whole cache: a
    third of a small model's CPU decoding step at these batch sizes. Here a
    step writes its new entries in place and hands attention a view of the
    filled part. Only what `generate` does with greedy or sampled decoding
    is supported (no crop, no beam reordering).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        shape = (*key_states.shape[:-2], self.capacity, key_states.shape[-1])  # [B, kv_heads, capacity, head_dim]
        self._k = key_states.new_empty(shape)
        self._v = value_states.new_empty((*shape[:-1], value_states.shape[-1]))
        self._n = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self._n, key_states.shape[-2]
        assert n + add <= self.capacity, f"reserved KV buffer of {self.capacity} overflows at {n + add}"
        self._k[..., n : n + add, :] = key_states
        self._v[..., n : n + add, :] = value_states
        self._n = n + add
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("ReservedLayer is for plain generation only")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("ReservedLayer is for plain generation only")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("ReservedLayer is for plain generation only")


def reserved_cache(model, capacity: int):
    """A cache of ReservedLayers for full-attention decoder models; None (HF's default cache) for anything else."""
    types = getattr(model.config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        return None  # sliding windows and linear attention keep HF's own layers
    return Cache(layers=[ReservedLayer(capacity) for _ in range(model.config.num_hidden_layers)])


def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a reply: the generation config's (chat models list end-of-turn there), else the tokenizer's."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def pad_id(tokenizer, eos: list[int]) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else (eos[0] if eos else 0)


def generate_shard(model, prompts: list[list[int]], cfg: DistillConfig, greedy: bool, eos: list[int], pad: int,
                   generator: torch.Generator | None) -> Distilled:
    """One generate call over left-padded prompts; each row keeps its continuation up to and including EOS."""
    dev = next(model.parameters()).device
    L = max(len(p) for p in prompts)
    x = torch.full((len(prompts), L), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for b, p in enumerate(prompts):
        x[b, L - len(p) :] = torch.tensor(p)
        mask[b, L - len(p) :] = 1
    gc = GenerationConfig(max_new_tokens=cfg.gen_len, do_sample=False, pad_token_id=pad,
                          eos_token_id=eos or None, bos_token_id=None)
    procs = LogitsProcessorList()
    if not greedy:
        procs.append(NucleusSampler(cfg.temperature, cfg.top_p, generator))
    cache = reserved_cache(model, L + cfg.gen_len)
    with torch.inference_mode():
        out = model.generate(x.to(dev), attention_mask=mask.to(dev), generation_config=gc, logits_processor=procs,
                             **({"past_key_values": cache} if cache is not None else {}))
    new = out[:, L:].cpu()  # [B, <= gen_len]
    rows, prompt_lens = [], []
    for b, p in enumerate(prompts):
        g = new[b].tolist()
        end = next((i + 1 for i, t in enumerate(g) if t in eos), len(g))
        rows.append(np.asarray(p + g[:end], dtype=np.int32))
        prompt_lens.append(len(p))
    lens = [len(r) for r in rows]
    return Distilled(np.concatenate(rows), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                     np.asarray(prompt_lens, dtype=np.int32))


def fingerprint(model, prompts: list[list[int]], cfg: DistillConfig) -> dict:
    """What the cached data depends on: the model (config and a weight sample), the prompts, the decoding."""
    h = hashlib.sha1()
    for p in prompts:
        h.update(np.asarray(p, dtype=np.int64).tobytes())
        h.update(b"|")
    emb = model.get_input_embeddings().weight
    w = hashlib.sha1(emb[:8].detach().float().cpu().numpy().tobytes()).hexdigest()[:16]
    c = hashlib.sha1(model.config.to_json_string(use_diff=False).encode()).hexdigest()[:16]
    d = {k: v for k, v in asdict(cfg).items() if k != "batch"}  # the batch only sets the shard size
    return {"model_config": c, "model_weights": w, "prompts": h.hexdigest()[:16], "rows": len(prompts), **d}


def auto_batch(model, max_len: int, rows: int) -> int:
    """CPU_BATCH on a CPU; on CUDA the most rows whose KV cache and logits fit in half the free memory."""
    dev = next(model.parameters()).device
    if dev.type != "cuda":
        return max(1, min(CPU_BATCH, rows))
    c = model.config
    layers = getattr(c, "num_hidden_layers", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or getattr(c, "num_attention_heads", 1)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    item = next(model.parameters()).element_size()
    per_row = 2 * layers * kv_heads * head_dim * item * max_len + 3 * 4 * c.vocab_size + 8 * c.hidden_size * max_len
    free, _ = torch.cuda.mem_get_info(dev)
    return max(1, min(MAX_CUDA_BATCH, rows, int(0.5 * free / per_row)))


def shard_is_greedy(i: int, greedy_frac: float) -> bool:
    """Shards 0, 1, 2, ... alternate so that a `greedy_frac` share of any prefix is greedy."""
    s = 1.0 - greedy_frac
    return math.floor((i + 1) * s + 1e-9) == math.floor(i * s + 1e-9)


def distill(model, prompts: list[list[int]], cfg: DistillConfig, cache_dir: str | Path, eos: list[int], pad: int,
            resume: bool = False, desc: str = "distill") -> Distilled:
    """The target's continuations of `prompts`, cached shard by shard in `cache_dir`.

    A row ends at its first token in `eos` (kept) or after cfg.gen_len new
    tokens; `pad` fills the left of shorter prompts (use `eos_ids`, `pad_id`).

    A complete cache made from the same model, prompts and decoding settings
    is loaded without generating. A partial one is continued with
    `resume=True` and refused otherwise; a cache of other settings is refused.
    """
    if not prompts:
        raise ValueError("no prompts to distil")
    model.eval()
    cache = Path(cache_dir)
    fp = {**fingerprint(model, prompts, cfg), "eos": sorted(eos)}
    meta_path = cache / "meta.json"
    shard_size = None
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta["fingerprint"] != fp:
            diff = sorted(k for k in fp if meta["fingerprint"].get(k) != fp[k])
            raise ValueError(f"distillation cache {str(cache)!r} was made with other settings (differ: {diff}); "
                             "use another --cache folder or delete it")
        shard_size = meta["shard_size"]
    n_shards_if = (lambda s: (len(prompts) + s - 1) // s)
    if shard_size is not None:
        have = [i for i in range(n_shards_if(shard_size)) if (cache / f"shard-{i:05d}.npz").is_file()]
        if len(have) < n_shards_if(shard_size) and not resume:
            raise ValueError(f"distillation cache {str(cache)!r} holds {len(have)} of {n_shards_if(shard_size)} "
                             "shards of a cut run: pass --resume to continue it, or delete the folder")
    else:
        shard_size = cfg.batch or auto_batch(model, max(len(p) for p in prompts) + cfg.gen_len, len(prompts))
        cache.mkdir(parents=True, exist_ok=True)
        meta_path.write_text(json.dumps({"fingerprint": fp, "shard_size": shard_size}, indent=2) + "\n")
    return _run_shards(model, prompts, cfg, cache, shard_size, n_shards_if(shard_size), eos, pad, desc)


def _run_shards(model, prompts, cfg, cache: Path, shard_size: int, n_shards: int, eos: list[int], pad: int,
                desc: str) -> Distilled:
    dev = next(model.parameters()).device
    parts: list[Distilled] = []
    bar = tqdm(total=len(prompts), desc=desc, unit="seq", dynamic_ncols=True)
    new_tokens, t0, reused = 0, time.perf_counter(), 0
    for i in range(n_shards):
        path = cache / f"shard-{i:05d}.npz"
        rows = prompts[i * shard_size : (i + 1) * shard_size]
        if path.is_file():
            parts.append(Distilled.load(path))
            reused += 1
        else:
            greedy = shard_is_greedy(i, cfg.greedy_frac)
            gen = None if greedy else torch.Generator(device=dev).manual_seed(cfg.seed * 1_000_003 + i)
            part = _generate_fitting(model, rows, cfg, greedy, eos, pad, gen)
            part.save(path)
            parts.append(part)
            new_tokens += part.generated_tokens
            dt = time.perf_counter() - t0
            bar.set_postfix_str(f"{new_tokens / dt:,.0f} tok/s")
        bar.update(len(rows))
    bar.close()
    if reused:
        log.info("%s: %d of %d shards loaded from %s", desc, reused, n_shards, cache)
    return Distilled.concat(parts)


def _generate_fitting(model, rows, cfg, greedy, eos, pad, gen) -> Distilled:
    """generate_shard, split in halves on CUDA out-of-memory (same rows, same order)."""
    try:
        return generate_shard(model, rows, cfg, greedy, eos, pad, gen)
    except torch.cuda.OutOfMemoryError:
        if len(rows) == 1:
            raise
        torch.cuda.empty_cache()
        log.warning("out of memory at %d rows: splitting the shard", len(rows))
        h = len(rows) // 2
        return Distilled.concat([_generate_fitting(model, rows[:h], cfg, greedy, eos, pad, gen),
                                 _generate_fitting(model, rows[h:], cfg, greedy, eos, pad, gen)])
