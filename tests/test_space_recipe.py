"""The two Space recipes of docs/app.md, run end to end on tiny models built from the same configs.

1. A Vicuna-style Llama with FasterDecoding Medusa heads (5 heads, their own checkpoint layout),
   chosen through `SPECDEC_MODEL` / `SPECDEC_HEADS` as on a Space.
2. An instruct model (Qwen2 config) with a chat template, an EOS list in its generation config, no
   heads: chat on by default and prompt lookup alone.
Each serves the real app on a free port and is driven through gradio_client.
"""
from __future__ import annotations

import pytest
import torch
from gradio_client import Client
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import app
import specdec
from conftest import APP_GREEDY, free_port
from specdec.api import DEFAULT_MODEL
from specdec.draft_tree import MC_SIM_7B_63
from test_heads_io import synthetic, write_fasterdecoding

pytestmark = pytest.mark.server  # deselected by the quick loop (-m "not slow"); CI runs it

V = 4096  # the embedded tokenizer's vocabulary, so real text goes in and out
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def serve(loaded):
    demo = app.build_demo(loaded, max_prompt_tokens=64, figure_interval=0.2, text_interval=0.0)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                            **app.launch_kwargs())
    return demo, Client(url, verbose=False, download_files=False)


@pytest.mark.timeout(120)
def test_vicuna_style_model_with_fasterdecoding_heads(tmp_path, monkeypatch):
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=V, max_position_embeddings=2048, initializer_range=0.1,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model_dir = save(model, AutoTokenizer.from_pretrained(str(DEFAULT_MODEL)), tmp_path / "vicuna")
    write_fasterdecoding(tmp_path / "medusa-heads", synthetic(num_heads=5, num_layers=1, H=32, V=V))
    monkeypatch.setenv("SPECDEC_MODEL", model_dir)
    monkeypatch.setenv("SPECDEC_HEADS", str(tmp_path / "medusa-heads"))

    args = app.parse_args([])
    loaded = specdec.load(args.model, heads=args.heads, device="cpu")
    assert loaded.heads.config.num_heads == 5 and loaded.tree_paths == list(MC_SIM_7B_63)
    demo, client = serve(loaded)
    try:
        inputs = dict(APP_GREEDY, tree="trained", lookup=0, lookup_mode="first", chat=False)  # mc_sim_7b_63
        updates = list(client.submit(prompt="def fib(n):", max_new_tokens=24, **inputs, api_name="/generate"))
        final = updates[-1][-1]
        plain = specdec.generate(loaded, "def fib(n):", max_new_tokens=24, speculative=False)
        assert final["text"] == plain.text  # greedy through the Medusa tree: the plain greedy text
    finally:
        demo.close()
    ev = specdec.generate(loaded, "def fib(n):", max_new_tokens=24, lookup=0, tree="trained").rounds[1]
    assert len(ev.nodes) == 64  # Medusa's 63-node tree and the root


@pytest.mark.timeout(120)
def test_instruct_model_with_chat_and_prompt_lookup_alone(tmp_path):
    cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=2048, initializer_range=0.1,
                      use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(cfg).eval()
    tok = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
    tok.chat_template = TEMPLATE
    # Two end-of-turn ids, as Qwen2.5-Instruct lists them: one that greedy decoding reaches here.
    free = specdec.generate(specdec.load(model, heads=None, tokenizer=tok), "Write a loop.", chat=True,
                            max_new_tokens=40, lookup=10, eos_token_id=None)
    stop_at = free.token_ids[12]
    model.generation_config.eos_token_id = [stop_at, V - 1]
    loaded = specdec.load(save(model, tok, tmp_path / "instruct"), heads=None, device="cpu")
    assert loaded.has_chat_template and loaded.heads is None
    assert {stop_at, V - 1} <= loaded.engine.eos_token_ids
    demo, client = serve(loaded)
    try:
        inputs = dict(APP_GREEDY, tree="none", lookup=10, lookup_mode="first", chat=True)
        updates = list(client.submit(prompt="Write a loop.", max_new_tokens=40, **inputs, api_name="/generate"))
        final = updates[-1][-1]
        ref = specdec.generate(loaded, "Write a loop.", chat=True, max_new_tokens=40, lookup=10, tree="none")
        assert final["text"] == ref.text and final["finished"] == "eos"
        assert ref.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]  # stopped at the first EOS
    finally:
        demo.close()
