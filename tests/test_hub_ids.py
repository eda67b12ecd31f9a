"""Models and heads named by hub id ("org/name"), resolved offline from a Hugging Face cache the test builds.

The cache has the hub's own layout (models--org--name/refs/main + snapshots/<commit>/), so transformers
and huggingface_hub read it exactly as they read a real download under HF_HUB_OFFLINE=1.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import specdec
from specdec import hub
from specdec.api import DEFAULT_MODEL
from specdec.heads import random_heads

ROOT = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _put(cache: Path, repo: str, folder: Path) -> None:
    """Place `folder` in `cache` as the hub's snapshot of `repo` at `main`."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    shutil.copytree(folder, root / "snapshots" / COMMIT)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """org/tiny-llama (no chat template), org/tiny-chat (Qwen2 with one) and org/tiny-heads (for tiny-llama)."""
    work = tmp_path_factory.mktemp("hub-src")
    cache = tmp_path_factory.mktemp("hub-cache")
    tok = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**common)).eval()
    llama.save_pretrained(work / "llama")
    tok.save_pretrained(work / "llama")
    random_heads(llama, num_heads=3).save(work / "heads")
    torch.manual_seed(1)
    qwen = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False)).eval()
    qwen.save_pretrained(work / "chat")
    chat_tok = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
    chat_tok.chat_template = TEMPLATE
    chat_tok.save_pretrained(work / "chat")
    for repo, folder in (("org/tiny-llama", "llama"), ("org/tiny-chat", "chat"), ("org/tiny-heads", "heads")):
        _put(cache, repo, work / folder)
    return cache


@pytest.fixture
def offline_cache(hub_cache, monkeypatch) -> Path:
    """This process reads the test's cache, offline (what HF_HUB_CACHE + HF_HUB_OFFLINE=1 do for a new one)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def _env(cache: Path) -> dict:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("name,local", [("org/name", False), ("gpt2", False), ("./org/name", True),
                                        ("/abs/path", True), ("~/models/x", True), ("../x", True)])
def test_a_name_is_local_only_when_it_exists_or_looks_like_a_path(name, local):
    assert hub.is_local(name) is local


def test_load_and_generate_by_hub_id_equal_hf_greedy(offline_cache):
    loaded = specdec.load("org/tiny-llama", heads="org/tiny-heads", device="cpu")
    assert loaded.name == "org/tiny-llama" and loaded.heads.config.num_heads == 3
    res = specdec.generate(loaded, prompt="def fibonacci(n):", max_new_tokens=24, eos_token_id=None)
    ids = loaded.tokenizer("def fibonacci(n):", add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hf = loaded.model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert res.token_ids == hf.tolist()
    loaded.scheduler.close()


def test_chat_by_hub_id_goes_through_the_template(offline_cache):
    loaded = specdec.load("org/tiny-chat", device="cpu")
    assert loaded.has_chat_template and loaded.heads is None
    res = specdec.generate(loaded, prompt="hello", chat=True, max_new_tokens=12, eos_token_id=None)
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"]
    assert ids[0, -3:].tolist() == loaded.tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"][-3:]
    with torch.no_grad():
        hf = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert res.token_ids == hf.tolist()
    loaded.scheduler.close()


def test_a_missing_id_is_one_line_naming_it(offline_cache):
    with pytest.raises(ValueError, match=r"^`model` 'org/missing' is not in the local Hugging Face cache") as e:
        specdec.load("org/missing")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^`heads` 'org/no-heads' is not in the local Hugging Face cache"):
        specdec.load("org/tiny-llama", heads="org/no-heads")
    with pytest.raises(ValueError, match=r"^`model` path './org/tiny-llama' does not exist"):
        specdec.load("./org/tiny-llama")


def test_a_missing_id_online_is_named_too(monkeypatch):
    """With the hub on, the message names the id and what transformers said."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    err = hub.not_found("org/missing", "model", OSError("We couldn't connect to 'http://127.0.0.1:9'"))
    assert str(err).startswith("`model` 'org/missing' is neither a local folder nor a repository on the Hugging Face hub")


@pytest.mark.train
@pytest.mark.timeout(300)
def test_cli_generate_and_train_heads_by_hub_id(hub_cache, tmp_path):
    env = _env(hub_cache)
    out = subprocess.run([sys.executable, "-m", "specdec", "generate", "--model", "org/tiny-llama", "--heads",
                          "org/tiny-heads", "--prompt", "def f(x):", "--max-new-tokens", "8", "--json"],
                         env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["new_tokens"] == 8
    heads_out = tmp_path / "heads-out"
    out = subprocess.run([sys.executable, "-m", "specdec", "train", "heads", "--model", "org/tiny-llama", "--out",
                          str(heads_out), "--device", "cpu", "--num-seqs", "8", "--valid-seqs", "4", "--prompt-len",
                          "16", "--gen-len", "8", "--gen-batch", "8", "--batch-size", "4", "--max-steps", "2",
                          "--num-heads", "2", "--eval-prompts", "0"],
                         env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (heads_out / "heads" / "heads_config.json").is_file()
    assert "org/tiny-llama" in (heads_out / "heads" / "README.md").read_text()
    out = subprocess.run([sys.executable, "-m", "specdec", "generate", "--model", "org/missing", "--prompt", "x"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: `model` 'org/missing' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: download it "
        "first (`hf download org/missing`) or unset HF_HUB_OFFLINE"]


@pytest.mark.server
@pytest.mark.timeout(180)
def test_app_serves_a_model_by_hub_id(offline_cache, monkeypatch):
    """`SPECDEC_MODEL=org/tiny-chat python app.py`, as a Space sets it: the app's flags, load and one call."""
    from gradio_client import Client

    import app
    from conftest import APP_GREEDY, free_port

    monkeypatch.setenv("SPECDEC_MODEL", "org/tiny-chat")
    args = app.parse_args([])
    loaded = specdec.load(args.model, heads=args.heads, device="cpu")
    demo = app.build_demo(loaded, max_prompt_tokens=64, figure_interval=0.2, text_interval=0.0)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(url, verbose=False, download_files=False)
        inputs = dict(APP_GREEDY, tree="auto", lookup=10, lookup_mode="first", chat=True)  # no heads: lookup alone
        final = list(client.submit(prompt="hello", max_new_tokens=8, **inputs, api_name="/generate"))[-1][-1]
        plain = specdec.generate(loaded, "hello", chat=True, max_new_tokens=8, speculative=False)
        assert final["text"] == plain.text
    finally:
        demo.close()
        loaded.scheduler.close()
