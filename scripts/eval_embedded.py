"""Every figure of the embedded model's card, for the model in assets/ or any other one, next to its target.

    python scripts/eval_embedded.py --json assets/logs/eval_embedded.json          # the shipped model
    python scripts/eval_embedded.py --model runs/gpu/model --heads runs/gpu/heads   # a candidate

Measures, on this machine:
- bits per byte over `assets/heldout_python.jsonl` (one `{"name", "text"}` record per module written
  by hand for evaluation, never part of a training corpus, which is the Python source of installed
  packages): the total NLL in bits divided by the texts' UTF-8 bytes, the figure that compares
  models with different tokenizers;
- held-out loss in nats/token (and bits per byte) over validation-split modules of the local
  Python installation (split by a hash of the file path, as in training);
- greedy tau with the heads alone on the shipped static tree, and whether every output equals plain
  greedy decoding token for token; lossless-sampled tau at T=0.7, top-p 0.9 with the default drafting
  (dynamic tree + prompt lookup) and with the static tree, on held-out prompts and the demo prompts;
- plain decoding tokens/s (median over prompts), and the size of the model and heads folders.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import specdec  # noqa: E402
from specdec.api import DEFAULT_HEADS, DEFAULT_MODEL  # noqa: E402
from specdec.train.corpus import iter_source_files, read_text  # noqa: E402
from specdec.train.prompts import corpus_prompts  # noqa: E402

HELDOUT = ROOT / "assets" / "heldout_python.jsonl"
DEMO = ["def fibonacci(n):", "class Stack:", "import os\n\ndef list_files(path):", "def quicksort(items):"]
# The embedded model's targets, for the table at the end: (figure, key, comparison, value).
TARGETS = [("held-out loss (validation modules), nats/token", "valid_nats_per_token", "<=", 2.0),
           ("bits per byte, hand-written held-out Python", "heldout_bits_per_byte", "<=", 1.0),
           ("sampled tau, T=0.7 top-p 0.9, default drafting", "sampled_tau_default", ">=", 2.3),
           ("greedy tau, heads alone", "greedy_tau_heads", ">=", 3.5),
           ("plain decoding on this CPU, tokens/s", "plain_tokens_per_second", ">=", 30.0),
           ("model + heads size, MB", "size_mb", "<=", 64.0)]


def heldout_texts(path: Path = HELDOUT) -> list[tuple[str, str]]:
    """The held-out modules as (name, text), in the file's order."""
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [(r["name"], r["text"]) for r in records]


