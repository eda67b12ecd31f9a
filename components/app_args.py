"""The app's command line: model, server, queue, prefix cache and batching flags, checked with named errors."""
from __future__ import annotations

import argparse
import os

import specdec
from specdec.prefix_cache import PrefixCache


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="specdec demo: watch speculative decoding round by round")
    p.add_argument("--model", default=os.environ.get("SPECDEC_MODEL"),
                   help="hub id or local path (default: $SPECDEC_MODEL, else the embedded model)")
    p.add_argument("--heads", default=os.environ.get("SPECDEC_HEADS"),
                   help="heads folder, hub repo id or 'random' (default: $SPECDEC_HEADS, else the embedded heads)")
    # Spaces set GRADIO_SERVER_NAME/PORT; locally we serve on 127.0.0.1:7860.
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--queue-size", type=int, default=16)
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory budget of the prefix KV cache (LRU), in MiB (default: 256)")
    p.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt from scratch")
    p.add_argument("--max-batch-size", type=int, default=specdec.scheduler.DEFAULT_MAX_BATCH_SIZE,
                   help="requests decoded together, one target forward per round (1: one at a time; default: %(default)s)")
    p.add_argument("--threads", default=os.environ.get("SPECDEC_THREADS", "auto"),
                   help="torch intra-op threads on a CPU: 'auto' (default: one where one runs the model's forwards "
                        "within 25%% of all of them, measured at start; the web server needs the other cores) or a count")
    p.add_argument("--engine-process", default=os.environ.get("SPECDEC_ENGINE_PROCESS", "auto"),
                   choices=("auto", "on", "off"),
                   help="run the model and its scheduler in their own process, so the web server's Python does not "
                        "share a GIL with the rounds ('auto', the default: on a CPU; not under ZeroGPU, whose "
                        "spaces.GPU needs the model in the handler's process)")
    p.add_argument("--chaos", type=float, default=0.0, metavar="FRACTION",
                   help="testing only: make about this fraction of requests fail mid-stream (loadtest.py --chaos)")
    args = p.parse_args(argv)
    if args.max_prompt_tokens < 1:
        p.error(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    if args.queue_size < 1:
        p.error(f"--queue-size must be >= 1, got {args.queue_size}")
    if args.max_batch_size < 1:
        p.error(f"--max-batch-size must be >= 1, got {args.max_batch_size}")
    if args.threads != "auto":
        given = args.threads
        args.threads = int(given) if given.strip().lstrip("-").isdigit() else 0
        if args.threads < 1:
            p.error(f"--threads must be 'auto' or an integer >= 1, got {given!r}")
    if not 0 <= args.chaos <= 1:
        p.error(f"--chaos must be in [0, 1], got {args.chaos}")
    if args.prefix_cache_mb <= 0:
        p.error(f"--prefix-cache-mb must be > 0, got {args.prefix_cache_mb} (use --no-prefix-cache to switch it off)")
    return args


def prefix_cache_bytes(args: argparse.Namespace) -> int | None:
    """The prefix cache's budget in bytes (None: no cache)."""
    return None if args.no_prefix_cache else int(args.prefix_cache_mb * 2**20)


def prefix_cache(args: argparse.Namespace) -> PrefixCache | None:
    cache = prefix_cache_bytes(args)
    return None if cache is None else PrefixCache(max_bytes=cache)
