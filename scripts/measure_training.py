"""Measurements behind docs/training.md (not part of the test suite: minutes, not seconds).

    python scripts/measure_training.py throughput --out runs/measure/throughput.json
    python scripts/measure_training.py chat --work runs/measure/chat

`throughput`: distillation tokens/s of the code before this change (its
`distill`, read from git at BASELINE_REV) and of `specdec.train.distill`,
side by side in one process, on the same tiny random model and the same
corpus prompts, alternating old/new/new/old/old/new so drift on a shared machine
hits both. Both generate exactly `--gen-len` tokens per prompt (no EOS).
Wall time and process CPU time are both recorded: on a shared CPU the
second is the steadier measure of the work each needs.

`chat`: the embedded model with a chat template attached, a JSONL of chats
built from the local Python corpus, heads trained through the CLI; then the
greedy mean accepted length on the held-out chats for those heads and for
the embedded heads (trained on raw code continuations).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

BASELINE_REV = "a25d1e1"  # the last commit with the token-by-token distillation loop
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def old_distill():
    """The baseline `distill` function, loaded from git without touching the working tree."""
    src = subprocess.run(["git", "show", f"{BASELINE_REV}:specdec/train/medusa.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType("specdec.train._baseline_medusa")
    mod.__package__ = "specdec.train"
    exec(compile(src, f"{BASELINE_REV}:specdec/train/medusa.py", "exec"), mod.__dict__)
    return mod.distill


def throughput(a) -> dict:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specdec.train.distill import DistillConfig, distill
    from specdec.train.prompts import corpus_prompts

    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "model")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    prompts = corpus_prompts(tok, "train", a.seqs, 48, seed=0)  # [n, 48]
    base = old_distill()
    runs = []
    for which in ["old", "new", "new", "old", "old", "new"][: a.runs]:
        t, cpu = time.perf_counter(), time.process_time()
        if which == "old":
            out = base(model, prompts, a.gen_len, a.old_batch)  # its defaults: 75% greedy rows, T=0.7, top-p 0.95
            tokens = int(out.shape[0] * (out.shape[1] - prompts.shape[1]))
        else:
            with tempfile.TemporaryDirectory() as d:
                out = distill(model, prompts.tolist(), DistillConfig(gen_len=a.gen_len, batch=a.new_batch), d,
                              eos=[], pad=0)
            tokens = out.generated_tokens
        s, c = time.perf_counter() - t, time.process_time() - cpu
        runs.append({"code": which, "seconds": s, "cpu_seconds": c, "tokens": tokens, "tok_s": tokens / s,
                     "tok_per_cpu_s": tokens / c})
        print(json.dumps(runs[-1]), flush=True)
    def rate(w, key):
        return sum(r["tokens"] for r in runs if r["code"] == w) / sum(r[key] for r in runs if r["code"] == w)

    tok_s = {w: rate(w, "seconds") for w in ("old", "new")}
    tok_cpu = {w: rate(w, "cpu_seconds") for w in ("old", "new")}
    return {"model": "random Llama, 2 layers, hidden 128, intermediate 512, 4 heads, vocab 4096",
            "seqs": a.seqs, "prompt_len": 48, "gen_len": a.gen_len, "threads": a.threads,
            "old_batch": a.old_batch, "new_batch": a.new_batch or "auto", "baseline": BASELINE_REV,
            "runs": runs, "tok_s": tok_s, "speedup": tok_s["new"] / tok_s["old"],
            "tok_per_cpu_s": tok_cpu, "speedup_cpu_time": tok_cpu["new"] / tok_cpu["old"]}


def chat(a) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.train.corpus import iter_source_files, read_text
    from specdec.train.medusa import measure_tau
    from specdec.train.prompts import has_chat_template, prompt_ids, read_prompt_file, split_records

    torch.set_num_threads(a.threads)
    work = Path(a.work)
    model_dir = work / "chat-model"
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "model")
    tok.chat_template = TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets" / "model", dtype=torch.float32)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    chats, n = [], 0
    for f in iter_source_files():  # a function's first lines as the request; the model writes the rest
        text = read_text(f) or ""
        for block in text.split("\ndef ")[1:3]:
            head = "def " + "\n".join(block.splitlines()[:3])
            if 40 < len(head) < 400:
                chats.append({"messages": [{"role": "system", "content": "You complete Python code."},
                                           {"role": "user", "content": "Continue this code:\n" + head}]})
        n += 1
        if len(chats) >= a.chats:
            break
    data = work / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in chats[: a.chats]))
    out = work / "heads-chat"
    cmd = [sys.executable, "-m", "specdec.train", "heads", "--model", str(model_dir), "--prompts", str(data),
           "--out", str(out), "--device", "cpu", "--gen-len", str(a.gen_len), "--batch-size", "8",
           "--max-seconds", str(a.train_seconds), "--eval-prompts", str(a.eval_prompts),
           "--eval-tokens", str(a.eval_tokens), "--threads", str(a.threads)]
    print(" ".join(cmd), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.perf_counter() - t
    metrics = json.loads((out / "heads_metrics.json").read_text())
    # the same held-out chats, drafted by the embedded heads (trained on raw code continuations)
    records = read_prompt_file(data)
    _, valid = split_records(records, 256, 0)
    assert has_chat_template(tok)
    held = [prompt_ids(tok, r, True, 256) for r in valid[: a.eval_prompts]]
    code_heads = measure_tau(model, tok, ROOT / "assets" / "heads", held, a.eval_tokens)
    return {"command": " ".join(cmd), "wall_seconds": wall, "chats": len(chats[: a.chats]),
            "distill_seconds": metrics["distill_seconds"], "train_seconds": metrics["train_seconds"],
            "steps": metrics["steps"], "train_sequences": metrics["train_sequences"],
            "valid_sequences": metrics["valid_sequences"], "top1": metrics["variants"]["heads"]["top1"],
            "top5": metrics["variants"]["heads"]["top5"], "tau_chat_heads": metrics["tau"],
            "tau_embedded_code_heads": code_heads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--seqs", type=int, default=512)
    t.add_argument("--gen-len", type=int, default=192)
    t.add_argument("--old-batch", type=int, default=256, help="the old --gen-batch default")
    t.add_argument("--new-batch", type=int, default=0, help="0 = the new auto default")
    t.add_argument("--runs", type=int, default=6, help="old/new/new/old/old/new, cut to this many")
    t.add_argument("--threads", type=int, default=1, help="1 is the least disturbed by other work on a shared CPU")
    t.add_argument("--out", default=None)
    c = sub.add_parser("chat")
    c.add_argument("--work", required=True)
    c.add_argument("--chats", type=int, default=1100)
    c.add_argument("--gen-len", type=int, default=96)
    c.add_argument("--train-seconds", type=float, default=300)
    c.add_argument("--eval-prompts", type=int, default=16)
    c.add_argument("--eval-tokens", type=int, default=96)
    c.add_argument("--threads", type=int, default=1, help="1: two threads stall each other on a busy shared CPU")
    a = ap.parse_args()
    result = throughput(a) if a.cmd == "throughput" else chat(a)
    print(json.dumps(result, indent=2))
    path = Path(a.out) if a.cmd == "throughput" and a.out else (Path(a.work) / "result.json" if a.cmd == "chat" else None)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
