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

Modules: methods (the registry, as data), config, models (random models, head specs), oracle
(the oracle heads, shared with the tests), runners (one timed call), memory, suite (the loop),
rows (figures per method), report (Markdown, JSON, HTML), profiler (--profile), cli.

Usage (`python -m bench` is the same):
  python bench.py --quick                          # < 3 min on a 2-core CPU
  python bench.py --device cuda --dtype bfloat16
  python bench.py --model random:qwen2-0.5b --heads oracle:0.8 --device cuda --dtype bfloat16
  python bench.py --profile                        # round-loop breakdown + cProfile
"""
from __future__ import annotations

from .config import DEFAULT_PROMPTS, BenchConfig, read_prompts
from .methods import BY_ID, METHODS, TARGETS, Method, select_methods
from .models import RANDOM_SHAPES, load_target, random_model
from .oracle import OracleHeads, accuracy_ranks
from .report import figures, html_report, markdown_table, write_reports
from .runners import STAGES, Run, engine_request, run_engine, run_hf, run_method
from .suite import benchmark

__all__ = ["DEFAULT_PROMPTS", "BenchConfig", "read_prompts", "BY_ID", "METHODS", "TARGETS", "Method",
           "select_methods", "RANDOM_SHAPES", "load_target", "random_model", "OracleHeads", "accuracy_ranks",
           "figures", "html_report", "markdown_table", "write_reports", "STAGES", "Run", "engine_request",
           "run_engine", "run_hf", "run_method", "benchmark"]
