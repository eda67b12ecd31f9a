"""Benchmark specdec against Hugging Face `generate`, side by side, in one process.

Every method decodes the same prompts on the same model, device and dtype.
The runs are interleaved (repeat -> prompt -> every method, in a rotating
order) so that machine noise hits all methods alike. Methods:

  hf_greedy, hf_sample            HF `model.generate`, greedy and sampling
  hf_prompt_lookup                HF assisted generation, `prompt_lookup_num_tokens`
  plain_greedy, plain_sample      our engine with speculative=False
  {chain,small,default,trained}_greedy   our engine, heads only, one draft tree each
  {default,trained}_sample        our engine, heads only, lossless sampling
  lookup_greedy                   our engine, prompt lookup alone (no heads)
  merge_greedy                    our engine, the heads' tree with the lookup chain merged in
  hybrid_greedy, hybrid_sample    our engine's default: lookup first, else the heads' tree

Figures, per method (definitions in BENCHMARKS.md):
  tok/s          new tokens / wall seconds over all prompts of one repeat; median over repeats
  speedup        median tok/s / median tok/s of hf_greedy (same run)
  tau            mean accepted length: tokens per target forward, bonus included,
                 first forward (prefill) excluded from both sums
  acc@d          rounds that accepted >= d drafts / rounds whose tree reached depth d
  ms/tok p50/p99 gap between consecutive emissions / tokens in the emission
  peak mem       CUDA max_memory_allocated, or CPU peak RSS (VmHWM), above the level before the call

Usage:
  python bench.py --quick                          # < 3 min on a 2-core CPU
  python bench.py --device cuda --dtype bfloat16
  python bench.py --model random:qwen2-0.5b --heads oracle:0.8 --device cuda --dtype bfloat16
  python bench.py --profile                        # round-loop breakdown + cProfile
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import math
import os
import platform
import pstats
import re
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

import specdec
from specdec.api import DEFAULT_MODEL, resolve_dtype
from specdec.heads import HeadsConfig, MedusaHeads
from specdec.lookup import DEFAULT_LOOKUP, MAX_LOOKUP

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

STAGES = ("draft", "forward", "verify", "cache", "event", "other")  # "other": inside the round, untimed by the engine


@dataclass(frozen=True)
class Method:
    id: str
    label: str
    backend: str  # "hf" or "engine"
    sampling: bool  # False: greedy
    tree: str | None = None  # engine tree preset; None: speculative=False
    prompt_lookup: bool = False  # HF assisted generation with the n-gram drafter
    lookup: bool = False  # engine: draft with prompt lookup (`--lookup` tokens, as HF's prompt lookup gets)
    lookup_mode: str = "first"


ALL_METHODS = (
    Method("hf_greedy", "HF generate greedy", "hf", False),
    Method("hf_sample", "HF generate sampling", "hf", True),
    Method("hf_prompt_lookup", "HF prompt lookup (greedy)", "hf", False, prompt_lookup=True),
    Method("plain_greedy", "specdec speculative=False greedy", "engine", False),
    Method("plain_sample", "specdec speculative=False sampling", "engine", True),
    Method("chain_greedy", "specdec chain greedy", "engine", False, "chain"),
    Method("small_greedy", "specdec small tree greedy", "engine", False, "small"),
    Method("default_greedy", "specdec default tree greedy", "engine", False, "default"),
    Method("trained_greedy", "specdec trained tree (auto) greedy", "engine", False, "trained"),
    Method("default_sample", "specdec default tree lossless sampling", "engine", True, "default"),
    Method("trained_sample", "specdec trained tree (auto) lossless sampling", "engine", True, "trained"),
    Method("lookup_greedy", "specdec prompt lookup alone (no heads), greedy", "engine", False, "none", lookup=True),
    Method("merge_greedy", "specdec heads' tree with the lookup chain merged in, greedy", "engine", False, "auto",
           lookup=True, lookup_mode="merge"),
    Method("hybrid_greedy", "specdec default: lookup first, else the heads' tree; greedy", "engine", False, "auto",
           lookup=True),
    Method("hybrid_sample", "specdec default: lookup first, else the heads' tree; lossless sampling", "engine", True,
           "auto", lookup=True),
)

# Issue 5's targets: (name, numerator method, denominator method, minimum ratio).
# The first four measure specdec's default drafting (what `specdec.generate` does with no
# arguments); the last four the heads alone on the 64-node default tree preset.
TARGETS = (
    ("specdec default greedy / HF greedy generate", "hybrid_greedy", "hf_greedy", 2.0),
    ("specdec default greedy / own speculative=False", "hybrid_greedy", "plain_greedy", 1.8),
    ("specdec default greedy / HF prompt lookup", "hybrid_greedy", "hf_prompt_lookup", 1.3),
    ("specdec default lossless sampling / HF sampling", "hybrid_sample", "hf_sample", 1.5),
    ("heads only, default tree greedy / HF greedy generate", "default_greedy", "hf_greedy", 2.0),
    ("heads only, default tree greedy / own speculative=False", "default_greedy", "plain_greedy", 1.8),
    ("heads only, default tree greedy / HF prompt lookup", "default_greedy", "hf_prompt_lookup", 1.3),
    ("heads only, default tree lossless sampling / HF sampling", "default_sample", "hf_sample", 1.5),
)


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


# -- models and heads ------------------------------------------------------------

RANDOM_SHAPES = {
    # Qwen2-0.5B's shape (random weights): 24 layers, 14 heads, 2 KV heads.
    # A weight std above HF's 0.02 gives peaked logits, so that bf16 rounding rarely flips an argmax.
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                 max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, use_sliding_window=False, initializer_range=0.05)),
    # A few-MB model for tests and dry runs of the GPU script; its vocabulary is the embedded tokenizer's.
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)),
}


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0, vocab_size: int | None = None):
    """A random-weight causal LM built from a config (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if shape not in RANDOM_SHAPES:
        raise ValueError(f"unknown random model shape {shape!r}; choose one of {sorted(RANDOM_SHAPES)}")
    kind, kw = RANDOM_SHAPES[shape]
    kw = {"vocab_size": vocab_size, **kw}
    if kw["vocab_size"] is None:
        raise ValueError(f"random model shape {shape!r} needs a vocab_size")
    config = AutoConfig.for_model(kind, bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._name_or_path = f"random:{shape}"
    return model.eval()


class OracleHeads(MedusaHeads):
    """Bench-only draft heads that know the greedy continuation.

    Head k proposes continuation[n + k] as its top-1 guess, where n is the
    number of tokens emitted so far (read from the round events), with
    probability `accuracy`, drawn once per (position, head) from a seeded
    generator; on a miss its top guesses are wrong tokens only. So the
    accepted length is known in advance (chain: sum of accuracy**d), and
    speedup / accepted length measures the engine itself. With mimic_cost,
    it also runs the shared lm_head K times, as real shared heads do.
    Greedy only, one request at a time: it is stateful by design.
    """

    def __init__(self, model: torch.nn.Module, num_heads: int = 4, accuracy: float = 1.0, seed: int = 0,
                 mimic_cost: bool = True) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"oracle `accuracy` must be in [0, 1], got {accuracy!r}")
        w = model.get_output_embeddings().weight  # [V, H]
        super().__init__(HeadsConfig(int(w.shape[1]), int(w.shape[0]), num_heads, num_layers=0, shared_lm_head=True),
                         model.get_output_embeddings())
        self.accuracy, self.seed, self.mimic_cost = accuracy, seed, mimic_cost
        self._cont: list[int] = []
        self._hits: list[list[bool]] = []
        self._produced = 0

    def begin(self, continuation: list[int], key: int) -> None:
        """Start a request whose greedy continuation is known; `key` seeds the hit pattern."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + key)
        K = self.config.num_heads
        self._cont = list(continuation)
        self._hits = (torch.rand(len(continuation) + K, K, generator=g) < self.accuracy).tolist()
        self._produced = 0

    def observe(self, event) -> None:
        self._produced = event.total_tokens

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [H] -> [K, V]
        K, V = self.config.num_heads, self.config.vocab_size
        if self.mimic_cost:
            out = super().forward(hidden).zero_()
        else:
            out = torch.zeros(K, V, dtype=hidden.dtype, device=hidden.device)
        rows, cols, vals = [], [], []
        n = self._produced
        for k in range(K):
            pos = n + k  # head k guesses the token k places after the root
            tok = self._cont[pos] if pos < len(self._cont) else None
            if tok is not None and self._hits[pos][k]:
                rows.append(k), cols.append(tok), vals.append(10.0)
            else:
                wrong = ((tok or 0) + 1 + k) % V
                rows.append(k), cols.append(wrong), vals.append(10.0)
                if tok is not None:
                    rows.append(k), cols.append(tok), vals.append(-1e4)  # keep it out of every top-k
        idx = torch.tensor([rows, cols], device=hidden.device)
        return out.index_put_((idx[0], idx[1]), torch.tensor(vals, dtype=out.dtype, device=hidden.device))


def load_target(cfg: BenchConfig) -> tuple[specdec.Loaded, OracleHeads | None]:
    """specdec.load with the bench-only model specs (random:...) and head specs (none, oracle) resolved."""
    dev = torch.device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, dev)
    model, tokenizer = cfg.model, None
    if model is not None and model.startswith("random:"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
        model = random_model(model.split(":", 1)[1], cfg.device, dtype, cfg.seed, vocab_size=len(tokenizer))
        if len(tokenizer) != model.config.vocab_size:
            tokenizer = None  # prompts are still encoded with it, but it cannot decode this vocabulary
    heads = cfg.heads
    if heads == "none" or (heads or "").startswith("oracle"):
        # specdec.load(None, None) means "embedded model with embedded heads", so name the model explicitly.
        loaded = specdec.load(model if model is not None else str(DEFAULT_MODEL), None, cfg.device, dtype,
                              tokenizer=tokenizer)
        if heads == "none":
            return loaded, None
        acc = float(heads.split(":", 1)[1]) if ":" in heads else 1.0
        oracle = OracleHeads(loaded.model, accuracy=acc, seed=cfg.seed)
        return specdec.load(loaded.model, oracle, cfg.device, dtype, tokenizer=loaded.tokenizer), oracle
    return specdec.load(model, heads, cfg.device, dtype, tokenizer=tokenizer), None


def select_methods(cfg: BenchConfig, loaded: specdec.Loaded, oracle) -> list[Method]:
    if cfg.methods is not None:
        unknown = set(cfg.methods) - {m.id for m in ALL_METHODS}
        if unknown:
            raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {[m.id for m in ALL_METHODS]}")
    out = []
    for m in ALL_METHODS:
        if cfg.methods is not None and m.id not in cfg.methods:
            continue
        if m.tree not in (None, "none") and loaded.heads is None:
            continue
        if m.tree == "trained" and not loaded.tree_paths:
            continue  # "auto" is then the default tree, already measured
        if oracle is not None and m.backend == "engine" and m.sampling:
            continue  # the oracle knows the greedy continuation only
        out.append(m)
    if not any(m.id == "hf_greedy" for m in out):
        out.insert(0, ALL_METHODS[0])  # every speedup is relative to it
    return out


# -- one run -----------------------------------------------------------------------

@dataclass
class Run:
    """What one (method, prompt) call produced, as plain values."""

    token_ids: list[int]
    seconds: float
    marks: list[tuple[float, int]]  # (seconds since the call began, tokens emitted at that moment)
    depth_reached: list[int] = field(default_factory=list)  # [D] rounds whose tree reached depth d+1
    depth_accepted: list[int] = field(default_factory=list)  # [D] rounds that accepted >= d+1 drafts
    stage_ms: dict = field(default_factory=dict)  # summed over decoding rounds
    rounds: int = 0  # decoding rounds (target forwards after the first)


class _Clock:
    """An HF streamer that only timestamps emissions (the first put is the prompt)."""

    def __init__(self, t0: float) -> None:
        self.t0, self.marks, self._prompt = t0, [], True

    def put(self, value) -> None:
        if self._prompt:
            self._prompt = False
            return
        self.marks.append((time.perf_counter() - self.t0, int(value.numel())))

    def end(self) -> None:
        pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_hf(loaded: specdec.Loaded, ids: list[int], m: Method, cfg: BenchConfig, seed: int, max_new: int) -> Run:
    from transformers import GenerationConfig

    model, dev = loaded.model, loaded.device
    vocab = model.config.vocab_size
    eos = (loaded.engine.eos_token_ids and sorted(loaded.engine.eos_token_ids)) if cfg.stop_at_eos else None
    gc_kw = dict(max_new_tokens=max_new, do_sample=m.sampling, pad_token_id=0,
                 # HF fills a None eos from the model's config, so "never stop" is an id the model cannot emit
                 eos_token_id=eos or vocab)
    if m.sampling:
        gc_kw.update(temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)  # HF's default top_k is 50
    if m.prompt_lookup:
        gc_kw.update(prompt_lookup_num_tokens=cfg.lookup)
    x = torch.tensor([ids], device=dev)
    mask, config = torch.ones_like(x), GenerationConfig(**gc_kw)
    torch.manual_seed(seed)
    _sync(dev)
    t0 = time.perf_counter()
    clock = _Clock(t0)
    with torch.inference_mode():
        out = model.generate(x, attention_mask=mask, generation_config=config, streamer=clock)
    _sync(dev)
    seconds = time.perf_counter() - t0
    new = out[0, len(ids):].tolist()
    if cfg.stop_at_eos and eos:
        cut = next((i for i, t in enumerate(new) if t in eos), None)
        new = new if cut is None else new[: cut + 1]
    return Run(new, seconds, clock.marks, rounds=max(len(clock.marks) - 1, 0))


def run_engine(loaded: specdec.Loaded, ids: list[int], m: Method, cfg: BenchConfig, seed: int, max_new: int,
               oracle: OracleHeads | None = None, continuation: list[int] | None = None, key: int = 0) -> Run:
    marks: list[tuple[float, int]] = []
    if oracle is not None and m.tree is not None:
        oracle.begin(continuation or [], key)

    def on_round(ev) -> None:
        marks.append((time.perf_counter() - t0, len(ev.emitted)))
        if oracle is not None:
            oracle.observe(ev)

    _sync(loaded.device)
    t0 = time.perf_counter()
    res = specdec.generate(loaded, prompt_ids=ids, max_new_tokens=max_new,
                           temperature=cfg.temperature if m.sampling else 0.0,
                           top_p=cfg.top_p if m.sampling else 1.0, seed=seed,
                           tree=m.tree or "auto", speculative=m.tree is not None, on_round=on_round,
                           eos_token_id="auto" if cfg.stop_at_eos else None, lookup=cfg.lookup if m.lookup else 0,
                           lookup_mode=m.lookup_mode)
    _sync(loaded.device)
    seconds = time.perf_counter() - t0
    run = Run(res.token_ids, seconds, marks, rounds=res.stats["target_forwards"] - 1)
    stage = dict.fromkeys(STAGES + ("total",), 0.0)
    for ev in res.rounds[1:]:
        timed = 0.0
        for k in STAGES[:-1]:
            stage[k] += ev.timings.get(k, 0.0)
            timed += ev.timings.get(k, 0.0)
        stage["other"] += ev.timings["total"] - timed
        stage["total"] += ev.timings["total"]
        if ev.nodes:
            D = max(n.depth for n in ev.nodes)
            a = len(ev.accepted_path) - 1
            for lst in (run.depth_reached, run.depth_accepted):
                lst.extend([0] * (D - len(lst)))
            for d in range(D):
                run.depth_reached[d] += 1
                run.depth_accepted[d] += a > d
    run.stage_ms = stage
    return run


def run_method(loaded, ids, m, cfg, seed, max_new, oracle=None, continuation=None, key=0) -> Run:
    """One timed call with the garbage collector paused, as timeit does."""
    gc.collect()
    gc.disable()
    try:
        if m.backend == "hf":
            return run_hf(loaded, ids, m, cfg, seed, max_new)
        return run_engine(loaded, ids, m, cfg, seed, max_new, oracle, continuation, key)
    finally:
        gc.enable()


# -- memory ----------------------------------------------------------------------

def _proc_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(field_name + r":\s+(\d+)", f.read()).group(1))


def _libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def peak_memory_mb(fn, device: torch.device) -> tuple[float | None, str]:
    """Run fn once; return the peak memory above the level before it, in MiB, and how it was measured."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20, "cuda max_memory_allocated - allocated before"
    libc = _libc()
    try:
        gc.collect()
        if libc is not None:
            # glibc keeps freed heap pages, so a second run would not grow the RSS at all:
            # hand them back first, and serve large blocks with mmap so they come and go.
            libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD (also stops its dynamic growth)
            libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
        base = _proc_kb("VmRSS")
        fn()
        return (_proc_kb("VmHWM") - base) / 1024, "peak RSS (VmHWM, reset, after malloc_trim) - RSS before"
    except (OSError, AttributeError):
        return None, "unavailable (needs Linux /proc/self/clear_refs)"


# -- the benchmark ---------------------------------------------------------------

def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]  # nearest-rank percentile


