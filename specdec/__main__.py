"""The `specdec` command (also `python -m specdec`).

    specdec generate --prompt "def fibonacci(n):" [options]
    specdec train {tokenizer,data,lm,heads,tree} ...      (= python -m specdec.train ...)
    specdec export-heads --heads DIR --format {vllm,medusa,specdec} --out DIR [--model M]
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # the training CLI keeps its own parser and help
        from .train.__main__ import main as train_main

        return train_main(argv[1:])
    ap = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding with Medusa heads.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("train", help="train a tokenizer, LM, heads or tree (`specdec train --help`)", add_help=False)
    x = sub.add_parser("export-heads", help="write heads in vLLM's or FasterDecoding's Medusa layout (or specdec's)")
    x.add_argument("--heads", required=True, help="heads folder (any layout specdec reads) or hub repo id")
    x.add_argument("--format", required=True, choices=["vllm", "medusa", "specdec"])
    x.add_argument("--out", required=True, help="output folder")
    x.add_argument("--model", default=None,
                   help="the target model; needed when the heads share its lm_head (copied into each head)")
    x.add_argument("--dtype", default=None, help="weights dtype on disk (default: as stored)")
    g = sub.add_parser("generate", help="generate text and print it (or JSON)")
    g.add_argument("--model", default=None, help="hub id or local path (default: the embedded model in assets/)")
    g.add_argument("--heads", default=None, help="heads folder, 'random', or omit (embedded heads for the default model)")
    g.add_argument("--prompt", default=None)
    g.add_argument("--prompt-ids", default=None, help="comma-separated token ids instead of --prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--tree", default="auto", help="auto, trained, chain, small, default or none (root only: prompt lookup drafts everything)")
    g.add_argument("--lookup", type=int, default=None,
                   help="prompt-lookup tokens drafted per round (0 = heads only; default 10, specdec.lookup.DEFAULT_LOOKUP)")
    # Values are checked once, by the GenerationRequest that `generate` builds (not by argparse too).
    g.add_argument("--lookup-mode", default="first",
                   help="first: a round with an n-gram match drafts from lookup alone; merge: heads' tree + lookup")
    g.add_argument("--acceptance", default="auto", help="auto, greedy, lossless or typical (lossy)")
    g.add_argument("--no-speculation", action="store_true", help="plain autoregressive decoding (the baseline)")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as one user turn through the tokenizer's chat template")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", default=None)
    g.add_argument("--json", action="store_true", help="print the full result (token_ids, text, stats, rounds) as JSON")
    a = ap.parse_args(argv)
    if a.cmd == "export-heads":
        return export_heads(a)

    import specdec

    try:
        loaded = specdec.load(a.model, a.heads, device=a.device, dtype=a.dtype)
        ids = None
        if a.prompt_ids:
            ids = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
        res = specdec.generate(loaded, prompt=a.prompt, prompt_ids=ids, max_new_tokens=a.max_new_tokens,
                               temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                               seed=a.seed, tree=a.tree, speculative=not a.no_speculation,
                               acceptance=a.acceptance,
                               lookup=specdec.api.DEFAULT_LOOKUP if a.lookup is None else a.lookup,
                               lookup_mode=a.lookup_mode, chat=a.chat)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res.to_dict()))
    else:
        print((a.prompt or "") + res.text)
        s = res.stats
        print(f"\n[{s['new_tokens']} tokens, {s['target_forwards']} target forwards, "
              f"mean accepted length {s['mean_accepted_length']:.2f}, {s['tokens_per_second']:.1f} tok/s]",
              file=sys.stderr)
    return 0


def export_heads(a: argparse.Namespace) -> int:
    """Read heads in any layout and write them in another; shared projections become per-head copies."""
    from .api import heads_folder, resolve_dtype
    from .heads_io import read_heads, write_heads

    try:
        folder = heads_folder(a.heads)
        dtype = resolve_dtype(a.dtype, __import__("torch").device("cpu")) if a.dtype else None
        target = None
        if a.model is not None:  # only its lm_head is needed: no tokenizer, no engine
            from transformers import AutoModelForCausalLM

            try:
                target = AutoModelForCausalLM.from_pretrained(a.model, dtype="float32")
            except OSError as e:
                raise ValueError(f"cannot load model {a.model!r}: {e}") from e
        heads, tree, _ = read_heads(folder, target)
        base = a.model
        out = write_heads(heads, a.out, a.format, tree=tree, base_model=base, dtype=dtype)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = heads.config
    print(f"wrote {c.num_heads} heads x {c.num_layers} blocks (hidden {c.hidden_size}, vocab {c.vocab_size}) "
          f"in the {a.format} layout to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
