"""`python -m specdec.train {tokenizer,data,lm,heads} ...`

Reproduces the embedded model in assets/ (see assets/README.md for the
exact commands) and trains Medusa heads for any HF causal LM.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path


def _logging(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        handlers=[logging.FileHandler(path), logging.StreamHandler(sys.stderr)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec.train", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tokenizer", help="train a byte-level BPE on the local Python corpus")
    t.add_argument("--out", required=True)
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--max-chars", type=int, default=60_000_000)

    d = sub.add_parser("data", help="tokenise the local Python corpus into train/valid arrays")
    d.add_argument("--tokenizer", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--max-chars", type=int, default=300_000_000)

    m = sub.add_parser("lm", help="train the Llama backbone")
    m.add_argument("--data", required=True)
    m.add_argument("--tokenizer", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--device", default="cuda" if _cuda() else "cpu")
    m.add_argument("--max-seconds", type=float, default=0.0)
    m.add_argument("--max-tokens", type=int, default=0)
    m.add_argument("--hidden-size", type=int, default=256)
    m.add_argument("--num-layers", type=int, default=8)
    m.add_argument("--num-heads", type=int, default=4)
    m.add_argument("--intermediate-size", type=int, default=768)
    m.add_argument("--batch-size", type=int, default=64)
    m.add_argument("--seq-len", type=int, default=512)
    m.add_argument("--lr", type=float, default=2e-3)
    m.add_argument("--context", type=int, default=1024)
    m.add_argument("--warmup-steps", type=int, default=300)
    m.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch default)")
    m.add_argument("--no-resume", action="store_true")

    h = sub.add_parser("heads", help="train Medusa heads for any HF causal LM (backbone frozen)")
    h.add_argument("--model", required=True, help="hub id or local path")
    h.add_argument("--out", required=True)
    h.add_argument("--device", default="cuda" if _cuda() else "cpu")
    h.add_argument("--num-heads", type=int, default=4)
    h.add_argument("--num-layers", type=int, default=1)
    h.add_argument("--shared-lm-head", action="store_true", help="reuse the model's lm_head (small on disk)")
    h.add_argument("--num-seqs", type=int, default=4096)
    h.add_argument("--valid-seqs", type=int, default=256)
    h.add_argument("--prompt-len", type=int, default=48)
    h.add_argument("--gen-len", type=int, default=192)
    h.add_argument("--gen-batch", type=int, default=256)
    h.add_argument("--batch-size", type=int, default=32)
    h.add_argument("--lr", type=float, default=1e-3)
    h.add_argument("--max-seconds", type=float, default=120.0)
    h.add_argument("--max-steps", type=int, default=0)

    tr = sub.add_parser("tree", help="pick the tree for trained heads: best expected length per ms on this machine")
    tr.add_argument("--model", required=True)
    tr.add_argument("--heads", required=True, help="heads folder with heads_metrics.json beside or inside it")
    tr.add_argument("--variant", default=None, help="variant key inside heads_metrics.json")
    tr.add_argument("--threads", type=int, default=0)
    tr.add_argument("--measure", default=None,
                    help="a data folder (from `data`): pick by measured end-to-end tokens/s on its held-out split")
    tr.add_argument("--measure-prompts", type=int, default=8)
    tr.add_argument("--measure-tokens", type=int, default=96)
    tr.add_argument("--lookup", type=int, default=10, help="prompt lookup while measuring (the product default)")

    a = ap.parse_args(argv)
    if a.cmd == "tree":
        if a.measure is not None:
            from ..lookup import MAX_LOOKUP
            if a.measure_prompts < 1 or a.measure_tokens < 1 or not 0 <= a.lookup <= MAX_LOOKUP:
                ap.error(f"tree: --measure-prompts and --measure-tokens must be >= 1 and --lookup in "
                         f"[0, {MAX_LOOKUP}]")
            if not (Path(a.measure) / "valid.npy").is_file():
                ap.error(f"tree: --measure {a.measure!r} has no valid.npy (a folder written by `data`)")
        return _tree(a)
    out = Path(a.out)
    _logging(out / "train.log" if a.cmd != "tokenizer" else out.parent / "tokenizer.log")
    if a.cmd == "tokenizer":
        from .tokenizer import train_tokenizer
        train_tokenizer(out, a.vocab_size, a.max_chars)
    elif a.cmd == "data":
        from transformers import AutoTokenizer

        from .data import build_token_arrays
        info = build_token_arrays(AutoTokenizer.from_pretrained(a.tokenizer), out, a.max_chars)
        print(json.dumps({k: v for k, v in info.items() if k in ("train", "valid")}))
    elif a.cmd == "lm":
        from transformers import AutoTokenizer

        from .lm import LMConfig, train_lm
        cfg = LMConfig(hidden_size=a.hidden_size, num_layers=a.num_layers, num_heads=a.num_heads,
                       intermediate_size=a.intermediate_size, batch_size=a.batch_size, seq_len=a.seq_len,
                       lr=a.lr, max_seconds=a.max_seconds, max_tokens=a.max_tokens, context=a.context,
                       warmup_steps=a.warmup_steps)
        if a.threads:
            import torch
            torch.set_num_threads(a.threads)
        metrics = train_lm(a.data, AutoTokenizer.from_pretrained(a.tokenizer), out, cfg, a.device,
                           resume=not a.no_resume)
        print(json.dumps({k: v for k, v in metrics.items() if k != "config"}))
    elif a.cmd == "heads":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .medusa import train_heads
        if (os.path.sep in a.model or a.model.startswith(".")) and not os.path.isdir(a.model):
            ap.error(f"--model path {a.model!r} does not exist")
        try:
            model = AutoModelForCausalLM.from_pretrained(a.model, dtype="float32")
            tok = AutoTokenizer.from_pretrained(a.model)
        except OSError as e:
            ap.error(f"cannot load --model {a.model!r}: {e}")
        variant = {"num_heads": a.num_heads, "num_layers": a.num_layers, "shared_lm_head": a.shared_lm_head}
        metrics = train_heads(model, tok, out, {"heads": variant}, num_seqs=a.num_seqs, prompt_len=a.prompt_len,
                              gen_len=a.gen_len, gen_batch=a.gen_batch, batch=a.batch_size, lr=a.lr,
                              max_seconds=a.max_seconds, max_steps=a.max_steps, valid_seqs=a.valid_seqs,
                              device=a.device)
        v = metrics["variants"]["heads"]
        print(json.dumps({"top1": v["top1"], "top5": v["top5"], "out": str(out / "heads")}))
    return 0


def _tree(a) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from ..heads import load_heads
    from .medusa import choose_tree
    if a.threads:
        torch.set_num_threads(a.threads)
    heads_dir = Path(a.heads)
    mpath = next((p for p in (heads_dir / "heads_metrics.json", heads_dir.parent / "heads_metrics.json") if p.is_file()), None)
    if mpath is None:
        raise SystemExit(f"no heads_metrics.json in {heads_dir} or its parent")
    metrics = json.loads(mpath.read_text())
    variant = a.variant or heads_dir.name
    acc = metrics["variants"][variant]["acc"]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    heads, _ = load_heads(heads_dir, model)
    result = choose_tree(acc, model)
    if a.measure:
        import numpy as np

        from .. import api
        from .medusa import measure_trees
        valid = np.load(Path(a.measure) / "valid.npy", mmap_mode="r")
        if len(valid) < 32 * a.measure_prompts:
            raise SystemExit(f"tree: {a.measure}/valid.npy has {len(valid)} tokens, too few for "
                             f"{a.measure_prompts} prompts of 32")
        stride = len(valid) // a.measure_prompts
        prompts = [[int(t) for t in valid[i * stride : i * stride + 32]] for i in range(a.measure_prompts)]
        loaded = api.load(a.model, heads_dir, device="cpu", dtype="float32")
        measure_trees(loaded.engine, result["candidates"], prompts, a.measure_tokens, a.lookup)
        result["chosen_by"] = (f"measured greedy tok/s, {a.measure_prompts} held-out prompts x {a.measure_tokens} "
                               f"tokens, lookup={a.lookup}")
        result["chosen_nodes"] = max(result["candidates"], key=lambda r: r["measured_tok_s"])["nodes"]
    else:
        result["chosen_by"] = "expected length per forward ms"
    best = next(r for r in result["candidates"] if r["nodes"] == result["chosen_nodes"])
    heads.save(heads_dir, [tuple(p) for p in best["paths"]], dtype=torch.float16)
    (heads_dir / "tree_choice.json").write_text(json.dumps(result, indent=2) + "\n")
    for r in result["candidates"]:
        print(f"{r['nodes']:3d} nodes  E[L]={r['expected_length']:.2f}  forward={r['forward_ms']:.1f} ms  "
              f"{r['tokens_per_ms']:.3f} tok/ms"
              + (f"  measured {r['measured_tok_s']:.0f} tok/s" if "measured_tok_s" in r else "")
              + ("  <- chosen" if r["nodes"] == result["chosen_nodes"] else ""))
    return 0


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
