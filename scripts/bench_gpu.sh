#!/usr/bin/env bash
# The GPU benchmark (docs/benchmark_gpu.md), about 7 minutes on one H200, each step under its
# own `timeout` and in priority order, so that a slow step cannot take the whole run:
#   1. bench.py on a random-weight model with Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads,
#      2 KV heads, vocab 151936), built from a config (no download), bf16, batch 1, with oracle heads
#      whose top-1 guess is right 80% of the time: HF eager and static-cache generate, specdec plain,
#      chain, 16- and 64-node trees, the dynamic tree, prompt lookup. specdec runs with CUDA graphs.
#   2. exactness on CUDA, fp32, tiny models, graphs on and off: greedy against HF generate, seeded sampling
#      against plain sampling with the same seed (scripts/gpu_exactness.py);
#   3. aggregate tokens/s of continuous batching at batch 1, 4 and 16 (scripts/batch_throughput.py);
#   4. specdec without CUDA graphs (plain and 64-node tree), to show what the graphs buy;
#   5. HF generate with a static cache, compiled (torch.compile "reduce-overhead"), in its own process:
#      it takes minutes to compile and can crash on some GPU images, so it goes last and alone;
#   6. the embedded model with its shipped heads and EAGLE-3 drafter, a few methods, if time is left.
# Results: <dir>/<step>/results.{json,md}, <dir>/*.json, <dir>/log.txt. bench.py rewrites its results
# after every repeat, so a step cut by its timeout still leaves the finished repeats (marked PARTIAL).
# With $OUT set, <dir> is a scratch folder packed into $OUT/gpu_results.tgz every 20 s and after each
# step (a run cut by its own timeout keeps what was packed), with a copy of log.txt beside it; without
# $OUT, <dir> is bench_out/gpu. Then: python scripts/gpu_table.py <that folder, or the .tgz>  (the tables).
#
# Run:                    bash scripts/bench_gpu.sh
# Dry run on a CPU:       DEVICE=cpu DTYPE=float32 QWEN=random:tiny PROMPTS=2 TOKENS=16 REPEATS=1 BATCH_PROMPTS=4 bash scripts/bench_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# No registry and no hub there; and unbuffered, so that a step killed by its timeout keeps its last lines.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
# Some GPU images force TF32 for every fp32 product; the exactness step compares fp32 argmaxes.
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE

DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
QWEN=${QWEN:-random:qwen2-0.5b}
PROMPTS=${PROMPTS:-2}
TOKENS=${TOKENS:-96}
REPEATS=${REPEATS:-2}
ORACLE=${ORACLE:-0.8}
BATCH_PROMPTS=${BATCH_PROMPTS:-16}
BUDGET=${BUDGET:-450}   # seconds: optional steps start only while the script is under this
DEADLINE=${DEADLINE:-525}  # seconds: no step runs past this, so the whole run fits in 9 minutes
PY=${PYTHON:-$(command -v python3 || command -v python)}
if [ -n "${OUT:-}" ]; then
  OUT_DIR=$(mktemp -d /tmp/bench_gpu.XXXXXX)
  mkdir -p "$OUT"
  pack() { tar -czf "$OUT/gpu_results.tgz.tmp" -C "$OUT_DIR" . 2>/dev/null && mv -f "$OUT/gpu_results.tgz.tmp" "$OUT/gpu_results.tgz"
           cp -f "$OUT_DIR/log.txt" "$OUT/log.txt" 2>/dev/null; true; }
  ( while sleep 20; do pack; done ) >/dev/null 2>&1 &  # not holding the run's output open
  PACKER=$!
  trap 'pkill -P $PACKER 2>/dev/null; kill $PACKER 2>/dev/null; pack' EXIT
else
  OUT_DIR=bench_out/gpu
  pack() { true; }
fi
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/log.txt") 2>&1

# Without plotly (the HTML report needs it), install it from local wheels in .whl/ when present.
if ! "$PY" -c "import plotly" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --find-links .whl plotly || true
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || true
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$OUT_DIR/env.txt"

step() {  # step <name> <timeout_s> <optional:0|1> <command...>
  local name=$1 limit=$2 optional=$3; shift 3
  if [ "$optional" = 1 ] && [ "$SECONDS" -ge "$BUDGET" ]; then
    echo "== $name: skipped (${SECONDS}s used, budget ${BUDGET}s)"; return
  fi
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped (${SECONDS}s used, deadline ${DEADLINE}s)"; return
  fi
  local start=$SECONDS
  echo "== $name (limit ${limit}s) at ${SECONDS}s"
  timeout "$limit" "$@"
  echo "== $name: rc=$? in $((SECONDS - start))s"
  pack
}

QWEN_ARGS=(--device "$DEVICE" --dtype "$DTYPE" --model "$QWEN" --heads "oracle:$ORACLE"
           --num-prompts "$PROMPTS" --max-new-tokens "$TOKENS" --repeats "$REPEATS")
step qwen 240 0 "$PY" bench.py "${QWEN_ARGS[@]}" \
  --methods hf_greedy,hf_static_greedy,hf_prompt_lookup,plain_greedy,chain_greedy,small_greedy,default_greedy,auto_greedy,lookup_greedy,hybrid_greedy \
  --out "$OUT_DIR/qwen2-0.5b-oracle"
step exactness 120 0 "$PY" scripts/gpu_exactness.py --device "$DEVICE" --out "$OUT_DIR/exactness.json"
step batch 150 1 "$PY" scripts/batch_throughput.py --model "$QWEN" --device "$DEVICE" --dtype "$DTYPE" \
  --sizes 1,4,16 --prompts "$BATCH_PROMPTS" --tokens 64 --repeats 1 --out "$OUT_DIR/batch.json"
step eager 90 1 "$PY" bench.py "${QWEN_ARGS[@]}" --no-cuda-graphs --repeats 1 \
  --methods hf_greedy,plain_greedy,default_greedy --out "$OUT_DIR/qwen2-0.5b-eager"
# One prompt: the static cache's length (prompt + new tokens) is part of what is compiled, so a second
# prompt of another length would compile again.
step compiled 170 1 "$PY" bench.py "${QWEN_ARGS[@]}" --repeats 1 --num-prompts 1 --methods hf_greedy,hf_compiled_greedy \
  --out "$OUT_DIR/qwen2-0.5b-compiled"
step embedded 100 1 "$PY" bench.py --device "$DEVICE" --dtype "$DTYPE" --num-prompts 3 --max-new-tokens "$TOKENS" \
  --repeats "$REPEATS" --methods hf_greedy,hf_sample,plain_greedy,auto_greedy,hybrid_greedy,hybrid_sample,trained_greedy,eagle_greedy,trained_sample,eagle_sample \
  --out "$OUT_DIR/embedded"
echo "total: ${SECONDS}s"