def _per_token_ms(run: Run) -> tuple[list[float], float | None]:
    """Per-token times (gap between emissions / tokens emitted) and time to first token, in ms."""
    if not run.marks:
        return [], None
    out = []
    for (t_prev, _), (t, n) in zip(run.marks, run.marks[1:]):
        out += [(t - t_prev) * 1e3 / n] * n if n else []
    return out, run.marks[0][0] * 1e3


def benchmark(cfg: BenchConfig, loaded: specdec.Loaded | None = None, oracle: OracleHeads | None = None,
              log=print, checkpoint=None) -> dict:
    """Run every method on every prompt; return the results as plain values (the JSON report).

    `checkpoint(result)`, if given, receives a partial result after every repeat (medians over the
    repeats so far, no memory figures, meta["partial"] set), so a run cut short by a time limit,
    as on a lent GPU, still leaves numbers behind.
    """
    started = time.perf_counter()
    if cfg.max_new_tokens < 2 or cfg.repeats < 1 or cfg.warmup < 0:
        raise ValueError(f"need max_new_tokens >= 2, repeats >= 1, warmup >= 0; got {cfg.max_new_tokens}, "
                         f"{cfg.repeats}, {cfg.warmup}")
    if not cfg.prompts:
        raise ValueError("no prompts")
    if not 1 <= cfg.lookup <= MAX_LOOKUP:
        raise ValueError(f"--lookup must be in [1, {MAX_LOOKUP}] (tokens per prompt-lookup round), got {cfg.lookup}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if loaded is None:
        loaded, oracle = load_target(cfg)
    tok = loaded.tokenizer
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))  # to encode prompts for models without one
    V = loaded.model.config.vocab_size
    prompts = [[i for i in tok(p, add_special_tokens=False)["input_ids"] if i < V] for p in cfg.prompts]
    methods = select_methods(cfg, loaded, oracle)
    hf_greedy = next(m for m in methods if m.id == "hf_greedy")
    N = cfg.max_new_tokens

    # The oracle needs the greedy continuation (plus room for the deepest head) before any engine run.
    conts: list[list[int] | None] = [None] * len(prompts)
    if oracle is not None:
        K = oracle.config.num_heads
        conts = [run_method(loaded, ids, hf_greedy, cfg, 0, N + K + 1).token_ids for ids in prompts]

    log(f"bench: {len(methods)} methods x {len(prompts)} prompts x {cfg.repeats} repeats, "
        f"{N} new tokens, {loaded.name} on {cfg.device}/{loaded.model.dtype}, threads={torch.get_num_threads()}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if loaded.device.type == "cpu" and load > 0.5:
        log(f"  note: load average {load:.1f} before the run: other work shares this CPU, so timings are noisy"
            + (" (with several torch threads, a busy CPU slows every op a lot: try --threads 1)"
               if torch.get_num_threads() > 1 and load > 1.0 else ""))
    for _ in range(cfg.warmup):
        for m in methods:
            run_method(loaded, prompts[0], m, cfg, cfg.seed, N, oracle, conts[0], 0)
    runs: dict[str, list[list[Run]]] = {m.id: [[] for _ in range(cfg.repeats)] for m in methods}
    for rep in range(cfg.repeats):
        t_rep = time.perf_counter()
        for pi, ids in enumerate(prompts):
            shift = (rep * len(prompts) + pi) % len(methods)
            for m in methods[shift:] + methods[:shift]:
                seed = cfg.seed + 1000 * rep + pi
                runs[m.id][rep].append(run_method(loaded, ids, m, cfg, seed, N, oracle, conts[pi], pi))
        log(f"  repeat {rep + 1}/{cfg.repeats}: {time.perf_counter() - t_rep:.1f}s")
        if checkpoint is not None and rep + 1 < cfg.repeats:
            done = {k: v[: rep + 1] for k, v in runs.items()}
            partial = _assemble(cfg, loaded, oracle, methods, done, {m.id: (None, "") for m in methods}, tok,
                                len(prompts), started)
            partial["meta"]["partial"] = f"{rep + 1} of {cfg.repeats} repeats"
            checkpoint(partial)
    memory = {}  # last: the CPU measurement changes malloc settings (see peak_memory_mb)
    for m in methods:
        memory[m.id] = peak_memory_mb(lambda: run_method(loaded, prompts[0], m, cfg, cfg.seed, N, oracle, conts[0], 0),
                                      loaded.device)

    return _assemble(cfg, loaded, oracle, methods, runs, memory, tok, len(prompts), started)


def _assemble(cfg, loaded, oracle, methods, runs, memory, tok, n_prompts: int, started: float) -> dict:
    """Per-method rows, speedups and the issue's targets from the timed runs."""
    ref = [r.token_ids for r in runs["hf_greedy"][0]]
    rows = [summarize_method(m, runs[m.id], ref, tok if loaded.tokenizer is not None else None, memory[m.id][0],
                             loaded, cfg.lookup) for m in methods]
    base = {r["id"]: r for r in rows}
    for r in rows:
        r["speedup_vs_hf_greedy"] = _ratio(r["tok_s_median"], base["hf_greedy"]["tok_s_median"])
        r["speedup_vs_plain"] = _ratio(r["tok_s_median"], base.get("plain_" + ("sample" if r["sampling"] else "greedy"),
                                                                  {}).get("tok_s_median"))
        tau = r["mean_accepted_length"]
        r["efficiency"] = _ratio(r["speedup_vs_hf_greedy"], tau) if r["backend"] == "engine" and r["tree"] else None
    targets = [{"name": name, "ratio": _ratio(base[a]["tok_s_median"], base[b]["tok_s_median"]), "target": t,
                "met": (base[a]["tok_s_median"] / base[b]["tok_s_median"] >= t)}
               for name, a, b, t in TARGETS if a in base and b in base]
    return {"meta": machine_meta(cfg, loaded, oracle, memory, n_prompts, time.perf_counter() - started),
            "methods": rows, "targets": targets}


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarize_method(m: Method, reps: list[list[Run]], ref: list[list[int]], tok, mem_mb, loaded,
                     lookup: int = DEFAULT_LOOKUP) -> dict:
    """Aggregate one method's runs into the reported figures."""
    tok_s = [sum(len(r.token_ids) for r in rep) / sum(r.seconds for r in rep) for rep in reps]
    flat = [r for rep in reps for r in rep]
    per_tok, ttft = [], []
    for r in flat:
        p, t = _per_token_ms(r)
        per_tok += p
        ttft += [t] if t is not None else []
    decode_tokens = sum(sum(n for _, n in r.marks[1:]) for r in flat)
    decode_rounds = sum(max(len(r.marks) - 1, 0) for r in flat)
    D = max((len(r.depth_reached) for r in flat), default=0)
    reached = [sum(r.depth_reached[d] for r in flat if d < len(r.depth_reached)) for d in range(D)]
    accepted = [sum(r.depth_accepted[d] for r in flat if d < len(r.depth_accepted)) for d in range(D)]
    row = {
        "id": m.id, "label": m.label, "backend": m.backend, "sampling": m.sampling, "tree": m.tree,
        "tree_nodes": None, "tok_s_median": statistics.median(tok_s), "tok_s_runs": tok_s,
        "new_tokens": sum(len(r.token_ids) for r in flat),
        "mean_accepted_length": decode_tokens / decode_rounds if decode_rounds else None,
        "acceptance_per_depth": [a / n if n else None for a, n in zip(accepted, reached)],
        # P(accept >= d | accepted >= d-1): rounds accepting >= d / rounds accepting >= d-1 (reached, at d=1)
        "acceptance_per_depth_conditional": [a / p if p else None for a, p in zip(accepted, reached[:1] + accepted[:-1])],
        "depth_rounds": reached, "depth_accepted": accepted,
        "ms_per_token_p50": _pct(per_tok, 50), "ms_per_token_p99": _pct(per_tok, 99),
        "ttft_ms_median": statistics.median(ttft) if ttft else None,
        "peak_mem_mb": mem_mb,
    }
    if m.tree is not None:
        row["tree_nodes"] = loaded.engine.resolve_tree(m.tree).num_nodes
        row["lookup"], row["lookup_mode"] = (lookup if m.lookup else 0), m.lookup_mode
    if m.backend == "engine":
        rounds = sum(r.rounds for r in flat)
        st = {k: sum(r.stage_ms.get(k, 0.0) for r in flat) for k in STAGES + ("total",)}
        row["stage_ms_per_round"] = {k: v / rounds for k, v in st.items()} if rounds else None
        # The least disturbed repeat (lowest ms per round): the --profile view on a noisy machine.
        per_rep = []
        for rep in reps:
            n = sum(r.rounds for r in rep)
            if n:
                per_rep.append({k: sum(r.stage_ms.get(k, 0.0) for r in rep) / n for k in STAGES + ("total",)})
        row["stage_ms_per_round_best_repeat"] = min(per_rep, key=lambda d: d["total"]) if per_rep else None
        row["non_forward_pct"] = 100 * (st["total"] - st["forward"]) / st["total"] if st["total"] else None
        row["outside_round_ms_per_call"] = 1e3 * sum(r.seconds for r in flat) / len(flat) - (
            st["total"] + sum(r.marks[0][0] * 1e3 for r in flat)) / len(flat)
    if not m.sampling:
        n = len(ref)
        firsts = [_first_diff(r.token_ids, ref[i % n]) for rep in reps for i, r in enumerate(rep)]
        row["greedy_check"] = {
            "runs": len(firsts), "tokens_equal": sum(f is None for f in firsts),
            "first_mismatch": min((f for f in firsts if f is not None), default=None),
            "text_equal": (sum(tok.decode(r.token_ids) == tok.decode(ref[i]) for rep in reps for i, r in enumerate(rep))
                           if tok is not None else None),
        }
        row["greedy_equal"] = row["greedy_check"]["tokens_equal"] == len(firsts)
    return row


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def machine_meta(cfg: BenchConfig, loaded, oracle, memory, n_prompts: int, elapsed: float) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    import transformers

    dev = loaded.device
    return {
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if sys.argv and sys.argv[0] else "",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "elapsed_s": elapsed,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                    "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "platform": platform.platform()},
        "model": loaded.name, "params_m": sum(p.numel() for p in loaded.model.parameters()) / 1e6,
        "device": str(dev), "dtype": str(loaded.model.dtype).replace("torch.", ""),
        "heads": cfg.heads or ("shipped" if loaded.heads is not None else None),
        "oracle_accuracy": oracle.accuracy if oracle is not None else None,
        # every tree then accepts like a chain: tau = sum of accuracy**d, d = 0..K (before the length cap)
        "oracle_expected_tau": (sum(oracle.accuracy ** d for d in range(oracle.config.num_heads + 1))
                                if oracle is not None else None),
        "trained_tree_nodes": len(loaded.tree_paths) + 1 if loaded.tree_paths else None,
        "prompts": n_prompts, "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats, "warmup": cfg.warmup,
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0},
        "prompt_lookup_num_tokens": cfg.lookup, "stop_at_eos": cfg.stop_at_eos,
        "load_average_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "memory_method": next(iter(memory.values()))[1] if memory else None,
    }


