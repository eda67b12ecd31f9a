"""Exactness on the device, CUDA graphs on: greedy output against HF `generate`, and seeded lossless
sampling against specdec's own plain sampling with the same seed (each output position has its own
uniform, so the speculative tokens must be the plain ones), token for token.

Tiny random models (bench.models' "tiny" Llama and "tiny-qwen2"), float32, for the static trees,
the dynamic tree and prompt lookup, with graphs and without. Writes a JSON summary and exits 1 on
any mismatch or capture failure. No pytest needed (the GPU image may not have it).

    python scripts/gpu_exactness.py [--device cuda] [--out exactness.json]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import specdec  # noqa: E402
from bench.models import random_model  # noqa: E402
from specdec import GenerationRequest, SamplingParams  # noqa: E402

PROMPTS = ([5, 17, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [99, 42, 7, 7, 120, 64, 0, 31] * 4)
SAMPLED = SamplingParams(temperature=0.9, top_p=0.9)
CASES = (("chain", 0), ("small", 0), ("default", 0), ("auto", 0), ("auto", 10), ("none", 10))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    # Full fp32 products on both sides: TF32 (on where an image sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)
    # rounds them to 10 bits, and a near-tie in a tiny random model could flip an argmax: a false mismatch.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    t0 = time.perf_counter()
    rows, ok = [], True

    def save(done: bool) -> dict:  # after every row: a run cut by its time limit still leaves its results
        summary = {"ok": bool(ok) and done, "complete": done, "device": a.device, "torch": torch.__version__,
                   "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                            "override_env": os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")},
                   "seconds": time.perf_counter() - t0, "rows": rows}
        if a.out:
            Path(a.out).write_text(json.dumps(summary, indent=1))
        return summary
    for shape in ("tiny", "tiny-qwen2"):
        model = random_model(shape, a.device, torch.float32, seed=1, vocab_size=512)
        model.generation_config.eos_token_id = None
        for graphs in ((True, False) if a.device.startswith("cuda") else (False,)):
            loaded = specdec.load(model, heads="random", device=a.device, dtype="float32", cuda_graphs=graphs)
            for tree, lookup in CASES:
                same = sampled_same = 0
                for i, p in enumerate(PROMPTS):
                    ids = torch.tensor([p], device=a.device)
                    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=a.tokens, min_new_tokens=a.tokens, pad_token_id=0,
                                         eos_token_id=None)[0, len(p):].tolist()
                    got = [t.token_id for ev in loaded.engine.stream(GenerationRequest(
                        p, a.tokens, tree=tree, lookup=lookup, eos_token_id=None)) for t in ev.emitted]
                    same += got == ref
                    law = SAMPLED.replace(seed=i)
                    runs = [[t.token_id for ev in loaded.engine.stream(GenerationRequest(
                        p, a.tokens, law, tree=tree, lookup=lookup, speculative=spec, eos_token_id=None))
                        for t in ev.emitted] for spec in (False, True)]
                    sampled_same += runs[0] == runs[1]
                rows.append({"model": shape, "cuda_graphs": graphs, "tree": tree, "lookup": lookup,
                             "identical": f"{same}/{len(PROMPTS)}",
                             "sampled_identical_to_plain": f"{sampled_same}/{len(PROMPTS)}"})
                ok &= same == len(PROMPTS) and sampled_same == len(PROMPTS)
                print(json.dumps(rows[-1]), flush=True)
                save(False)
            info = loaded.engine.info()["cuda_graphs"]
            if info is not None:
                rows.append({"model": shape, "graphs_info": info})
                ok &= not info["failures"]
                print(json.dumps(rows[-1]), flush=True)
    summary = save(True)
    print("exactness:", "all identical" if ok else "MISMATCH or capture failure", f"({summary['seconds']:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
