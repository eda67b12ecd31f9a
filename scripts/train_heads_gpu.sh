#!/usr/bin/env bash
# Heads for a random-weight model of Qwen2-0.5B's shape, self-distilled, in under 8 minutes on one GPU.
# Measures distillation tokens/s and training steps/s, so you can estimate the cost for your own model.
#
#   bash scripts/train_heads_gpu.sh                 # on a CUDA machine (bf16, largest generate batch that fits)
#   SPECDEC_TINY=1 bash scripts/train_heads_gpu.sh  # the same steps at toy scale on a CPU (a dry run)
#
# Writes $OUT_DIR (default runs/gpu_heads): the model, heads/ with its README.md card, heads_metrics.json,
# train.log and summary.json. Nothing is downloaded: the model is random and the prompts are windows of
# the local Python corpus, tokenised with the embedded tokenizer (its ids are valid in any larger vocabulary).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT_DIR:-${OUT:-runs}/gpu_heads}
PY=${PYTHON:-python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUT_DIR"

if [[ "${SPECDEC_TINY:-0}" == 1 ]]; then
  DEVICE=cpu; SHAPE=tiny; NUM_SEQS=64; VALID=16; GEN_LEN=32; SECONDS_=20; EVAL=2; BATCH=8
else
  DEVICE=cuda; SHAPE=qwen2-0.5b; NUM_SEQS=4096; VALID=256; GEN_LEN=192; SECONDS_=180; EVAL=4; BATCH=32
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: use SPECDEC_TINY=1 for a CPU dry run')"
fi

start=$(date +%s)
"$PY" - "$OUT_DIR/model" "$SHAPE" <<'PY'
import sys
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
out, shape = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained("assets/model")
if shape == "qwen2-0.5b":  # Qwen/Qwen2-0.5B's config.json, weights random
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
else:
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, use_sliding_window=False)
cfg.eos_token_id = cfg.bos_token_id = cfg.pad_token_id = tok.eos_token_id
torch.manual_seed(0)
model = Qwen2ForCausalLM(cfg).to(torch.bfloat16 if shape != "tiny" else torch.float32)
model.save_pretrained(out)
tok.save_pretrained(out)
print(f"{shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters -> {out}")
PY
made=$(date +%s)

"$PY" -m specdec.train heads --model "$OUT_DIR/model" --out "$OUT_DIR" --device "$DEVICE" \
  --num-seqs "$NUM_SEQS" --valid-seqs "$VALID" --prompt-len 48 --gen-len "$GEN_LEN" --gen-batch 0 \
  --num-heads 4 --num-layers 1 --batch-size "$BATCH" --max-seconds "$SECONDS_" \
  --eval-prompts "$EVAL" --eval-tokens 64
end=$(date +%s)

"$PY" - "$OUT_DIR" "$((end - start))" "$((made - start))" <<'PY'
import json, sys
out, wall, build = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = json.load(open(f"{out}/heads_metrics.json"))
v = m["variants"]["heads"]
s = {"wall_seconds": wall, "model_build_seconds": build, "distill_seconds": round(m["distill_seconds"], 1),
     "distill_tokens": m["distill_tokens"], "distill_tokens_per_second": round(m["distill_tokens_per_second"]),
     "train_seconds": round(m["train_seconds"], 1), "steps": m["steps"],
     "steps_per_second": round(m["steps_per_second"], 2), "top1": [round(a, 3) for a in v["top1"]],
     "mean_accepted_length": m.get("tau", {}).get("mean_accepted_length"), "under_8_minutes": wall < 480}
json.dump(s, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(s, indent=2))
PY
