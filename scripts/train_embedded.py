"""Rebuild the embedded model end to end under one wall-clock deadline.

Runs the same functions as `python -m specdec.train data|lm|heads`, in
one process so a short GPU run is spent on training, not start-up:
tokenise the local Python installation, train the backbone, distil and
train head variants, and write everything (tarred in <= 15 MB parts) to
--out as each stage finishes, so a timeout still leaves earlier results.

    python scripts/train_embedded.py --tokenizer assets/model --out runs/gpu --deadline 540

The backbone's shape (--hidden-size, --num-layers, ...) trades quality against CPU speed and the
assets/ budget (64 MB). Random-weight models of each shape, plain decoding of 128 tokens through
specdec on a 2-core CPU (median of 3), fp16 sizes with four heads of their own:

| hidden x layers | parameters | plain tokens/s | model + heads, fp16 |
| --- | ---: | ---: | ---: |
| 256 x 8 | 7.9M | 184 | 16 + 9 MB |
| 320 x 10 (the default) | 14.6M | 132 | 29 + 11 MB |
| 384 x 12 | 24.6M | 82 | 49 + 14 MB: over the budget with the rest of assets/ |

The default doubles the capacity of 256 x 8 for the held-out loss target (<= 2.0 nats/token) and
stays well above 30 tokens/s on the CPU. Training runs in bf16 autocast with fused AdamW; it is not
compiled, because compiling would take a large share of a 270 s budget, and torch.compile can
crash on some GPU images.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import AutoTokenizer  # noqa: E402

from specdec.train.data import build_token_arrays  # noqa: E402
from specdec.train.lm import LMConfig, train_lm  # noqa: E402
from specdec.train.medusa import train_heads  # noqa: E402

PART = 15 * 1024 * 1024


def pack(src: Path, out: Path, name: str, leave_out: tuple[str, ...] = ()) -> None:
    """Tar `src` (but its top-level folders `leave_out`) into out/name.tar.part-NN files of at most 15 MB.

    What comes back from the device is at most 8 files and 64 MiB together: the model, the heads, the
    summary and the log must fit."""
    tmp = Path("/tmp") / f"{name}.tar"
    skip = {f"{name}/{d}" for d in leave_out}
    with tarfile.open(tmp, "w") as tf:
        tf.add(src, arcname=name, filter=lambda ti: None if any(ti.name == d or ti.name.startswith(d + "/")
                                                                for d in skip) else ti)
    data = tmp.read_bytes()
    for i in range(0, len(data), PART):
        (out / f"{name}.tar.part-{i // PART:02d}").write_bytes(data[i : i + PART])


def samples(model_dir: Path, tok, device: str) -> dict:
    """Greedy continuations of a few demo prompts, for the log and the model card."""
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    out = {}
    for p in ["def fibonacci(n):", "class Stack:", "import os\n\ndef list_files(path):"]:
        ids = tok(p, return_tensors="pt").input_ids.to(device)
        with torch.no_grad():
            g = m.generate(ids, max_new_tokens=80, do_sample=False)
        out[p] = tok.decode(g[0, ids.shape[1]:])
        logging.getLogger("specdec.train").info("sample %r -> %r", p, out[p])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/specdec-train")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline", type=float, default=540, help="seconds for everything")
    ap.add_argument("--max-chars", type=int, default=250_000_000)
    ap.add_argument("--lm-seconds", type=float, default=270)
    ap.add_argument("--heads-seconds", type=float, default=100)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-seqs", type=int, default=8192)
    ap.add_argument("--valid-seqs", type=int, default=512)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--head-batch", type=int, default=32)
    ap.add_argument("--hidden-size", type=int, default=320)
    ap.add_argument("--num-layers", type=int, default=10)
    ap.add_argument("--num-heads", type=int, default=5, help="attention heads (head dim = hidden / heads)")
    ap.add_argument("--intermediate-size", type=int, default=960)
    ap.add_argument("--context", type=int, default=1024)
    a = ap.parse_args()
    t0 = time.time()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.FileHandler(out / "train.log"), logging.StreamHandler()])
    log = logging.getLogger("specdec.train")
    summary: dict = {}

    def save_summary() -> None:
        summary["wall_seconds"] = time.time() - t0
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    ts = time.time()
    info = build_token_arrays(tok, work / "data", max_chars=a.max_chars)
    summary["data"] = {**info, "seconds": time.time() - ts}
    log.info("data: %s", json.dumps({k: info[k] for k in ("train", "valid")}))
    save_summary()

    left = a.deadline - (time.time() - t0)
    lm_seconds = max(30.0, min(a.lm_seconds, left - a.heads_seconds - 110))
    cfg = LMConfig(hidden_size=a.hidden_size, num_layers=a.num_layers, num_heads=a.num_heads,
                   intermediate_size=a.intermediate_size, context=a.context, seq_len=a.context,
                   batch_size=a.batch_size, max_seconds=lm_seconds, checkpoint_seconds=1e9, warmup_steps=200)
    ts = time.time()
    summary["lm"] = train_lm(work / "data", tok, work / "lm", cfg, a.device, resume=False)
    summary["lm"]["wall_seconds"] = time.time() - ts
    save_summary()
    pack(work / "lm" / "model", out, "model")
    summary["samples"] = samples(work / "lm" / "model", tok, a.device)
    save_summary()

    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(work / "lm" / "model"), dtype=torch.float32)
    left = a.deadline - (time.time() - t0)
    heads_seconds = max(20.0, min(a.heads_seconds, left - 60))
    variants = {
        "own": {"num_heads": 4, "num_layers": 1, "shared_lm_head": False},  # Medusa's default
        "shared": {"num_heads": 4, "num_layers": 2, "shared_lm_head": True},  # 1/30 of the size on disk
    }
    ts = time.time()
    hm = train_heads(model, tok, work / "heads", variants, num_seqs=a.num_seqs, valid_seqs=a.valid_seqs,
                     gen_batch=a.gen_batch, batch=a.head_batch, max_seconds=heads_seconds, device=a.device)
    hm["wall_seconds"] = time.time() - ts
    summary["heads"] = hm
    save_summary()
    pack(work / "heads", out, "heads", leave_out=("distill",))  # the distilled data (~8 MB): not needed here
    save_summary()
    log.info("all done in %.0f s", time.time() - t0)


if __name__ == "__main__":
    main()
