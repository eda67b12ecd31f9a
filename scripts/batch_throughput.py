"""Aggregate tokens/s of continuous batching at several batch sizes, in one process (the GPU benchmark's batching step).

Every size decodes the same prompts through `specdec.generate_batch` on a scheduler of that size,
greedy, exactly `--tokens` tokens each (no EOS), after one untimed warm-up pass; the figure is the
median of `--repeats` timed passes. Greedy outputs must be identical at every size (checked).

    python scripts/batch_throughput.py --model random:qwen2-0.5b --sizes 1,4,16 --out batch.json
    python scripts/batch_throughput.py --model random:tiny --device cpu --prompts 4 --tokens 16 --sizes 1,4   # dry run
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import specdec  # noqa: E402
from bench.config import DEFAULT_PROMPTS, BenchConfig  # noqa: E402
from bench.models import load_target  # noqa: E402
from specdec.api import DEFAULT_MODEL  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

MODES = {"plain": dict(speculative=False), "default": dict()}  # default: dynamic tree (if heads) + prompt lookup


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="as bench.py --model (default: embedded)")
    ap.add_argument("--heads", default=None, help="as bench.py --heads (default: shipped, or none for random:)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="plain,default")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    heads = a.heads or ("none" if (a.model or "").startswith("random:") else None)
    base, _ = load_target(BenchConfig(model=a.model, heads=heads, device=a.device, dtype=a.dtype))
    texts = [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] + "\n" * (i // len(DEFAULT_PROMPTS)) for i in range(a.prompts)]
    # A random model with another vocabulary has no tokenizer: encode with the embedded one, as bench.py does.
    tok = base.tokenizer or AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
    vocab = base.engine.target.vocab_size
    ids = [[i for i in tok(t, add_special_tokens=False)["input_ids"] if i < vocab] for t in texts]
    sizes = [int(s) for s in a.sizes.split(",")]
    rows, reference, ok = [], {}, True

    def save() -> None:  # after every row: a run cut by its time limit still leaves its rows
        for mode in {r["mode"] for r in rows}:
            one = next((r["tok_s"] for r in rows if r["mode"] == mode and r["batch"] == sizes[0]), None)
            for r in rows:
                if r["mode"] == mode and one:
                    r["vs_first_size"] = r["tok_s"] / one
        dtype = base.engine.target.dtype
        summary = {"model": base.name, "device": a.device, "dtype": str(dtype), "prompts": a.prompts,
                   "tokens": a.tokens, "repeats": a.repeats, "rows": rows, "outputs_identical": bool(ok),
                   # bf16/fp16 batched products round differently from a lone row's: near-ties may flip
                   "identity_expected": dtype == torch.float32}
        if a.out:
            Path(a.out).write_text(json.dumps(summary, indent=1))
    for mode in a.modes.split(","):
        for size in sizes:
            loaded = specdec.load(base.model, base.heads, a.device, base.engine.target.dtype, tokenizer=base.tokenizer,
                                  max_batch_size=size)
            times, outs = [], None
            for rep in range(a.repeats + 1):  # the first pass warms up (and captures graphs)
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = specdec.generate_batch(loaded, prompt_ids=ids, max_new_tokens=a.tokens, eos_token_id=None,
                                             **MODES[mode])
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                if rep:
                    times.append(time.perf_counter() - t0)
                outs = [r.token_ids for r in res]
                assert all(r.error is None for r in res), [r.error for r in res if r.error]
            same = reference.setdefault(mode, outs) == outs
            ok &= same
            seconds = statistics.median(times)
            rows.append({"mode": mode, "batch": size, "tok_s": sum(map(len, outs)) / seconds, "seconds": seconds,
                         "identical_to_first_size": same})
            print(json.dumps(rows[-1]), flush=True)
            save()
            loaded.scheduler.close()
    save()
    return 0 if ok or base.engine.target.dtype != torch.float32 else 1


if __name__ == "__main__":
    sys.exit(main())
