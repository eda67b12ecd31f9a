"""One timed call of one method on one prompt: HF `generate`, or a specdec request on the scheduler (the path
`specdec.generate`, the app and `specdec serve` take)."""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch

import specdec
from specdec.request import GenerationRequest
from specdec.sampler import SamplingParams
from specdec.stats import DepthCounts, depth_counts, expected_length_errors, tree_size

from .config import BenchConfig
from .methods import Method
from .oracle import OracleHeads

# "rows": the target's vocabulary projection of the rows verification reads (timed apart from "verify");
# "other": inside the round, untimed by the engine
STAGES = ("draft", "forward", "rows", "verify", "cache", "event", "other")


@dataclass
class Run:
    """What one (method, prompt) call produced, as plain values."""

    token_ids: list[int]
    seconds: float
    marks: list[tuple[float, int]]  # (seconds since the call began, tokens emitted at that moment)
    depths: DepthCounts = field(default_factory=DepthCounts)  # speculative rounds per depth (specdec.stats)
    stage_ms: dict = field(default_factory=dict)  # summed over decoding rounds
    rounds: int = 0  # decoding rounds (target forwards after the first)
    tree_nodes: int = 0  # nodes verified, summed over decoding rounds (specdec.stats.tree_size)
    expected_errors: list[float] = field(default_factory=list)  # dynamic tree: |expected - verified| per round


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


def on_rounds_thread(loaded: specdec.Loaded, fn, *args):
    """fn(*args) where specdec's rounds run on a CPU, the scheduler's thread: a second thread's OpenMP pool beside
    it makes libgomp's idle workers sleep, and every small op then waits for a wake-up (BENCHMARKS.md, Method)."""
    return loaded.scheduler.call(fn, *args) if loaded.device.type == "cpu" else fn(*args)


def run_hf(loaded: specdec.Loaded, ids: list[int], m: Method, cfg: BenchConfig, seed: int, max_new: int) -> Run:
    from transformers import GenerationConfig

    model, dev = loaded.model, loaded.device
    vocab = model.config.vocab_size
    eos = (loaded.engine.eos_token_ids and sorted(loaded.engine.eos_token_ids)) if cfg.stop_at_eos else None
    gc_kw = dict(max_new_tokens=max_new, do_sample=m.sampling, pad_token_id=0,
                 # HF fills a None eos from the model's config, so "never stop" is an id the model cannot emit
                 eos_token_id=eos or vocab)
    if m.sampling:
        t, p = m.sampling_params(cfg.temperature, cfg.top_p)
        gc_kw.update(temperature=t, top_p=p, top_k=0)  # HF's default top_k is 50
    if m.prompt_lookup:
        gc_kw.update(prompt_lookup_num_tokens=cfg.lookup)
    if m.hf_cache is not None:
        gc_kw.update(cache_implementation=m.hf_cache, disable_compile=not m.hf_compile)
    x = torch.tensor([ids], device=dev)
    mask, config = torch.ones_like(x), GenerationConfig(**gc_kw)

    def timed() -> tuple[torch.Tensor, float, _Clock]:
        torch.manual_seed(seed)
        _sync(dev)
        clock = _Clock(time.perf_counter())
        with torch.inference_mode():
            out = model.generate(x, attention_mask=mask, generation_config=config, streamer=clock)
        _sync(dev)
        return out, time.perf_counter() - clock.t0, clock

    out, seconds, clock = on_rounds_thread(loaded, timed)
    new = out[0, len(ids):].tolist()
    if cfg.stop_at_eos and eos:
        cut = next((i for i, t in enumerate(new) if t in eos), None)
        new = new if cut is None else new[: cut + 1]
    return Run(new, seconds, clock.marks, rounds=max(len(clock.marks) - 1, 0))


def engine_request(m: Method, cfg: BenchConfig, ids: list[int], seed: int, max_new: int) -> GenerationRequest:
    """The request an engine method makes: the method's settings, the run's sampling settings and seed."""
    t, p = m.sampling_params(cfg.temperature, cfg.top_p)
    params = SamplingParams(temperature=t, top_p=p, seed=seed) if m.sampling else SamplingParams(seed=seed)
    return GenerationRequest(ids, max_new, params, tree=m.tree or "auto", speculative=m.tree is not None,
                             acceptance=m.acceptance, eos_token_id="auto" if cfg.stop_at_eos else None,
                             lookup=cfg.lookup if m.lookup else 0, lookup_mode=m.lookup_mode, drafter=m.drafter)


def run_engine(loaded: specdec.Loaded, ids: list[int], m: Method, cfg: BenchConfig, seed: int, max_new: int,
               oracle: OracleHeads | None = None, continuation: list[int] | None = None, key: int = 0) -> Run:
    if oracle is not None and m.tree is not None:
        on_rounds_thread(loaded, oracle.begin, list(ids) + list(continuation or []), key)
    request = engine_request(m, cfg, ids, seed, max_new)
    marks: list[tuple[float, int]] = []
    _sync(loaded.device)
    t0 = time.perf_counter()
    ticket = loaded.scheduler.submit(request, on_round=lambda ev: marks.append(
        (time.perf_counter() - t0, len(ev.emitted))))
    events = ticket.result()
    _sync(loaded.device)
    seconds = time.perf_counter() - t0
    stage = dict.fromkeys(STAGES + ("total",), 0.0)
    for ev in events[1:]:
        timed = sum(ev.timings.get(k, 0.0) for k in STAGES[:-1])
        for k in STAGES[:-1]:
            stage[k] += ev.timings.get(k, 0.0)
        stage["other"] += ev.timings["total"] - timed
        stage["total"] += ev.timings["total"]
    dec = events[1:]
    return Run([t.token_id for ev in events for t in ev.emitted], seconds, marks, depth_counts(events), stage,
               rounds=len(dec), tree_nodes=sum(tree_size(ev) for ev in dec), expected_errors=expected_length_errors(events))


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
