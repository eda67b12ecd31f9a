"""Turn what `scripts/train_embedded.py` brought back from the GPU into a candidate for assets/, then (with --install) ship it.

    python scripts/install_embedded.py --from <the run's $OUT/embedded folder>              # stage and evaluate
    python scripts/install_embedded.py --from <same folder> --install                       # then replace assets/

Steps, each on this CPU:
1. reassemble the <= 15 MB tar parts (model.tar.part-NN, heads.tar.part-NN) and unpack them under --work;
2. stage the model in fp16 with its tokenizer, and the chosen heads variant, under --work/stage;
3. pick the tree by measured tokens/s on this machine (`python -m specdec.train tree --measure`),
   on held-out token arrays built with the model's tokenizer (once, in --data);
4. evaluate every figure of the model card (`scripts/eval_embedded.py`), against its targets;
5. with --install: replace assets/model and assets/heads with the staged ones, and copy the run's
   logs and the evaluation into assets/logs/ (gpu_summary.json, gpu_train.log, eval_embedded.json).
   Without --install nothing in assets/ changes: compare the table first.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def unpack(src: Path, name: str, dest: Path) -> Path:
    """Concatenate src/name.tar.part-NN in order and extract the tar into dest; -> dest/name."""
    parts = sorted(src.glob(f"{name}.tar.part-*"))
    if not parts:
        raise SystemExit(f"no {name}.tar.part-* in {src}")
    tar = dest / f"{name}.tar"
    dest.mkdir(parents=True, exist_ok=True)
    with tar.open("wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    shutil.rmtree(dest / name, ignore_errors=True)
    with tarfile.open(tar) as tf:
        tf.extractall(dest, filter="data")
    tar.unlink()
    return dest / name


def stage(work: Path, variant: str) -> tuple[Path, Path]:
    """fp16 model + tokenizer and the heads variant (with heads_metrics.json inside) under work/stage."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.heads import load_heads

    model_dir, heads_root = work / "model", work / "heads"
    out_model, out_heads = work / "stage" / "model", work / "stage" / "heads"
    for d in (out_model, out_heads):
        shutil.rmtree(d, ignore_errors=True)
    AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float16).save_pretrained(str(out_model))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out_model))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()  # the heads' base
    if not (heads_root / variant / "heads_config.json").is_file():
        have = sorted(p.name for p in heads_root.iterdir() if (p / "heads_config.json").is_file())
        raise SystemExit(f"no heads variant {variant!r} in {heads_root}; there are {have}")
    heads, tree = load_heads(heads_root / variant, model)
    heads.save(out_heads, tree, dtype=torch.float16)
    shutil.copy(heads_root / "heads_metrics.json", out_heads / "heads_metrics.json")
    return out_model, out_heads


def data(folder: Path, model_dir: Path, max_chars: int) -> Path:
    """Held-out token arrays for the tree measurement, built once with the model's tokenizer."""
    if not (folder / "valid.npy").is_file():
        from transformers import AutoTokenizer

        from specdec.train.data import build_token_arrays
        build_token_arrays(AutoTokenizer.from_pretrained(str(model_dir)), folder, max_chars=max_chars)
    return folder


def run(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run([sys.executable, *args], check=True, cwd=ROOT)


def install(src: Path, model: Path, heads: Path, evaluation: Path, assets: Path) -> None:
    for name, staged in (("model", model), ("heads", heads)):
        shutil.rmtree(assets / name, ignore_errors=True)
        shutil.copytree(staged, assets / name)
    logs = assets / "logs"
    logs.mkdir(exist_ok=True)
    for name, dest in (("summary.json", "gpu_summary.json"), ("train.log", "gpu_train.log")):
        if (src / name).is_file():
            shutil.copy(src / name, logs / dest)
    shutil.copy(evaluation, logs / "eval_embedded.json")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", required=True, help="the folder train_embedded.py wrote (its --out)")
    ap.add_argument("--variant", default="own", help="heads variant: own (Medusa's default) or shared")
    ap.add_argument("--work", default="runs/gpu")
    ap.add_argument("--data", default="runs/gpu/data", help="held-out token arrays for the tree (built if missing)")
    ap.add_argument("--data-chars", type=int, default=40_000_000)
    ap.add_argument("--measure-prompts", type=int, default=16)
    ap.add_argument("--measure-tokens", type=int, default=128)
    ap.add_argument("--eval-args", default="", help="extra arguments for scripts/eval_embedded.py")
    ap.add_argument("--assets", default=str(ROOT / "assets"))
    ap.add_argument("--install", action="store_true", help="replace the model and heads in --assets")
    a = ap.parse_args()
    src, work = Path(a.src), Path(a.work)
    unpack(src, "model", work)
    unpack(src, "heads", work)
    model, heads = stage(work, a.variant)
    measure = data(Path(a.data), model, a.data_chars)
    run("-m", "specdec.train", "tree", "--model", str(model), "--heads", str(heads), "--variant", a.variant,
        "--measure", str(measure), "--measure-prompts", str(a.measure_prompts),
        "--measure-tokens", str(a.measure_tokens))
    evaluation = work / "stage" / "eval_embedded.json"
    run("scripts/eval_embedded.py", "--model", str(model), "--heads", str(heads), "--json", str(evaluation),
        *a.eval_args.split())
    met = json.loads(evaluation.read_text())["targets_met"]
    print(f"targets met: {sum(met.values())} of {len(met)}: " + ", ".join(k for k, v in met.items() if not v)
          + (" missed" if not all(met.values()) else ""))
    if a.install:
        install(src, model, heads, evaluation, Path(a.assets))
        print(f"installed into {a.assets}: update assets/README.md (the model card) with these figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
