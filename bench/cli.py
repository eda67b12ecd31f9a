"""The command line: `python bench.py ...` (or `python -m bench ...`)."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from specdec.lookup import DEFAULT_LOOKUP

from . import __doc__ as DOC
from .config import DEFAULT_PROMPTS, BenchConfig, read_prompts
from .profiler import profile
from .report import markdown_table, write_reports
from .suite import benchmark


def parse_args(argv=None) -> tuple[BenchConfig, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=DOC.split("\n")[0])
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
    ap.add_argument("--no-cuda-graphs", action="store_true", help="run specdec's forwards eagerly on CUDA too")
    ap.add_argument("--out", default="bench_out", help="output folder (default: bench_out/)")
    ap.add_argument("--report-from", default=None, help="rebuild the Markdown and HTML of a results.json, run nothing")
    a = ap.parse_args(argv)
    prompts = read_prompts(a.prompts) if a.prompts else list(DEFAULT_PROMPTS)
    n_prompts = a.num_prompts or (4 if a.quick else len(prompts))
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = BenchConfig(
        model=a.model, heads=a.heads, device=device, dtype=a.dtype, prompts=prompts[:n_prompts],
        max_new_tokens=a.max_new_tokens or (64 if a.quick else 128), repeats=a.repeats or (2 if a.quick else 3),
        warmup=a.warmup, methods=tuple(a.methods.split(",")) if a.methods else None, temperature=a.temperature,
        top_p=a.top_p, stop_at_eos=a.stop_at_eos, threads=a.threads or (os.cpu_count() if device == "cpu" else None),
        seed=a.seed, lookup=a.lookup, cuda_graphs=not a.no_cuda_graphs)
    try:
        cfg.check()
    except ValueError as e:
        ap.error(str(e))
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
