"""The GPU tables from one run of scripts/bench_gpu.sh: every figure next to its target (docs/benchmark_gpu.md).

    python scripts/gpu_table.py <folder that bench_gpu.sh wrote, or its gpu_results.tgz>   # prints Markdown
"""
import json
import sys
from pathlib import Path


def load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def rows_by_id(run) -> dict:
    return {m["id"]: m for m in run["methods"]} if run else {}


def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def unpack(folder: str) -> Path:
    """The results folder: `folder` itself, or where the packed results (gpu_results.tgz, in it or given
    directly, as bench_gpu.sh writes them with $OUT set) are unpacked."""
    import tarfile
    import tempfile

    d = Path(folder)
    packed = d if d.is_file() else d / "gpu_results.tgz"
    if not packed.is_file():
        return d
    out = Path(tempfile.mkdtemp(prefix="gpu_results_"))
    with tarfile.open(packed) as tar:
        tar.extractall(out, filter="data")
    return out


def main(folder: str) -> None:
    d = unpack(folder)
    qwen = load(d / "qwen2-0.5b-oracle" / "results.json")
    compiled = rows_by_id(load(d / "qwen2-0.5b-compiled" / "results.json"))
    eager = rows_by_id(load(d / "qwen2-0.5b-eager" / "results.json"))
    env = (d / "env.txt").read_text().strip() if (d / "env.txt").is_file() else ""
    print(f"Machine and versions: {' / '.join(env.splitlines())}\n")
    if qwen:
        m = rows_by_id(qwen)
        meta = qwen["meta"]
        hf = m["hf_greedy"]["tok_s_median"]
        static = m.get("hf_static_greedy", {}).get("tok_s_median")
        comp = compiled.get("hf_compiled_greedy", {}).get("tok_s_median")
        comp_hf = compiled.get("hf_greedy", {}).get("tok_s_median")
        # The compiled run is its own process: scale it by its own HF eager figure, in this run's terms.
        comp_here = comp * hf / comp_hf if comp and comp_hf else None
        print(f"Qwen2-0.5B shape, random weights, {meta['dtype']}, batch 1, oracle heads at "
              f"{meta['oracle_accuracy']} (expected tau {fmt(meta['oracle_expected_tau'])}), "
              f"{meta['prompts']} prompts x {meta['max_new_tokens']} tokens x {meta['repeats']} repeats, "
              f"CUDA graphs: {'on' if meta.get('cuda_graphs') else 'off'}.\n")
        print("| method | tok/s | x HF eager | x HF static | x HF compiled | x own plain | tau | nodes/round "
              "| eff. | greedy == HF | eager tok/s (no graphs) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for r in qwen["methods"]:
            t = r["tok_s_median"]
            print(f"| {r['id']} | {t:.1f} | {t / hf:.2f} | {fmt(static and t / static)} | "
                  f"{fmt(comp_here and t / comp_here)} | {fmt(r.get('speedup_vs_plain'))} | "
                  f"{fmt(r.get('mean_accepted_length'))} | {fmt(r.get('mean_tree_nodes'), '.1f')} | "
                  f"{fmt(r.get('efficiency'))} | {r.get('greedy_equal')} | "
                  f"{fmt(eager.get(r['id'], {}).get('tok_s_median'), '.1f')} |")
        if comp:
            print(f"| hf_compiled_greedy (own process) | {comp:.1f} | {comp / comp_hf:.2f} (its own HF eager: "
                  f"{comp_hf:.1f}) | | | | | | | {compiled['hf_compiled_greedy'].get('greedy_equal')} | |")
        spec = [r for r in qwen["methods"] if r["backend"] == "engine" and r.get("tree")]
        best = max(spec, key=lambda r: r["tok_s_median"]) if spec else None
        if best:
            t = best["tok_s_median"]
            print(f"\nBest tree: {best['id']}. Targets:\n")
            print("| figure | measured | target |\n| --- | ---: | ---: |")
            print(f"| tokens/s | {t:.0f} | >= 600 |")
            print(f"| / HF eager generate | {t / hf:.2f}x | >= 8x |")
            print(f"| / HF static-cache generate{' (compiled)' if comp_here else ' (not compiled)'} | "
                  f"{fmt(t / (comp_here or static) if (comp_here or static) else None)}x | >= 2x |")
            print(f"| engine efficiency (speedup over own plain / tau) | {fmt(best.get('efficiency'))} | >= 0.8 |")
        if "auto_greedy" in m:
            a = m["auto_greedy"]
            print(f"\nDynamic tree: {fmt(a.get('mean_tree_nodes'), '.1f')} nodes per round on average, "
                  f"tau {fmt(a.get('mean_accepted_length'))}; cost model (ms by nodes): {meta.get('cost_model_ms')}")
        print(f"\nCUDA graphs: {json.dumps(meta.get('cuda_graphs'))}")
    ex = load(d / "exactness.json")
    if ex:
        print(f"\nExactness on {ex['device']} (fp32, tiny models, graphs on and off): "
              f"{'every greedy case identical to HF generate, every seeded sampled case to plain sampling' if ex['ok'] else 'MISMATCH' if ex.get('complete', True) else 'CUT SHORT by its time limit'}")
        for r in ex["rows"]:
            for key in ("identical", "sampled_identical_to_plain"):
                if key in r and r[key].split("/")[0] != r[key].split("/")[1]:
                    print(f"- {r}")
                    break
    b = load(d / "batch.json")
    if b:
        print(f"\nBatching, {b['model']}, {b['prompts']} prompts x {b['tokens']} tokens, greedy:\n")
        print("| mode | batch | tok/s | x batch 1 | outputs identical |\n| --- | ---: | ---: | ---: | --- |")
        for r in b["rows"]:
            print(f"| {r['mode']} | {r['batch']} | {r['tok_s']:.0f} | {fmt(r.get('vs_first_size'))} | "
                  f"{r['identical_to_first_size']} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_out/gpu")
