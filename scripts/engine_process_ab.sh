#!/bin/bash
# The app with the model in the server's process and in its own process (app.py --engine-process off|on),
# each at batch 1 and batch 8: four servers started together and warmed, then the load test rotating over
# them N times (8 clients x 3 requests x 64 tokens, each run checked against the first batch-1 run).
# Prints tokens/s, TTFT p50 and the identity check per run, then each server's mean batch size.
# BENCHMARKS.md (thirteenth session) has its numbers. Usage: N=3 bash scripts/engine_process_ab.sh
set -u
N=${N:-3}
OUTDIR=${OUTDIR:-$(mktemp -d)}
mkdir -p "$OUTDIR"
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
declare -A NAME=([7861]="here, batch 1" [7862]="here, batch 8" [7863]="engine process, batch 1" [7864]="engine process, batch 8")
python app.py --engine-process off --max-batch-size 1 --port 7861 > "$OUTDIR/7861.log" 2>&1 & P1=$!
python app.py --engine-process off --port 7862 > "$OUTDIR/7862.log" 2>&1 & P2=$!
python app.py --engine-process on --max-batch-size 1 --port 7863 > "$OUTDIR/7863.log" 2>&1 & P3=$!
python app.py --engine-process on --port 7864 > "$OUTDIR/7864.log" 2>&1 & P4=$!
trap 'kill $P1 $P2 $P3 $P4 2>/dev/null; wait 2>/dev/null' EXIT
for p in 7861 7862 7863 7864; do  # up to 3 minutes each to load and serve
  for _ in $(seq 180); do curl -s "http://127.0.0.1:$p/" > /dev/null && break; sleep 1; done
  curl -s "http://127.0.0.1:$p/" > /dev/null || { echo "the server on port $p did not start: $OUTDIR/$p.log"; exit 1; }
done
for p in 7861 7862 7863 7864; do  # warm-up: the first requests of a server pay for its first shapes
  python loadtest.py --url "http://127.0.0.1:$p/" --clients 2 --requests 2 --max-new-tokens 32 > /dev/null 2>&1
done
ref="$OUTDIR/reference.json"
for k in $(seq "$N"); do
  for p in 7861 7862 7863 7864; do
    out="$OUTDIR/$p-$k.json"
    if [ -f "$ref" ]; then extra=(--reference "$ref"); else extra=(); fi
    python loadtest.py --url "http://127.0.0.1:$p/" --clients 8 --requests 3 --max-new-tokens 64 --json "$out" \
      "${extra[@]}" > /dev/null 2>&1
    [ -f "$ref" ] || cp "$out" "$ref"
    python - "$out" "run $k, ${NAME[$p]}" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))
same = a.get("reference", {}).get("identical", "(the reference)")
print(f"{sys.argv[2]}: {a['tokens_per_second']:.1f} tokens/s, TTFT p50 {a['ttft_s']['p50'] * 1000:.0f} ms, "
      f"identical {same}, failed {a['failed']}", flush=True)
PY
  done
done
for p in 7861 7862 7863 7864; do
  curl -s "http://127.0.0.1:$p/metrics" | python -c "
import sys
v = {l.split()[0]: float(l.split()[1]) for l in sys.stdin if l.startswith('specdec_batch_size_')}
print('${NAME[$p]}: mean batch size', round(v['specdec_batch_size_sum'] / max(v['specdec_batch_size_count'], 1), 2))"
done
