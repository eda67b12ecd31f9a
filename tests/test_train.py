"""Training entry points: heads for any HF model path, and clear errors for bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import specdec
from specdec.__main__ import main as cli
from specdec.heads import load_heads
from specdec.train.__main__ import main as train_main
from specdec.train.corpus import iter_source_files, split_of

pytestmark = pytest.mark.train  # deselected by the quick loop (-m "not slow"); CI runs it

ROOT = Path(__file__).resolve().parent.parent


def _tiny_llama(d: Path, **config) -> Path:
    """A tiny random Llama with the embedded tokenizer, saved in `d` like any HF checkpoint."""
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "model")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                      **config)
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return _tiny_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory):
    """The tiny Llama with large weights: peaked laws, so a drafter has something to learn in a few steps."""
    torch.manual_seed(0)
    return _tiny_llama(tmp_path_factory.mktemp("peaked"), initializer_range=0.3)


def test_heads_command_trains_for_a_model_path(tiny_model_dir, tmp_path):
    out = tmp_path / "heads-out"
    rc = train_main(["heads", "--model", str(tiny_model_dir), "--out", str(out), "--device", "cpu",
                     "--num-seqs", "8", "--valid-seqs", "4", "--prompt-len", "16", "--gen-len", "12",
                     "--gen-batch", "8", "--batch-size", "4", "--max-steps", "3", "--num-heads", "3"])
    assert rc == 0
    metrics = json.loads((out / "heads_metrics.json").read_text())
    v = metrics["variants"]["heads"]
    assert metrics["steps"] == 3 and len(v["top1"]) == 3 and all(0 <= a <= 1 for a in v["top5"])
    assert (out / "train.log").is_file() and "distilled 8 train sequences" in (out / "train.log").read_text()
    assert metrics["card"]["data"]["kind"] == "corpus" and (out / "heads" / "README.md").is_file()
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    heads, tree = load_heads(out / "heads", model)
    assert heads.config.num_heads == 3 and tree is not None
    loaded = specdec.load(str(tiny_model_dir), heads=str(out / "heads"))
    res = specdec.generate(loaded, prompt="def f(x):", max_new_tokens=8)
    assert res.stats["new_tokens"] == 8

    # then pick the tree by measured end-to-end speed on a held-out split
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "valid.npy", np.random.default_rng(0).integers(0, 4000, 400).astype(np.uint16))
    rc = train_main(["tree", "--model", str(tiny_model_dir), "--heads", str(out / "heads"), "--variant", "heads",
                     "--measure", str(data), "--measure-prompts", "2", "--measure-tokens", "6"])
    assert rc == 0
    choice = json.loads((out / "heads" / "tree_choice.json").read_text())
    assert choice["chosen_by"].startswith("measured")
    rows = choice["candidates"]
    assert all(r["measured_tok_s"] > 0 and r["measured_lookup"] == 10 for r in rows)
    best = max(rows, key=lambda r: r["measured_tok_s"])
    assert choice["chosen_nodes"] == best["nodes"]
    _, tree = load_heads(out / "heads", model)
    assert [list(p) for p in tree] == best["paths"]
    card = (out / "heads" / "README.md").read_text()  # the model card follows the new tree
    assert f"{best['nodes']} nodes (root included), chosen by measured" in card and json.dumps(best["paths"]) in card


def test_eagle_command_trains_a_drafter_that_learns_and_loads(peaked_model_dir, tmp_path):
    """`specdec train eagle`: distil, train with the training-time test, save in SafeAILab's layout with metrics
    and a card; its loss falls, and it loads and drafts exactly."""
    out = tmp_path / "eagle-out"
    rc = train_main(["eagle", "--model", str(peaked_model_dir), "--out", str(out), "--device", "cpu",
                     "--num-seqs", "16", "--valid-seqs", "4", "--prompt-len", "16", "--gen-len", "24",
                     "--gen-batch", "16", "--batch-size", "8", "--max-steps", "60", "--lr", "3e-3",
                     "--draft-vocab", "512", "--ttt-steps", "3", "--eval-prompts", "2", "--eval-tokens", "12"])
    assert rc == 0
    metrics = json.loads((out / "eagle3_metrics.json").read_text())
    assert metrics["steps"] == 60 and metrics["draft_vocab_size"] == 512 and len(metrics["top1_by_step"]) == 3
    assert metrics["loss_smoothed_end"] < 0.9 * metrics["loss_first_step"]  # it learned (a frozen one stays put)
    assert all(0 <= a <= 1 for a in metrics["top1_by_step"])
    assert metrics["tau"]["identical_to_greedy"] == 2 and metrics["tau"]["mean_accepted_length"] >= 1.0
    assert (out / "eagle3" / "README.md").is_file() and (out / "eagle3" / "config.json").is_file()
    loaded = specdec.load(str(peaked_model_dir), heads=str(out / "eagle3"))
    assert loaded.eagle is not None and loaded.eagle.config.draft_vocab_size == 512
    res = specdec.generate(loaded, prompt="def f(x):", max_new_tokens=8, lookup=0)
    assert {n.source for e in res.rounds for n in e.nodes} == {"root", "eagle3"}


def test_heads_command_rejects_a_missing_model_path(tmp_path):
    with pytest.raises(SystemExit) as e:
        train_main(["heads", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert e.value.code == 2


def test_cli_errors_are_messages_not_tracebacks(tmp_path, capsys):
    cases = [
        (["--model", str(tmp_path / "missing-model"), "--prompt", "x"], "`model` path"),
        (["--heads", str(tmp_path / "missing-heads"), "--prompt", "x"], "`heads` path"),
        (["--prompt", "def f():", "--tree", "bogus"], "`tree` must be one of"),
        (["--prompt", "def f():", "--top-p", "1.5"], "`top_p` must be in (0, 1]"),
        (["--prompt", ""], "`--prompt` is empty"),
    ]
    for args, message in cases:
        assert cli(["generate", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (args, err)
    # The installed entry point, once: `python -m specdec` exits 2 with the message alone.
    r = subprocess.run([sys.executable, "-m", "specdec", "generate", *cases[0][0]], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and cases[0][1] in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_heads_for_another_model_are_refused(tmp_path):
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(ValueError, match="trained for hidden_size"):
        specdec.load(model, heads=str(ROOT / "assets" / "heads"))


def test_embedded_default_loads_offline_and_writes_python():
    loaded = specdec.load()
    assert loaded.name == "embedded" and loaded.heads is not None and loaded.tree_paths
    res = specdec.generate(loaded, "def fibonacci(n):", max_new_tokens=32)
    plain = specdec.generate(loaded, "def fibonacci(n):", max_new_tokens=32, speculative=False)
    assert res.token_ids == plain.token_ids
    assert res.stats["mean_accepted_length"] > 1.5  # trained heads accept; random heads would not


def test_corpus_split_is_stable_and_by_file():
    assert split_of("json/decoder.py") == split_of("json/decoder.py")
    files = []
    for f in iter_source_files():
        files.append(f)
        if len(files) >= 400:
            break
    splits = {f.split for f in files}
    assert splits <= {"train", "valid"} and "train" in splits
