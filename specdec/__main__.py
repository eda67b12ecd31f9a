"""The `specdec` command (also `python -m specdec`).

    specdec generate --prompt "def fibonacci(n):" [options]
    specdec serve [--model M] [--port 8000] [--ui]        an OpenAI-compatible server
    specdec app [--model M] [--port 7860]                   the Gradio demo (pip install 'specdec[app]')
    specdec train {tokenizer,data,lm,heads,tree} ...
    specdec export-heads --heads DIR --format {vllm,medusa,specdec,eagle3,speculators} --out DIR [--model M]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .cli import DEFAULTS, demo_module


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # These keep their own parsers and help.
    if argv[:1] == ["train"]:
        from .train.__main__ import main as train_main

        return train_main(argv[1:], prog="specdec train")
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    if argv[:1] == ["app"]:
        try:
            demo = demo_module()
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        demo.main(argv[1:])
        return 0
    ap = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for HF causal LMs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="an OpenAI-compatible server (`specdec serve --help`)", add_help=False)
    sub.add_parser("app", help="the Gradio demo (`specdec app --help`; needs specdec[app])", add_help=False)
    sub.add_parser("train", help="train a tokenizer, LM, heads or tree (`specdec train --help`)", add_help=False)
    x = sub.add_parser("export-heads", formatter_class=DEFAULTS,
                       help="write Medusa heads in vLLM's or FasterDecoding's layout (or specdec's), or an "
                            "EAGLE-3 drafter in SafeAILab's (vLLM's, SGLang's) or speculators' layout")
    x.add_argument("--heads", required=True, help="heads folder (any layout specdec reads) or hub repo id")
    x.add_argument("--format", required=True, choices=["vllm", "medusa", "specdec", "eagle3", "speculators"])
    x.add_argument("--out", required=True, help="output folder")
    x.add_argument("--model", default=None,
                   help="the target model (hub id or path); needed when the heads share its lm_head")
    x.add_argument("--dtype", default=None, help="weights dtype on disk (default: as stored)")
    g = sub.add_parser("generate", help="generate text and print it (or JSON)", formatter_class=DEFAULTS)
    g.add_argument("--model", default=None, help="hub id or local path (default: the embedded model)")
    g.add_argument("--heads", default=None, help="Medusa heads or an EAGLE-3 drafter: a folder, hub id, 'random', "
                                                 "or omit (the embedded model's two drafters)")
    g.add_argument("--drafter", default="auto", help="auto (the model's default), medusa or eagle3")
    g.add_argument("--prompt", default=None)
    g.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of --prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--tree", default="auto", help="auto, trained, chain, small, default or none (root only: prompt "
                                                  "lookup drafts everything)")
    g.add_argument("--lookup", type=int, default=None,
                   help="prompt-lookup tokens drafted per round (0 = heads only; default: specdec's, 10)")
    g.add_argument("--lookup-mode", default="first",
                   help="first: a round with an n-gram match drafts from lookup alone; merge: heads' tree + lookup")
    g.add_argument("--acceptance", default="auto", help="auto, greedy, lossless or typical (lossy)")
    g.add_argument("--no-speculation", action="store_true", help="plain autoregressive decoding (the baseline)")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as one user turn through the tokenizer's chat template")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda when present)")
    g.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on CUDA, else fp32)")
    g.add_argument("--json", action="store_true", help="print the text and stats as one JSON object")
    g.add_argument("--events", action="store_true", help="print every round event as one JSON line (JSON Lines)")
    a = ap.parse_args(argv)
    if a.cmd == "export-heads":
        return export_heads(a)
    try:
        request = check_generate(a)  # everything that needs no model, before any weights are read
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return generate(a, request)


def check_generate(a: argparse.Namespace) -> dict:
    """The generate flags checked without the model: the keyword arguments for `specdec.generate`."""
    from . import hub
    from .api import resolve_device, resolve_dtype
    from .lookup import DEFAULT_LOOKUP
    from .request import GenerationRequest
    from .sampler import SamplingParams

    ids = None
    if a.prompt_ids is not None:
        if a.prompt is not None or a.chat:
            raise ValueError("`--prompt-ids` is raw token ids: give it without --prompt and --chat")
        try:
            ids = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"`--prompt-ids` must be comma-separated integers, got {a.prompt_ids!r}") from None
    elif a.prompt is None or not a.prompt.strip():
        raise ValueError("`--prompt` is empty: give some text (or --prompt-ids)")
    params = SamplingParams(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p, seed=a.seed)
    lookup = DEFAULT_LOOKUP if a.lookup is None else a.lookup
    GenerationRequest(ids or [0], a.max_new_tokens, params, a.tree, not a.no_speculation, a.acceptance, "auto", lookup,
                      3, a.lookup_mode, drafter=a.drafter)  # ids are checked against the vocabulary after loading
    resolve_dtype(a.dtype, resolve_device(a.device))
    if a.model is not None:
        hub.check(a.model, "model")
    if a.heads not in (None, "random"):
        hub.check(a.heads, "heads")
    return dict(prompt=a.prompt, prompt_ids=ids, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                top_k=a.top_k, top_p=a.top_p, min_p=a.min_p, seed=a.seed, tree=a.tree,
                speculative=not a.no_speculation, acceptance=a.acceptance, lookup=lookup,
                lookup_mode=a.lookup_mode, chat=a.chat, drafter=a.drafter)


def generate(a: argparse.Namespace, request: dict) -> int:
    """Load, set up (the dynamic tree's cost model is measured on first use), then generate and report."""
    import specdec

    t0 = time.perf_counter()
    try:
        loaded = specdec.load(a.model, a.heads, device=a.device, dtype=a.dtype)
        t1 = time.perf_counter()
        if request["speculative"] and request["tree"] == "auto":
            loaded.scheduler.call(loaded.engine.cost_model)
        t2 = time.perf_counter()
        res = specdec.generate(loaded, **request)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if "loaded" in locals() and loaded.serving:
            loaded.scheduler.close()
    s = res.stats
    if a.events:
        for ev in res.rounds:
            print(json.dumps(ev.to_dict()))
    if a.json:
        print(json.dumps({"text": res.text, "token_ids": res.token_ids, "stats": s,
                          "load_seconds": t1 - t0, "setup_seconds": t2 - t1}))
    elif not a.events:
        print((a.prompt or "") + res.text)
    from .stats import summarize

    dec = summarize(res.rounds)["decode_tokens_per_second"]
    print(f"\n[{s['new_tokens']} tokens, {s['target_forwards']} target forwards, mean accepted length "
          f"{s['mean_accepted_length']:.2f}; decode {dec or 0:.1f} tok/s; load {t1 - t0:.1f} s, setup "
          f"{t2 - t1:.1f} s, first token {res.rounds[0].timings.get('total', 0):.0f} ms]", file=sys.stderr)
    return 0


def export_heads(a: argparse.Namespace) -> int:
    """Read heads in any layout and write them in another."""
    from . import hub
    from .api import heads_folder, resolve_dtype
    from .heads_io import read_heads, stored_dtype, write_heads

    from . import eagle_io

    try:
        folder = heads_folder(a.heads)
        if eagle_io.detect(folder) or a.format in eagle_io.FORMATS:
            return _export_eagle(a, folder)
        dtype = resolve_dtype(a.dtype, __import__("torch").device("cpu")) if a.dtype else stored_dtype(folder)
        target = None
        if a.model is not None:  # only its lm_head is needed: no tokenizer, no engine
            from transformers import AutoModelForCausalLM

            target = hub.pretrained(AutoModelForCausalLM, a.model, "model", dtype="float32")
        heads, tree, _ = read_heads(folder, target)
        out = write_heads(heads, a.out, a.format, tree=tree, base_model=a.model, dtype=dtype)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = heads.config
    print(f"wrote {c.num_heads} heads x {c.num_layers} blocks (hidden {c.hidden_size}, vocab {c.vocab_size}) "
          f"in the {a.format} layout to {out}", file=sys.stderr)
    return 0


def _export_eagle(a: argparse.Namespace, folder: str) -> int:
    """An EAGLE-3 drafter in another of its layouts."""
    from . import eagle_io, hub
    from .api import resolve_dtype

    if not eagle_io.detect(folder):
        raise ValueError(f"--format {a.format} writes an EAGLE-3 drafter, and {a.heads!r} holds Medusa heads")
    if a.format not in eagle_io.FORMATS:
        raise ValueError(f"{a.heads!r} holds an EAGLE-3 drafter: --format must be one of {eagle_io.FORMATS}")
    target = None
    if a.model is not None:
        from transformers import AutoModelForCausalLM

        target = hub.pretrained(AutoModelForCausalLM, a.model, "model", dtype="float32")
    drafter, shape, _ = eagle_io.read_eagle(folder, target)
    dtype = resolve_dtype(a.dtype, __import__("torch").device("cpu")) if a.dtype else None
    out = eagle_io.save_eagle(drafter, a.out, shape, dtype=dtype, layout=a.format)
    c = drafter.config
    print(f"wrote an EAGLE-3 drafter (hidden {c.hidden_size}, draft vocabulary {c.draft_vocab_size} of "
          f"{c.vocab_size}, layers {list(c.layers) if c.layers else 'the engine default'}) in the {a.format} layout "
          f"to {out}", file=sys.stderr)
    return 0


def serve_args(argv: list[str] | None = None) -> argparse.Namespace:
    """`specdec serve`'s flags, each value checked before a model loads (an error names the flag)."""

    import torch

    from .api import resolve_dtype
    from .scheduler import DEFAULT_MAX_BATCH_SIZE

    p = argparse.ArgumentParser(prog="specdec serve", formatter_class=DEFAULTS, description="an OpenAI-compatible server on specdec's "
                                "scheduler: /v1/completions, /v1/chat/completions, /v1/models, /metrics, /health")
    p.add_argument("--model", default=None, help="hub id or local path (default: the embedded model)")
    p.add_argument("--heads", default=None, help="heads folder, hub repo id or 'random' (default: the embedded heads)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--max-batch-size", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                   help="requests decoded together, one target forward per round (default: %(default)s)")
    p.add_argument("--prefix-cache-mb", type=float, default=256.0, help="the prefix KV cache's budget in MiB")
    p.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt from scratch")
    p.add_argument("--engine-process", default="auto", choices=("auto", "on", "off"),
                   help="run the model in its own process, so that the server's Python shares no GIL with the "
                        "rounds (auto, the default: on a CPU)")
    p.add_argument("--threads", default="auto", help="torch threads on a CPU: 'auto' (measured at start) or a count")
    p.add_argument("--ui", action="store_true", help="also serve the Gradio app, at /")
    args = p.parse_args(argv)
    if not 1 <= args.port <= 65535:
        p.error(f"--port must be in [1, 65535], got {args.port}")
    if args.max_batch_size < 1:
        p.error(f"--max-batch-size must be >= 1, got {args.max_batch_size}")
    if not args.prefix_cache_mb > 0:
        p.error(f"--prefix-cache-mb must be > 0, got {args.prefix_cache_mb} (use --no-prefix-cache to switch it off)")
    if args.threads != "auto":
        given, args.threads = args.threads, int(args.threads) if args.threads.strip().isdigit() else 0
        if args.threads < 1:
            p.error(f"--threads must be 'auto' or an integer >= 1, got {given!r}")
    from . import hub
    from .api import resolve_device

    checks = (("--device", lambda: resolve_device(args.device)),
              ("--dtype", lambda: resolve_dtype(args.dtype, torch.device("cpu"))),
              ("--model", lambda: args.model is None or hub.check(args.model, "model")),
              ("--heads", lambda: args.heads in (None, "random") or hub.check(args.heads, "heads")))
    for flag, check in checks:
        try:
            check()
        except ValueError as e:
            p.error(f"{flag}: {e}")
    return args


def serve(argv: list[str] | None = None) -> int:
    """`specdec serve [flags]`: load the model, then serve until interrupted; the exit code."""
    import uvicorn

    from . import engine_process
    from .metrics import Metrics
    from .serve import build_server

    args = serve_args(argv)
    try:
        ui = demo_module() if args.ui else None  # refused now, not after the model has loaded
        loaded, remote, line = engine_process.serving_model(
            args.engine_process, args.threads, None if args.no_prefix_cache else int(args.prefix_cache_mb * 2**20),
            model=args.model, heads=args.heads, device=args.device, dtype=args.dtype,
            max_batch_size=args.max_batch_size)
    except (ValueError, RuntimeError) as e:  # a model, heads or device specdec refuses: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        metrics = Metrics()
        app = build_server(loaded, metrics=metrics, ui=ui.build_demo(loaded, metrics=metrics) if ui else None)
        if not remote:  # measured now, on the scheduler's thread, not in the first request (an engine process does)
            loaded.scheduler.call_soon(loaded.engine.cost_model)
        print(f"engine: {'its own process' if remote else 'in the server process'}" + (f"; {line}" if line else ""),
              flush=True)
        print(f"serving {loaded.name} at http://{args.host}:{args.port}/v1" + (" and the app at /" if ui else ""),
              flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        (loaded.close if remote else loaded.scheduler.close)()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