# -- reports ---------------------------------------------------------------------

def _f(x, fmt="{:.2f}", none="-"):
    return none if x is None else fmt.format(x)


def markdown_table(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"model `{meta['model']}` ({meta['params_m']:.1f}M params), {meta['device']} {meta['dtype']}, "
        f"{meta['prompts']} prompts x {meta['max_new_tokens']} new tokens, median of {meta['repeats']} repeats, "
        f"{meta['machine']['gpu'] or meta['machine']['cpu']} ({meta['machine']['torch_threads']} threads)"
        + (f" -- PARTIAL: {meta['partial']}, no memory figures" if meta.get("partial") else ""),
        "",
        "| method | tok/s | speedup vs HF greedy | tau | acc@d (d=1..) | ms/tok p50 | ms/tok p99 | peak mem MiB "
        "| non-fwd % | eff. | greedy == HF |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result["methods"]:
        acc = " ".join(_f(a, "{:.2f}") for a in r["acceptance_per_depth"]) or "-"
        nodes = f" ({r['tree_nodes']} nodes)" if r["tree_nodes"] else ""
        if r.get("lookup"):
            nodes = (f" (lookup {r['lookup']})" if r["tree_nodes"] == 1
                     else f" ({r['tree_nodes']} nodes {'+' if r['lookup_mode'] == 'merge' else 'or'} lookup {r['lookup']})")
        g = r.get("greedy_check")
        if g is None:
            check = "n/a (sampling)"
        else:
            check = f"{g['tokens_equal']}/{g['runs']} ids"
            check += f", {g['text_equal']}/{g['runs']} text" if g["text_equal"] is not None else ""
            check += f" (1st diff @{g['first_mismatch']})" if g["first_mismatch"] is not None else ""
        lines.append(
            f"| {r['id']}{nodes} | {r['tok_s_median']:.1f} | {_f(r['speedup_vs_hf_greedy'])}x | "
            f"{_f(r['mean_accepted_length'])} | {acc} | {_f(r['ms_per_token_p50'])} | {_f(r['ms_per_token_p99'])} | "
            f"{_f(r['peak_mem_mb'], '{:.1f}')} | {_f(r.get('non_forward_pct'), '{:.0f}')} | {_f(r['efficiency'])} | "
            f"{check} |")
    if result["targets"]:
        lines += ["", "| target (issue 5) | measured | needed | met |", "| --- | ---: | ---: | --- |"]
        for t in result["targets"]:
            lines.append(f"| {t['name']} | {_f(t['ratio'])}x | {t['target']:.1f}x | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


COLORS = {"hf": "#8c8c8c", "plain": "#4c78a8", "spec": "#f58518", "sample": "#54a24b"}


def _color(r: dict) -> str:
    if r["backend"] == "hf":
        return COLORS["hf"]
    if r["tree"] is None:
        return COLORS["plain"]
    return COLORS["sample"] if r["sampling"] else COLORS["spec"]


def figures(result: dict) -> list:
    """Plotly figures: speedup, tok/s, acceptance per depth, per-token latency, round breakdown."""
    import plotly.graph_objects as go

    rows = result["methods"]
    ids = [r["id"] for r in rows]
    figs = []
    f = go.Figure(go.Bar(x=ids, y=[r["speedup_vs_hf_greedy"] for r in rows], marker_color=[_color(r) for r in rows],
                         text=[_f(r["speedup_vs_hf_greedy"]) + "x" for r in rows], textposition="outside"))
    f.add_hline(y=1.0, line_dash="dot", line_color="#333333")
    f.update_layout(title="Speedup over HF greedy generate (median tok/s ratio, same run)", yaxis_title="x")
    figs.append(f)
    f = go.Figure(go.Bar(x=ids, y=[r["tok_s_median"] for r in rows], marker_color=[_color(r) for r in rows],
                         error_y=dict(type="data", symmetric=False,
                                      array=[max(r["tok_s_runs"]) - r["tok_s_median"] for r in rows],
                                      arrayminus=[r["tok_s_median"] - min(r["tok_s_runs"]) for r in rows])))
    f.update_layout(title="Tokens/s: median over repeats (whiskers: min and max repeat)", yaxis_title="tok/s")
    figs.append(f)
    f = go.Figure()
    for r in rows:
        if r["acceptance_per_depth"]:
            d = list(range(1, len(r["acceptance_per_depth"]) + 1))
            f.add_trace(go.Scatter(x=d, y=r["acceptance_per_depth"], mode="lines+markers", name=r["id"]))
    f.update_layout(title="Acceptance per depth: rounds accepting >= d drafts / rounds whose tree reached depth d",
                    xaxis_title="depth d", yaxis_title="rate", yaxis_range=[0, 1.05], xaxis_dtick=1)
    figs.append(f)
    f = go.Figure([go.Bar(x=ids, y=[r["ms_per_token_p50"] for r in rows], name="p50", marker_color="#4c78a8"),
                   go.Bar(x=ids, y=[r["ms_per_token_p99"] for r in rows], name="p99", marker_color="#e45756")])
    f.update_layout(title="Time per emitted token (ms)", barmode="group", yaxis_title="ms")
    figs.append(f)
    eng = [r for r in rows if r.get("stage_ms_per_round")]
    if eng:
        palette = ["#f58518", "#4c78a8", "#54a24b", "#b279a2", "#9d755d", "#bab0ac"]
        f = go.Figure([go.Bar(x=[r["id"] for r in eng], y=[r["stage_ms_per_round"][s] for r in eng], name=s,
                              marker_color=c) for s, c in zip(STAGES, palette)])
        f.update_layout(title="Engine round breakdown (ms per decoding round)", barmode="stack", yaxis_title="ms")
        figs.append(f)
    for f in figs:
        f.update_layout(template="plotly_white", height=420)
    return figs


def html_report(result: dict, markdown: str) -> str:
    """A self-contained page (plotly.js inlined, so it opens offline); the table alone without plotly."""
    meta = result["meta"]
    try:
        parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures(result))]
    except ImportError:
        parts = ["<p>plotly is not installed here: rebuild this page with "
                 "<code>python bench.py --report-from results.json</code>.</p>"]
    table = "<pre>" + markdown.replace("&", "&amp;").replace("<", "&lt;") + "</pre>"
    return ("<!doctype html><html><head><meta charset='utf-8'><title>specdec benchmark</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}pre{font-size:12px}</style></head><body>"
            f"<h1>specdec benchmark</h1><p><code>{meta['command']}</code> at {meta['date']}</p>{table}"
            + "".join(parts) + "<h2>meta</h2><pre>" + json.dumps(meta, indent=1) + "</pre></body></html>")


