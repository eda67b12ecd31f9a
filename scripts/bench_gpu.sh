#!/usr/bin/env bash
# One prepared GPU benchmark, under 5 minutes on one H200 (bf16):
#   1. bench.py on the embedded model with its shipped heads, every method;
#   2. bench.py on a random-weight model with Qwen2-0.5B's shape (hidden 896, 24 layers,
#      14 heads, 2 KV heads, vocab 151936), built from a config (no download), with oracle
#      heads whose top-1 guess is right 80% of the time, so that engine efficiency
#      (speedup / mean accepted length) is visible without trained weights.
# Results: $OUT/<run>/results.{json,md} (+ report.html when plotly is installed). bench.py
# rewrites them after every repeat, so a run cut by its timeout
# still leaves the finished repeats behind (marked PARTIAL). Without plotly,
# rebuild the HTML here: python bench.py --report-from <results.json> --out <dir>.
#
# With the device tool:   run(command="bash scripts/bench_gpu.sh", timeout_s=420)
# Dry run on a CPU:       DEVICE=cpu DTYPE=float32 QWEN=random:tiny PROMPTS=2 TOKENS=16 REPEATS=1 bash scripts/bench_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
QWEN=${QWEN:-random:qwen2-0.5b}
PROMPTS=${PROMPTS:-3}     # embedded run; the Qwen-shaped run uses PROMPTS_QWEN
PROMPTS_QWEN=${PROMPTS_QWEN:-2}
TOKENS=${TOKENS:-96}
REPEATS=${REPEATS:-2}
ORACLE=${ORACLE:-0.8}
OUT_DIR=${OUT:-bench_out/gpu}
PY=${PYTHON:-$(command -v python3 || command -v python)}
mkdir -p "$OUT_DIR"

# plotly is not in the GPU image: install it from carried wheels (carry .whl) when present.
if ! "$PY" -c "import plotly" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --find-links .whl plotly || true
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || true
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$OUT_DIR/env.txt"

start=$SECONDS
# Each run has its own time limit so that one slow run cannot take the whole lease.
timeout 170 "$PY" bench.py --device "$DEVICE" --dtype "$DTYPE" \
  --num-prompts "$PROMPTS" --max-new-tokens "$TOKENS" --repeats "$REPEATS" \
  --out "$OUT_DIR/embedded" || echo "embedded run failed or timed out (rc=$?)"
echo "embedded: $((SECONDS - start))s"

start=$SECONDS
timeout 200 "$PY" bench.py --device "$DEVICE" --dtype "$DTYPE" --model "$QWEN" --heads "oracle:$ORACLE" \
  --methods hf_greedy,hf_prompt_lookup,plain_greedy,chain_greedy,small_greedy,default_greedy,auto_greedy,lookup_greedy,hybrid_greedy \
  --num-prompts "$PROMPTS_QWEN" --max-new-tokens "$TOKENS" --repeats "$REPEATS" \
  --out "$OUT_DIR/qwen2-0.5b-oracle" || echo "qwen2-0.5b run failed or timed out (rc=$?)"
echo "qwen2-0.5b-oracle: $((SECONDS - start))s"
