"""Plain Medusa heads against root-token heads for the embedded model: trained side by side, then how much
of the target's sampled law each one's depth-1 drafts cover (docs/training.md, "Heads that read the root token").

    python scripts/root_heads_study.py --out runs/root_study --max-seconds 540      # about 12 minutes on 2 cores
    python scripts/root_heads_study.py --out runs/root_study --skip-training         # coverage of trained heads only

Coverage is the mass of the filtered target law at t+1 that head 1's top-r tokens hold: the chance that
lossless verification accepts a depth-1 node when those r siblings are drafted. "ideal" is a draft that
knew the target's own law at t+1, the most any draft can reach.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config import DEFAULT_PROMPTS  # noqa: E402
from specdec.heads import load_heads  # noqa: E402
from specdec.sampler import SamplingParams, target_probs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"plain": dict(num_heads=4, num_layers=1), "root": dict(num_heads=4, num_layers=1, root_token=True)}


@torch.no_grad()
def coverage(model, tok, heads: dict, params: SamplingParams, new_tokens: int, reps: int, seed: int) -> dict:
    """Per heads folder (and "ideal"): mean covered mass for the top 1..4 depth-1 drafts."""
    torch.manual_seed(seed)
    sums = {name: torch.zeros(4) for name in [*heads, "ideal"]}
    n = 0
    for text in DEFAULT_PROMPTS * reps:
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        seq = model.generate(ids, max_new_tokens=new_tokens, do_sample=True, temperature=params.temperature,
                             top_p=params.top_p, top_k=0)
        hidden = model.model(seq).last_hidden_state[0]  # [T, H]
        logits = model.lm_head(hidden)  # [T, V]
        first = ids.shape[1] - 1
        law = target_probs(logits[first + 1 : -1], params)  # [P, V]: the law of token t+2, given t+1
        h, roots = hidden[first:-2], seq[0, first + 1 : -1]  # position t and its root t+1
        for name, hd in heads.items():
            rows = hd.head(0, h, roots) if hd.config.root_token else hd.head(0, h)  # [P, V]
            top = rows.topk(4, dim=-1).indices
            sums[name] += law.gather(-1, top).cumsum(-1).sum(0)
        sums["ideal"] += law.topk(4, dim=-1).values.cumsum(-1).sum(0)
        n += law.shape[0]
    return {"positions": n, **{k: [round(float(x) / n, 4) for x in v] for k, v in sums.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=str(ROOT / "assets" / "model"))
    ap.add_argument("--max-seconds", type=float, default=540.0)
    ap.add_argument("--num-seqs", type=int, default=1536)
    ap.add_argument("--greedy-frac", type=float, default=0.5)
    ap.add_argument("--skip-training", action="store_true")
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2, help="passes over the benchmark prompts (sampled anew)")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    out = Path(a.out)
    result = {}
    if not a.skip_training:
        from specdec.train.medusa import train_heads
        m = train_heads(model, tok, out, VARIANTS, num_seqs=a.num_seqs, valid_seqs=128, prompt_len=32, gen_len=128,
                        gen_batch=128, batch=8, max_seconds=a.max_seconds, greedy_frac=a.greedy_frac, resume=True)
        result["steps"] = m["steps"]
        result["greedy_top1"] = {k: v["top1"] for k, v in m["variants"].items()}
    heads = {k: load_heads(out / k, model)[0].float() for k in VARIANTS}
    for label, params in (("T=0.7, top-p 0.9", SamplingParams(temperature=0.7, top_p=0.9)),
                          ("T=1.0", SamplingParams(temperature=1.0))):
        result[label] = coverage(model, tok, heads, params, a.new_tokens, a.reps, seed=0)
        print(label, json.dumps(result[label]))
    (out / "root_study.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