def write_reports(result: dict, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown_table(result)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "html": out / "report.html"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["markdown"].write_text(md)
    paths["html"].write_text(html_report(result, md))
    return paths


# -- profile mode ----------------------------------------------------------------

def profile(cfg: BenchConfig, log=print) -> dict:
    """Round-loop breakdown per tree from the events' timings, then a cProfile of the default tree."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    loaded, oracle = load_target(cfg)
    if loaded.heads is None:
        raise ValueError("--profile needs draft heads")
    trees = [t for t in ("chain", "small", "default", "trained") if t != "trained" or loaded.tree_paths]
    cfg = replace(cfg, methods=("plain_greedy",) + tuple(f"{t}_greedy" for t in trees), repeats=max(cfg.repeats, 3))
    res = benchmark(cfg, loaded, oracle, log=log)
    rows = [r for r in res["methods"] if r["backend"] == "engine"]
    log("\nround-loop breakdown, greedy: ms per decoding round (% of round), least disturbed repeat")
    log(f"{'stage':<8}" + "".join(f"{r['id']:>20}" for r in rows))
    for s in STAGES + ("total",):
        cells = [f"{r['stage_ms_per_round_best_repeat'][s]:.2f} ({100 * r['stage_ms_per_round_best_repeat'][s] / r['stage_ms_per_round_best_repeat']['total']:.0f}%)"
                 for r in rows]
        log(f"{s:<8}" + "".join(f"{c:>20}" for c in cells))
    best = [r["stage_ms_per_round_best_repeat"] for r in rows]
    log(f"{'non-fwd':<8}" + "".join(f"{100 * (b['total'] - b['forward']) / b['total']:>19.1f}%" for b in best)
        + "   (target: < 15%)")
    log(f"{'all reps':<8}" + "".join(f"{r['non_forward_pct']:>19.1f}%" for r in rows) + "   (non-fwd, every repeat)")
    log(f"{'outside':<8}" + "".join(f"{r['outside_round_ms_per_call']:>17.2f} ms" for r in rows)
        + "   per call: generator, callbacks, API")
    log("draft = heads + top-k fill | forward = target forward incl. the 4D mask | verify = lm_head rows + "
        "acceptance | cache = KV gather | event = detok + EOS/length cut | other = tree-node list "
        "(between the engine's clocks)")

    # cProfile: the same loop, function by function.
    m = next(m for m in ALL_METHODS if m.id == "default_greedy")
    tok = loaded.tokenizer
    ids = tok(cfg.prompts[0], add_special_tokens=False)["input_ids"] if tok is not None else [1, 2, 3, 4]
    run_engine(loaded, ids, m, cfg, cfg.seed, cfg.max_new_tokens, oracle)
    prof = cProfile.Profile()
    prof.enable()
    runs = [run_engine(loaded, ids, m, cfg, cfg.seed, cfg.max_new_tokens, oracle) for _ in range(3)]
    prof.disable()
    st = pstats.Stats(prof)
    rounds = sum(r.rounds + 1 for r in runs)
    log(f"\ncProfile, default tree, 3 x {cfg.max_new_tokens} tokens, {rounds} target forwards "
        f"({st.total_tt:.2f}s under the profiler, which inflates Python-heavy code):")
    entries = [(ct, tt, nc, f"{Path(f).parent.name}/{Path(f).name}:{ln}({fn})") for (f, ln, fn), (_, nc, tt, ct, _)
               in st.stats.items()]
    keep = ("specdec/", "masking_utils", "cache_utils", "_nn.linear", "scaled_dot_product", "modeling_llama.py",
            "modeling_qwen2.py", "softmax", "topk", "argmax")
    log(f"{'cum ms/fwd':>11} {'own ms/fwd':>11} {'calls':>7}  function")
    for ct, tt, nc, name in sorted(entries, reverse=True)[:60]:
        if any(k in name for k in keep):
            log(f"{1e3 * ct / rounds:11.3f} {1e3 * tt / rounds:11.3f} {nc:7d}  {name}")
    mask = sum(ct for ct, tt, nc, name in entries if "create_causal_mask" in name)
    fwd = sum(ct for ct, tt, nc, name in entries if name.startswith("specdec/target.py") and "(forward)" in name)
    lin = sum(tt for ct, tt, nc, name in entries if "_nn.linear" in name)
    if fwd:
        log(f"HF create_causal_mask, given our 4D mask: {1e3 * mask / rounds:.3f} ms per forward "
            f"({100 * mask / fwd:.1f}% of target forward); torch linear kernels: {100 * lin / fwd:.0f}% of it")
    res["profile"] = {"breakdown_best_repeat": {r["id"]: r["stage_ms_per_round_best_repeat"] for r in rows},
                      "mask_ms_per_forward": 1e3 * mask / rounds, "mask_pct_of_forward": 100 * mask / fwd if fwd else None}
    return res


# -- command line ----------------------------------------------------------------

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


def parse_args(argv=None) -> tuple[BenchConfig, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 prompts x 64 tokens x 2 repeats (< 3 min on 2 CPU cores)")
    ap.add_argument("--profile", action="store_true", help="round-loop breakdown per tree and a cProfile")
    ap.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when present)")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--model", default=None, help="hub id or path; random:qwen2-0.5b or random:tiny (default: embedded)")
    ap.add_argument("--heads", default=None, help="heads folder, 'random', 'none' or 'oracle[:accuracy]' "
                                                  "(default: the embedded heads)")
    ap.add_argument("--prompts", default=None, help="JSON list of prompts or JSONL of {'prompt': ...}")
    ap.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--methods", default=None, help="comma-separated method ids (default: all)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--lookup", type=int, default=DEFAULT_LOOKUP,
                    help=f"prompt-lookup tokens per round, for HF's prompt lookup and ours alike (default {DEFAULT_LOOKUP})")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: decode exactly N tokens)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench_out", help="output folder (default: bench_out/)")
    ap.add_argument("--report-from", default=None, help="rebuild the Markdown and HTML of a results.json, run nothing")
    a = ap.parse_args(argv)
    if not 1 <= a.lookup <= MAX_LOOKUP:
        ap.error(f"--lookup must be in [1, {MAX_LOOKUP}] (tokens per prompt-lookup round), got {a.lookup}")
    prompts = read_prompts(a.prompts) if a.prompts else list(DEFAULT_PROMPTS)
    n_prompts = a.num_prompts or (4 if a.quick else len(prompts))
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = BenchConfig(
        model=a.model, heads=a.heads, device=device, dtype=a.dtype, prompts=prompts[:n_prompts],
        max_new_tokens=a.max_new_tokens or (64 if a.quick else 128), repeats=a.repeats or (2 if a.quick else 3),
        warmup=a.warmup, methods=tuple(a.methods.split(",")) if a.methods else None, temperature=a.temperature,
        top_p=a.top_p, stop_at_eos=a.stop_at_eos, threads=a.threads or (os.cpu_count() if device == "cpu" else None),
        seed=a.seed, lookup=a.lookup)
    return cfg, a


def main(argv=None) -> None:
    cfg, a = parse_args(argv)
    t0 = time.perf_counter()
    if a.report_from:
        result = json.loads(Path(a.report_from).read_text())
    else:
        result = profile(cfg) if a.profile else benchmark(cfg, checkpoint=lambda r: write_reports(r, a.out))
    paths = write_reports(result, a.out)
    print()
    print(markdown_table(result))
    print(f"wrote {', '.join(str(p) for p in paths.values())} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
