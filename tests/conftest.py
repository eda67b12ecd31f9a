"""Shared fixtures: tiny random HF models built from configs (no hub), HF's own
greedy decoding as the reference, a float64 reference sampler, "oracle" draft
heads that know the greedy continuation, and a fake byte tokenizer.

Everything runs in float32 on the CPU, in eval mode, from fixed seeds.
"""
from __future__ import annotations

import math
import socket

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import specdec
from specdec.heads import HeadsConfig

# Other work shares this machine: one intra-op thread is also the fastest
# setting for models this small.
torch.set_num_threads(1)

VOCAB = 128  # vocabulary of the tiny models
CONTEXT = 256  # max_position_embeddings / n_positions
ARCHS = ("llama", "qwen2", "gpt2")


def make_model(arch: str, vocab: int = VOCAB, context: int = CONTEXT, seed: int = 0, init: float = 0.1,
               layers: int = 2, attn: str = "sdpa") -> nn.Module:
    """A tiny random causal LM in fp32 eval mode.

    `init` is the weight std: larger than HF's 0.02 so that the logits are
    peaked (far-apart argmaxes, filters that actually cut, repetitive text).
    No EOS is configured, so HF `generate` runs to `max_new_tokens`.
    """
    common = dict(vocab_size=vocab, initializer_range=init, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=context, **common)
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2, max_position_embeddings=context, use_sliding_window=False,
                          **common)
        cls = Qwen2ForCausalLM
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=context, **common)
        cls = GPT2LMHeadModel
    else:
        raise ValueError(arch)
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = None
    return model


@pytest.fixture(scope="session")
def models() -> dict[str, nn.Module]:
    return {a: make_model(a) for a in ARCHS}


@pytest.fixture(scope="session", params=ARCHS)
def arch_model(request, models):
    return request.param, models[request.param]


@pytest.fixture(scope="session")
def llama(models) -> nn.Module:
    return models["llama"]


@pytest.fixture(scope="session")
def loaded_llama(llama):
    return specdec.load(llama, heads="random", device="cpu")


PROMPTS = ([5, 17, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [99, 42, 7, 7, 120, 64, 0, 31])


@torch.inference_mode()
def hf_greedy(model: nn.Module, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """Hugging Face's own greedy decoding: the reference for exactness."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                         min_new_tokens=None if eos is not None else n, eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def naive_logits(model: nn.Module, ids: list[int]) -> torch.Tensor:
    """Logits of the last position from a no-cache forward of the full sequence. [V]"""
    return model(torch.tensor([ids])).logits[0, -1].float()


# -- a float64 reference sampler ------------------------------------------------

NEG = float("-inf")


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                    min_p: float = 0.0) -> tuple[torch.Tensor, float]:
    """The filtered target law of one [V] row in float64, written from the definitions.

    temperature -> top-k (ties with the k-th kept) -> top-p (smallest set of the
    most likely tokens whose mass reaches p) -> min-p (prob >= min_p * max prob).
    Returns (probs [V] float64, margin): margin is how close any keep/drop
    decision came to its threshold, so callers can avoid float32 ties.
    """
    x = logits.double().clone()
    V = x.shape[0]
    x = x / temperature  # -inf stays -inf
    keep = torch.isfinite(x)
    margin = math.inf

    def probs_of(keep):
        z = torch.where(keep, x, torch.tensor(NEG, dtype=torch.float64))
        return torch.softmax(z - z[keep].max(), dim=0)

    if 0 < top_k < V:
        kth = sorted(x[keep].tolist(), reverse=True)[top_k - 1] if keep.sum() >= top_k else NEG
        keep = keep & (x >= kth)
    if top_p < 1:
        p = probs_of(keep)
        order = sorted(range(V), key=lambda i: -p[i].item())
        mass, new_keep = 0.0, torch.zeros(V, dtype=torch.bool)
        for i in order:
            if not keep[i]:
                continue
            if mass >= top_p:  # the set already reaches p: drop the rest
                break
            new_keep[i] = True
            margin = min(margin, abs(mass + p[i].item() - top_p))
            mass += p[i].item()
        keep = new_keep
    if min_p > 0:
        p = probs_of(keep)
        thr = min_p * p.max().item()
        for i in range(V):
            if keep[i] and p[i] < p.max():  # the top token is always kept
                margin = min(margin, abs(p[i].item() - thr) / max(thr, 1e-300))
        keep = keep & (p >= thr)
    return probs_of(keep), margin


# -- oracle heads ----------------------------------------------------------------

class OracleHeads(nn.Module):
    """Draft heads that know a reference continuation.

    The engine calls the heads with the hidden state of the last accepted
    token; the oracle finds which position of the reference sequence that
    hidden state belongs to (nearest neighbour) and ranks the true token
    t+k+2 at rank `rank_of(pos, k)` of head k. With rank 0 everywhere this is
    a perfect drafter; other ranks force the verifier onto later siblings
    (non-contiguous accepted paths); a rank outside the tree forces a reject.
    """

    def __init__(self, model: nn.Module, ref_ids: list[int], num_heads: int = 4, rank_of=None) -> None:
        super().__init__()
        w = model.get_output_embeddings().weight
        self.config = HeadsConfig(hidden_size=w.shape[1], vocab_size=w.shape[0], num_heads=num_heads)
        self.ref = list(ref_ids)
        with torch.inference_mode():
            self.h_ref = model.base_model(torch.tensor([self.ref])).last_hidden_state[0].clone()  # [T, H]
        self.rank_of = rank_of or (lambda pos, k: 0)
        self.V = int(w.shape[0])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [H] -> [K, V]
        pos = int((self.h_ref - hidden.float()).norm(dim=-1).argmin())
        out = torch.zeros(self.config.num_heads, self.V)
        for k in range(self.config.num_heads):
            j = pos + k + 2
            true = self.ref[j] if j < len(self.ref) else 0
            order = [t for t in range(self.V) if t != true]
            r = min(self.rank_of(pos, k), self.V - 1)
            order.insert(r, true)
            out[k, torch.tensor(order)] = torch.linspace(10.0, 0.0, self.V)
        return out


def oracle_loaded(model: nn.Module, prompt: list[int], n: int, rank_of=None, num_heads: int = 4, tokenizer=None):
    """specdec.load(model) with oracle heads for HF's greedy continuation of `prompt`."""
    ref = prompt + hf_greedy(model, prompt, n + num_heads + 2)
    loaded = specdec.load(model, heads="random", device="cpu", tokenizer=tokenizer)
    loaded.engine.heads = loaded.heads = OracleHeads(model, ref, num_heads, rank_of)
    return loaded, ref[len(prompt):]


# -- a fake byte tokenizer -----------------------------------------------------

class ByteTokenizer:
    """Token i < 256 is byte i; 256..259 are specials (256 = EOS). Decodes like a byte-level BPE."""

    eos_token_id = 256
    vocab_size = 260

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode("utf-8"))}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = b"".join(bytes([i]) if i < 256 else (b"" if skip_special_tokens else f"<{i}>".encode()) for i in ids)
        return out.decode("utf-8", errors="replace")


@pytest.fixture(scope="session")
def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture(scope="session")
def byte_model() -> nn.Module:
    return make_model("llama", vocab=ByteTokenizer.vocab_size, seed=1)


# -- app tests -------------------------------------------------------------------
APP_GREEDY = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, tree="small", acceptance="lossless",
                  speculative=True)  # /generate inputs for a deterministic run


def free_port() -> int:
    """A free loopback port for a test server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
