"""`specdec train {tokenizer,data,lm,heads,tree} ...` (also `python -m specdec.train`)

Reproduces the embedded model in assets/ (see assets/README.md for the
exact commands) and trains Medusa heads for any HF causal LM.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

from .. import hub
from ..cli import DEFAULTS
from .prompts import DEFAULT_FIELDS


log = logging.getLogger("specdec.train")


def _logging(path: Path) -> None:
    """specdec.train's log to `path` and stderr; a second call (another run in the same process) replaces the first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    for h in [h for h in log.handlers if getattr(h, "_specdec", False)]:
        log.removeHandler(h)
        h.close()
    for h in (logging.FileHandler(path), logging.StreamHandler(sys.stderr)):
        h.setFormatter(fmt)
        h._specdec = True
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv=None, prog: str = "python -m specdec.train") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=DEFAULTS)
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tokenizer", formatter_class=DEFAULTS, help="train a byte-level BPE on the local Python corpus")
    t.add_argument("--out", required=True)
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--max-chars", type=int, default=60_000_000)

    d = sub.add_parser("data", formatter_class=DEFAULTS, help="tokenise the local Python corpus into train/valid arrays")
    d.add_argument("--tokenizer", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--max-chars", type=int, default=300_000_000)

    m = sub.add_parser("lm", formatter_class=DEFAULTS, help="train the Llama backbone")
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

    h = sub.add_parser("heads", formatter_class=DEFAULTS, help="train Medusa heads for any HF causal LM (backbone frozen)",
                       description="Self-distil the model on prompts (your --prompts file, a --dataset, or the local "
                                   "Python corpus), train heads on its replies, write heads, metrics and a model card.")
    _common_args(h)
    h.add_argument("--num-heads", type=int, default=4)
    h.add_argument("--num-layers", type=int, default=1)
    h.add_argument("--shared-lm-head", action="store_true", help="reuse the model's lm_head (small on disk)")
    h.add_argument("--batch-size", type=int, default=32)
    h.add_argument("--lr", type=float, default=1e-3)
    h.add_argument("--max-seconds", type=float, default=120.0)

    e = sub.add_parser("eagle", formatter_class=DEFAULTS, help="train an EAGLE-3 drafter for any HF causal LM (frozen)",
                       description="Self-distil the model on prompts (your --prompts file, a --dataset, or the local "
                                   "Python corpus), train an EAGLE-3 drafter on its replies with the training-time "
                                   "test, and write it in the layout vLLM and SGLang load, with metrics and a card.")
    _common_args(e)
    e.add_argument("--draft-vocab", type=int, default=32000,
                   help="draft vocabulary: the ids most frequent in the distilled replies (all, if the model has fewer)")
    e.add_argument("--ttt-steps", type=int, default=4, help="unrolled steps of the training-time test")
    e.add_argument("--tree-budget", type=int, default=15, help="the shipped tree's drafted nodes (the root excluded)")
    e.add_argument("--tree-depth", type=int, default=5, help="the shipped tree's levels")
    e.add_argument("--tree-top-k", type=int, default=4, help="the shipped tree's children per node and nodes per level")
    e.add_argument("--batch-size", type=int, default=8)
    e.add_argument("--lr", type=float, default=2e-3)
    e.add_argument("--max-seconds", type=float, default=600.0)
    tr = sub.add_parser("tree", formatter_class=DEFAULTS, help="pick the tree for trained heads: best expected length per ms on this machine")
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
    if a.cmd in ("heads", "eagle"):
        _check_heads_args(ap, a)
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
        return _heads(ap, a, argv)
    elif a.cmd == "eagle":
        return _eagle(ap, a, argv)
    return 0


def _common_args(p) -> None:
    """The model, data and run arguments `heads` and `eagle` share."""
    p.add_argument("--model", required=True, help="hub id or local path")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--dtype", default=None, help="backbone dtype (default: bfloat16 on CUDA, float32 on CPU)")
    src = p.add_argument_group("data (default: windows of the local Python corpus)")
    src.add_argument("--prompts", default=None,
                     help="a file of prompts: .jsonl (one record per line), .json (a list of records), or text "
                          "(one prompt per line). A record is a prompt string, a chat (list of {role, content}) "
                          "or an object holding one of those (see --field)")
    src.add_argument("--dataset", default=None, help="a `datasets` name or path (needs `pip install datasets`)")
    src.add_argument("--split", default="train", help="--dataset split")
    src.add_argument("--field", default=None,
                     help=f"the record field with the prompt or chat (default: the first of {', '.join(DEFAULT_FIELDS)})")
    src.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="render prompts with the tokenizer's chat template (default: on when it has one)")
    src.add_argument("--max-prompt-len", type=int, default=256, help="--prompts/--dataset: keep the last N tokens")
    p.add_argument("--num-seqs", type=int, default=None,
                   help="training sequences (default: 4096 corpus windows, or each of your training prompts once)")
    p.add_argument("--valid-seqs", type=int, default=256,
                   help="held-out prompts (for your data: at most a tenth of the records)")
    p.add_argument("--prompt-len", type=int, default=48, help="corpus window length in tokens")
    p.add_argument("--gen-len", type=int, default=192, help="new tokens per prompt (fewer when the model ends its reply)")
    p.add_argument("--gen-batch", type=int, default=0,
                   help="rows per generate call (0 = auto: 128 on CPU, the largest that fits on CUDA)")
    p.add_argument("--greedy-frac", type=float, default=0.75, help="share of greedy rows; the rest sample at T=0.7, top-p 0.95")
    p.add_argument("--cache", default=None, help="distillation cache folder (default: OUT/distill)")
    p.add_argument("--resume", action="store_true", help="continue a cut distillation from its cached shards")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--eval-prompts", type=int, default=8, help="held-out prompts for the greedy mean accepted length (0 = skip)")
    p.add_argument("--eval-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch default)")