@torch.inference_mode()
def text_nll(model, ids: list[int], context: int) -> tuple[float, int]:
    """Total NLL in nats of ids[1:] given ids[0] and what precedes each token, within the model's context.

    Windows of `context` tokens advance by half a context; each token is scored once, in the first
    window where it has at least half a context before it (or all there is). -> (nats, tokens scored)
    """
    x = torch.tensor(ids)
    total, scored, stride = 0.0, 0, max(1, context // 2)
    start = 0
    while scored < len(ids) - 1:
        window = x[start : start + context]
        logits = model(window[None]).logits[0, :-1].float()  # [w-1, V]: predictions of window[1:]
        nll = torch.nn.functional.cross_entropy(logits, window[1:], reduction="none")  # [w-1]
        first = scored + 1 - start - 1  # index in nll of the first token not scored yet
        total += float(nll[first:].sum())
        scored += len(nll) - first
        start += stride
    return total, scored


def bits_per_byte(model, tokenizer, texts: list[str], context: int) -> dict:
    """NLL of each text (after an EOS, as training separates files) in bits per UTF-8 byte, and in nats per token."""
    nats, tokens, nbytes = 0.0, 0, 0
    for text in texts:
        ids = [tokenizer.eos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
        n, t = text_nll(model, ids, context)
        nats, tokens, nbytes = nats + n, tokens + t, nbytes + len(text.encode("utf-8"))
    return {"texts": len(texts), "bytes": nbytes, "tokens": tokens, "nats_per_token": nats / tokens,
            "bits_per_byte": nats / math.log(2) / nbytes}


def validation_texts(n: int, max_chars: int = 20_000, seed: int = 0) -> list[str]:
    """n validation-split modules of the local Python installation, in a seeded order, each cut to max_chars."""
    files = sorted((f for f in iter_source_files() if f.split == "valid"), key=lambda f: f.rel)
    random.Random(seed).shuffle(files)
    out = []
    for f in files:
        text = read_text(f)
        if text and len(text) > 500:
            out.append(text[:max_chars])
        if len(out) >= n:
            break
    return out


def mean_tau(loaded, prompts: list[list[int]], tokens: int, **kw) -> tuple[float, list]:
    runs = [specdec.generate(loaded, prompt_ids=ids, max_new_tokens=tokens, eos_token_id=None, **kw) for ids in prompts]
    return statistics.mean(r.stats["mean_accepted_length"] for r in runs), runs


def plain_speed(loaded, prompts: list[list[int]], tokens: int) -> float:
    speeds = []
    for ids in prompts:
        start = time.perf_counter()
        specdec.generate(loaded, prompt_ids=ids, max_new_tokens=tokens, eos_token_id=None, speculative=False)
        speeds.append(tokens / (time.perf_counter() - start))
    return statistics.median(speeds)


def folder_mb(*folders) -> float:
    return sum(p.stat().st_size for d in folders for p in Path(d).rglob("*") if p.is_file()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: the embedded one)")
    ap.add_argument("--heads", default=None, help="heads folder (default: the embedded ones)")
    ap.add_argument("--prompts", type=int, default=12, help="held-out corpus prompts (plus the demo prompts)")
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--valid-files", type=int, default=60, help="validation modules for the held-out loss")
    ap.add_argument("--tree", default="trained", help="the static tree for the heads-alone figures")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model_dir, heads_dir = a.model or str(DEFAULT_MODEL), a.heads or str(DEFAULT_HEADS)
    loaded = specdec.load(model_dir, heads_dir)
    model, tok = loaded.model, loaded.tokenizer
    tok.model_max_length = 1 << 30  # whole files are tokenised here; the windows respect the context
    context = int(getattr(model.config, "max_position_embeddings", 512))
    shown = [os.path.relpath(d, ROOT) if Path(d).resolve().is_relative_to(ROOT) else d for d in (model_dir, heads_dir)]
    out: dict = {"model": shown[0], "heads": shown[1], "params": sum(p.numel() for p in model.parameters()),
                 "vocab_size": len(tok), "context": context, "threads": torch.get_num_threads()}

    texts = [text for _, text in heldout_texts()]
    out["heldout"] = bits_per_byte(model, tok, texts, context)
    out["heldout_bits_per_byte"] = out["heldout"]["bits_per_byte"]
    out["valid"] = bits_per_byte(model, tok, validation_texts(a.valid_files), context)
    out["valid_nats_per_token"] = out["valid"]["nats_per_token"]
    print(f"bits/byte held-out {out['heldout_bits_per_byte']:.3f}; validation modules "
          f"{out['valid_nats_per_token']:.3f} nats/token, {out['valid']['bits_per_byte']:.3f} bits/byte")

    held = corpus_prompts(tok, "valid", a.prompts, a.prompt_len, seed=123).tolist()
    prompts = held + [tok(p, add_special_tokens=False)["input_ids"] for p in DEMO]
    greedy_tau, runs = mean_tau(loaded, prompts, a.max_new_tokens, tree=a.tree, lookup=0)
    plain = [specdec.generate(loaded, prompt_ids=ids, max_new_tokens=a.max_new_tokens, eos_token_id=None,
                              speculative=False).token_ids for ids in prompts]
    out["greedy_tau_heads"] = greedy_tau
    out["greedy_identical_to_plain"] = all(r.token_ids == p for r, p in zip(runs, plain))
    sampled = dict(temperature=0.7, top_p=0.9)
    out["sampled_tau_default"] = statistics.mean(
        mean_tau(loaded, [ids], a.max_new_tokens, seed=i, **sampled)[0] for i, ids in enumerate(prompts))
    out["sampled_tau_static_tree"] = statistics.mean(
        mean_tau(loaded, [ids], a.max_new_tokens, seed=i, tree=a.tree, lookup=0, **sampled)[0]
        for i, ids in enumerate(prompts))
    out["plain_tokens_per_second"] = plain_speed(loaded, prompts[:6], a.max_new_tokens)
    out["size_mb"] = folder_mb(model_dir, heads_dir)
    print(f"tau: greedy (heads alone, {a.tree} tree) {greedy_tau:.2f}, identical to plain: "
          f"{out['greedy_identical_to_plain']}; sampled T=0.7 default drafting {out['sampled_tau_default']:.2f}, "
          f"{a.tree} tree {out['sampled_tau_static_tree']:.2f}; plain {out['plain_tokens_per_second']:.0f} tokens/s")

    print("\n| figure | measured | target | met |\n| --- | ---: | ---: | --- |")
    for name, key, op, value in TARGETS:
        met = out[key] <= value if op == "<=" else out[key] >= value
        print(f"| {name} | {out[key]:.3f} | {op} {value:g} | {'yes' if met else 'no'} |")
    out["targets_met"] = {key: (out[key] <= v if op == "<=" else out[key] >= v) for _, key, op, v in TARGETS}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
