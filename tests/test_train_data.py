"""Distillation data: prompt files and datasets, chat templates, batched distillation, its cache, the model card."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import specdec
from specdec.train import distill as distill_mod
from specdec.train.__main__ import main as train_main
from specdec.train.distill import DistillConfig, NucleusSampler, distill, shard_is_greedy
from specdec.train.prompts import prompt_ids, read_dataset, read_prompt_file, split_records
from specdec.sampler import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CHATS = [[{"role": "system", "content": "You write Python."},
          {"role": "user", "content": f"Write a function number {i}."},
          {"role": "assistant", "content": "def f(): pass"},
          {"role": "user", "content": f"Now call it {i} times."}] for i in range(24)]


@pytest.fixture(scope="module")
def chat_tok():
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "model")
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory, chat_tok):
    """A tiny random Llama whose tokenizer has a chat template, saved like any HF checkpoint."""
    d = tmp_path_factory.mktemp("chat")
    cfg = LlamaConfig(vocab_size=len(chat_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.1, eos_token_id=chat_tok.eos_token_id, bos_token_id=None,
                      pad_token_id=chat_tok.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(d)
    chat_tok.save_pretrained(d)
    return d


def _tiny(vocab=300, eos=None):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, eos_token_id=eos,
                      bos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


# -- prompt files and datasets ----------------------------------------------------

def test_prompt_files_text_json_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\n  \nsecond prompt\n")
    assert read_prompt_file(tmp_path / "p.txt") == ["first prompt", "second prompt"]
    (tmp_path / "p.json").write_text(json.dumps(["a", CHATS[0], {"prompt": "b"}]))
    assert read_prompt_file(tmp_path / "p.json") == ["a", CHATS[0], "b"]
    lines = [json.dumps(x) for x in ({"messages": CHATS[1]}, "c", {"question": "q?"})]
    (tmp_path / "p.jsonl").write_text("\n".join(lines[:2]) + "\n")
    assert read_prompt_file(tmp_path / "p.jsonl") == [CHATS[1], "c"]
    (tmp_path / "q.jsonl").write_text(lines[2] + "\n")
    assert read_prompt_file(tmp_path / "q.jsonl", field="question") == ["q?"]


@pytest.mark.parametrize("content, message", [
    ('{"a": 1}\nnot json\n', "line 2 is not valid JSON"),
    ('{"answer": "x"}\n', "no field"),
    ('[1, 2]\n', "a record must be a prompt string"),
    ('"  "\n', "empty prompt"),
])
def test_bad_prompt_files_name_the_problem(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        read_prompt_file(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="does not exist"):
        read_prompt_file(tmp_path / "missing.jsonl")


def test_dataset_through_the_datasets_library(tmp_path):
    pytest.importorskip("datasets")
    f = tmp_path / "chats.jsonl"
    f.write_text("".join(json.dumps({"id": i, "conv": c}) + "\n" for i, c in enumerate(CHATS[:3])))
    assert read_dataset(str(f), "train", "conv") == CHATS[:3]
    with pytest.raises(ValueError, match="`--field` 'nope' is not a column"):
        read_dataset(str(f), "train", "nope")


def test_chat_is_cut_after_the_last_user_turn_and_templated(chat_tok):
    chat = CHATS[0] + [{"role": "assistant", "content": "a reply the model must write itself"}]
    ids = prompt_ids(chat_tok, chat, chat=True, max_len=1000)
    text = chat_tok.decode(ids)
    assert text.endswith("<|user|>\nNow call it 0 times.\n<|assistant|>\n")
    assert "a reply the model must write itself" not in text and "<|system|>" in text
    assert prompt_ids(chat_tok, chat, chat=True, max_len=5) == ids[-5:]  # left-truncated: generation continues
    plain = prompt_ids(chat_tok, "def f(x):", chat=True, max_len=1000)  # a string becomes one user turn
    assert chat_tok.decode(plain) == "<|user|>\ndef f(x):\n<|assistant|>\n"
    with pytest.raises(ValueError, match="chat template"):
        prompt_ids(chat_tok, chat, chat=False, max_len=1000)


def test_held_out_split_is_seeded_disjoint_and_small():
    recs = [f"p{i}" for i in range(50)]
    train, valid = split_records(recs, valid=256, seed=3)
    assert len(valid) == 5 and not set(train) & set(valid) and sorted(train + valid) == sorted(recs)
    assert split_records(recs, 256, seed=3) == (train, valid)


# -- distillation -----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_left_padded_batches_equal_hf_generate_one_by_one(tmp_path, arch):
    from conftest import make_model
    model = make_model(arch, vocab=128)  # generate() below uses HF's own cache, distill() its reserved buffer
    prompts = [[5, 6, 9], [1, 2, 3, 4, 5, 6, 8, 8], [9] * 5, [100, 120], [11, 12, 13]]

    def hf(p, eos):
        return model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos)[0].tolist()

    eos = hf(prompts[0], None)[3 + 5]  # a token row 0 writes: at least one row ends early
    d = distill(model, prompts, DistillConfig(gen_len=12, batch=3, greedy_frac=1.0), tmp_path, eos=[eos], pad=0)
    ended = 0
    for i, p in enumerate(prompts):
        ref = hf(p, eos)
        if eos in ref[len(p):]:  # a row ends at its first EOS, which is kept
            ref = ref[: len(p) + ref[len(p):].index(eos) + 1]
            ended += 1
        assert d.row(i).tolist() == ref and d.prompt_lens[i] == len(p)
    assert ended >= 1 and len(d.row(0)) <= 3 + 6
    seq, gen = d.batch([1, 3], 0)
    assert seq.shape[0] == 2 and gen[0, :8].sum() == 0 and gen[0].sum() == len(d.row(1)) - 8


@pytest.mark.parametrize("scale", [0.3, 3.0])  # a flat law (nucleus of most tokens) and a peaked one
def test_sampled_shards_follow_the_filtered_law_and_are_seeded(scale):
    from specdec.sampler import filter_logits
    torch.manual_seed(0)
    row = torch.randn(1, 20) * scale
    n = 200_000
    scores = row.expand(n, 20)  # [n, V]: one law, many rows in one call

    def draw(seed, temperature=0.7):
        return NucleusSampler(temperature, 0.8, torch.Generator().manual_seed(seed))(None, scores).argmax(-1)

    def tv(toks):  # total variation to the filtered law
        want = torch.softmax(filter_logits(row, SamplingParams(temperature=0.7, top_p=0.8)), -1)[0]  # [V]
        got = torch.bincount(toks, minlength=20).double() / len(toks)
        return 0.5 * float((got - want).abs().sum()), got, want

    toks = draw(1)
    assert torch.equal(toks, draw(1)) and not torch.equal(toks, draw(2))
    dist, got, want = tv(toks)
    assert (got[want == 0] == 0).all() and (want > 0).sum() >= 2  # only the nucleus, and more than argmax
    assert dist < 0.01  # sampling noise is about 0.004 here
    assert tv(draw(1, temperature=1.0))[0] > 0.03  # a wrong law is caught by the same check
    assert [shard_is_greedy(i, 0.75) for i in range(8)] == [True, True, True, False] * 2


def test_cache_is_reused_resumed_and_refused_for_other_settings(tmp_path, monkeypatch):
    model = _tiny()
    prompts = [[i, i + 1, i + 2] for i in range(1, 11)]
    cfg = DistillConfig(gen_len=6, batch=4, greedy_frac=0.5)
    full = distill(model, prompts, cfg, tmp_path / "c", eos=[], pad=0)
    assert len(list((tmp_path / "c").glob("shard-*.npz"))) == 3

    calls = []
    real = distill_mod.generate_shard
    monkeypatch.setattr(distill_mod, "generate_shard", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = distill(model, prompts, cfg, tmp_path / "c", eos=[], pad=0)  # retraining: no generation
    assert calls == [] and (again.ids == full.ids).all()

    (tmp_path / "c" / "shard-00001.npz").unlink()  # a cut run
    with pytest.raises(ValueError, match="pass --resume"):
        distill(model, prompts, cfg, tmp_path / "c", eos=[], pad=0)
    resumed = distill(model, prompts, cfg, tmp_path / "c", eos=[], pad=0, resume=True)
    assert calls == [1] and (resumed.ids == full.ids).all()  # only the missing shard, same tokens

    with pytest.raises(ValueError, match="gen_len"):
        distill(model, prompts, DistillConfig(gen_len=7, batch=4), tmp_path / "c", eos=[], pad=0, resume=True)
    with torch.no_grad():  # a fine-tune that leaves the embeddings alone is another model
        model.model.layers[1].mlp.down_proj.weight[:, 0] += 1.0
    with pytest.raises(ValueError, match="model_weights"):
        distill(model, prompts, cfg, tmp_path / "c", eos=[], pad=0, resume=True)


# -- the command, end to end -------------------------------------------------------

@pytest.mark.train
def test_heads_on_a_chat_jsonl_write_a_model_card(chat_model_dir, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    out = tmp_path / "out"
    args = ["heads", "--model", str(chat_model_dir), "--out", str(out), "--device", "cpu", "--prompts", str(data),
            "--gen-len", "10", "--batch-size", "4", "--max-steps", "3", "--num-heads", "2", "--eval-prompts", "2",
            "--eval-tokens", "8"]
    assert train_main(args) == 0
    metrics = json.loads((out / "heads_metrics.json").read_text())
    assert metrics["valid_sequences"] == 2 and metrics["train_sequences"] == 22  # a tenth held out
    assert metrics["card"]["data"] == {"kind": "file", "name": str(data), "records": 24, "chat": True}
    tau = metrics["tau"]
    assert tau["prompts"] == 2 and tau["identical_to_greedy"] == 2 and tau["mean_accepted_length"] >= 1.0
    card = (out / "heads" / "README.md").read_text()
    assert card.startswith("---\nbase_model: ") and "library_name: specdec" in card
    assert "| 0 | t+2 |" in card and "| 1 | t+3 |" in card and "Greedy mean accepted length" in card
    assert "--prompts " + str(data) in card and "export-heads" in card and "hf upload" in card
    assert "through the tokenizer's chat template" in card
    loaded = specdec.load(str(chat_model_dir), heads=str(out / "heads"))
    assert specdec.generate(loaded, prompt="hi", max_new_tokens=4).stats["new_tokens"] >= 1

    # retraining with other head settings reuses the distillation; a cut cache needs --resume
    assert train_main(args[:-6] + ["--num-heads", "3", "--eval-prompts", "0"]) == 0
    assert "shards loaded from" in (out / "train.log").read_text()
    again = json.loads((out / "heads_metrics.json").read_text())
    assert again["distill_tokens"] == 0 and "loaded from the cache" in (out / "heads" / "README.md").read_text()
    assert metrics["distill_tokens"] > 0 and metrics["distill_tokens_per_second"] > 0
    next((out / "distill" / "train").glob("shard-*.npz")).unlink()
    with pytest.raises(SystemExit):
        train_main(args)
    assert train_main(args + ["--resume"]) == 0


@pytest.mark.parametrize("extra, message", [
    (["--prompts", "a.txt", "--dataset", "x"], "not both"),
    (["--gen-len", "0"], "--gen-len must be >= 1"),
    (["--greedy-frac", "1.5"], "--greedy-frac must be in [0, 1]"),
])
def test_heads_command_refuses_bad_arguments(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        train_main(["heads", "--model", str(tmp_path), "--out", str(tmp_path / "o"), *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_chat_flag_needs_a_template(tmp_path, capsys):
    model_dir = tmp_path / "m"
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "model")
    _tiny(vocab=len(tok)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    (tmp_path / "p.txt").write_text("a\nb\n")
    with pytest.raises(SystemExit):
        train_main(["heads", "--model", str(model_dir), "--out", str(tmp_path / "o"), "--prompts",
                    str(tmp_path / "p.txt"), "--chat"])
    assert "needs a chat template" in capsys.readouterr().err