def _check_heads_args(ap, a) -> None:
    if a.prompts is not None and a.dataset is not None:
        ap.error(f"{a.cmd}: give --prompts or --dataset, not both")
    for name, low in (("num_seqs", 1), ("valid_seqs", 0), ("prompt_len", 1), ("max_prompt_len", 1), ("gen_len", 1),
                      ("gen_batch", 0), ("batch_size", 1), ("max_steps", 0), ("eval_prompts", 0), ("eval_tokens", 1),
                      ("num_heads", 1), ("num_layers", 0), ("threads", 0)):
        value = getattr(a, name, None)
        if value is not None and value < low:
            ap.error(f"{a.cmd}: --{name.replace('_', '-')} must be >= {low}, got {value}")
    if not 0 <= a.greedy_frac <= 1:
        ap.error(f"{a.cmd}: --greedy-frac must be in [0, 1], got {a.greedy_frac}")
    try:
        hub.check(a.model, "model")
    except ValueError as e:
        ap.error(f"{a.cmd}: {e}")


def _model_and_prompts(ap, a):
    """The frozen model, its tokenizer, and the training and held-out prompts (ids) with their source."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .prompts import (PromptSource, corpus_prompts, has_chat_template, prompt_ids, read_dataset,
                          read_prompt_file, repeat_to, split_records)
    cmd = a.cmd
    dev = torch.device(a.device)
    dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float32": torch.float32, "fp32": torch.float32}.get(a.dtype or "", None)
    if a.dtype is not None and dtype is None:
        ap.error(f"{cmd}: --dtype must be bfloat16, float16 or float32, got {a.dtype!r}")
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        model = hub.pretrained(AutoModelForCausalLM, a.model, "model", dtype=dtype)
        tok = hub.pretrained(AutoTokenizer, a.model, "model")
    except ValueError as e:
        ap.error(f"{cmd}: {e}")
    try:
        if a.prompts is None and a.dataset is None:
            if a.chat:
                ap.error(f"{cmd}: --chat needs your own prompts (--prompts or --dataset); corpus windows are raw code")
            n = a.num_seqs or 4096
            train_ids = corpus_prompts(tok, "train", n, a.prompt_len, a.seed).tolist()
            valid_ids = corpus_prompts(tok, "valid", a.valid_seqs, a.prompt_len, a.seed + 1).tolist() if a.valid_seqs else []
            source = PromptSource("corpus", "local Python corpus", n + a.valid_seqs, False)
        else:
            if a.prompts is not None:
                records, kind, name = read_prompt_file(a.prompts, a.field), "file", a.prompts
            else:
                records, kind, name = read_dataset(a.dataset, a.split, a.field), "dataset", a.dataset
            chat = has_chat_template(tok) if a.chat is None else a.chat
            if chat and not has_chat_template(tok):
                ap.error(f"{cmd}: --chat needs a chat template, and the tokenizer of {a.model!r} has none")
            train_recs, valid_recs = split_records(records, a.valid_seqs, a.seed)
            train_ids = [prompt_ids(tok, r, chat, a.max_prompt_len) for r in train_recs]
            valid_ids = [prompt_ids(tok, r, chat, a.max_prompt_len) for r in valid_recs]
            if a.num_seqs:
                train_ids = repeat_to(train_ids, a.num_seqs)
            source = PromptSource(kind, name, len(records), chat)
            log.info("%d records from %s %s (chat template: %s): %d training and %d held-out prompts",
                     len(records), kind, name, chat, len(train_ids), len(valid_ids))
    except ValueError as e:
        ap.error(f"{cmd}: {e}")
    if not valid_ids:
        ap.error(f"{cmd}: the held-out accuracy needs --valid-seqs >= 1 (and at least 2 records)")
    return model, tok, train_ids, valid_ids, source


def _heads(ap, a, argv) -> int:
    """Prompts -> distillation (cached) -> heads -> held-out accuracy and mean accepted length -> model card."""
    from .medusa import train_heads
    model, tok, train_ids, valid_ids, source = _model_and_prompts(ap, a)
    try:
        out = Path(a.out)
        variant = {"num_heads": a.num_heads, "num_layers": a.num_layers, "shared_lm_head": a.shared_lm_head}
        metrics = train_heads(model, tok, out, {"heads": variant}, prompt_len=a.prompt_len, gen_len=a.gen_len,
                              gen_batch=a.gen_batch, batch=a.batch_size, lr=a.lr, max_seconds=a.max_seconds,
                              max_steps=a.max_steps, device=a.device, seed=a.seed, train_prompts=train_ids,
                              valid_prompts=valid_ids, cache_dir=a.cache, resume=a.resume,
                              greedy_frac=a.greedy_frac)
    except ValueError as e:
        ap.error(f"heads: {e}")
    heads_dir = out / "heads"
    _evaluate_and_card(a, argv, model, tok, metrics, heads_dir, source, valid_ids, out / "heads_metrics.json", "heads")
    v = metrics["variants"]["heads"]
    print(json.dumps({"top1": v["top1"], "top5": v["top5"], "out": str(heads_dir),
                      "mean_accepted_length": metrics.get("tau", {}).get("mean_accepted_length")}))
    return 0


def _evaluate_and_card(a, argv, model, tok, metrics: dict, folder: Path, source, valid_ids, metrics_path: Path,
                       variant: str) -> None:
    """A trained drafter's greedy mean accepted length on held-out prompts, its metrics file and model card."""
    import shlex

    from .card import write_card
    from .medusa import measure_tau
    if a.eval_prompts:
        metrics["tau"] = measure_tau(model, tok, folder, valid_ids[: a.eval_prompts], a.eval_tokens, a.device)
        log.info("greedy mean accepted length on %d held-out prompts: %.2f", metrics["tau"]["prompts"],
                 metrics["tau"]["mean_accepted_length"])
    metrics["card"] = {"base_model": getattr(model.config, "_name_or_path", a.model) or a.model, "model_arg": a.model,
                       "heads_dir_hint": str(folder), "data": asdict(source),
                       "command": "python -m specdec.train " + shlex.join(sys.argv[1:] if argv is None else argv)}
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(metrics, variant, folder)


def _eagle(ap, a, argv) -> int:
    """Prompts -> distillation (cached) -> EAGLE-3 drafter -> held-out accuracy and mean accepted length -> card."""
    from ..eagle import Shape
    from .eagle import train_eagle
    try:
        shape = Shape(a.tree_budget, a.tree_depth, a.tree_top_k)
    except ValueError as e:
        ap.error(f"eagle: {e}".replace("`budget`", "--tree-budget").replace("`depth`", "--tree-depth")
                 .replace("`top_k`", "--tree-top-k"))
    if a.draft_vocab < 1 or a.ttt_steps < 1:
        ap.error("eagle: --draft-vocab and --ttt-steps must be >= 1")
    model, tok, train_ids, valid_ids, source = _model_and_prompts(ap, a)
    out = Path(a.out)
    try:
        metrics = train_eagle(model, tok, out, prompt_len=a.prompt_len, gen_len=a.gen_len, gen_batch=a.gen_batch,
                              batch=a.batch_size, lr=a.lr, steps=a.ttt_steps, max_seconds=a.max_seconds,
                              max_steps=a.max_steps, draft_vocab=a.draft_vocab, device=a.device, seed=a.seed,
                              train_prompts=train_ids, valid_prompts=valid_ids, cache_dir=a.cache, resume=a.resume,
                              greedy_frac=a.greedy_frac, shape=shape)
    except ValueError as e:
        ap.error(f"eagle: {e}")
    eagle_dir = out / "eagle3"
    _evaluate_and_card(a, argv, model, tok, metrics, eagle_dir, source, valid_ids, out / "eagle3_metrics.json",
                       "eagle3")
    print(json.dumps({"top1_by_step": metrics["top1_by_step"], "out": str(eagle_dir),
                      "mean_accepted_length": metrics.get("tau", {}).get("mean_accepted_length")}))
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
    try:
        model = hub.pretrained(AutoModelForCausalLM, a.model, "model", dtype=torch.float32).eval()
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
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
    if "card" in metrics and variant in metrics["variants"]:
        from .card import write_card
        write_card(metrics, variant, heads_dir)
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
