"""Shared fixtures: tiny random HF models built from configs (no hub), HF's own
greedy decoding as the reference, a float64 reference sampler, the benchmark's
"oracle" draft heads (which know the greedy continuation), and a fake byte tokenizer.

Everything runs in float32 on the CPU, in eval mode, from fixed seeds.
"""
from __future__ import annotations

import importlib.util
import math
import socket
import threading
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import specdec
from bench.oracle import OracleHeads
from specdec import EmittedToken, RoundEvent, TreeNode
from specdec.lookup import DEFAULT_LOOKUP

# Finer markers of the slow integration tests; each implies `slow`, so `-m "not slow"` (the quick
# loop) leaves them all out, and `-m "not browser"` just the one kind.
SLOW_KINDS = ("server", "browser", "bench", "train", "install", "process")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
        # An architecture sweep (a parameter named `arch`) runs its first architecture in the quick loop, every
        # one in the full suite.
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.indices.get("arch", 0) > 0:
            item.add_marker(pytest.mark.slow)


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


# -- oracle heads: the one test double for draft heads, shared with the benchmark (bench/oracle.py) --

def oracle_loaded(model: nn.Module, prompt: list[int], n: int, rank_of=None, num_heads: int = 4, tokenizer=None):
    """specdec.load(model) with oracle heads for HF's greedy continuation of `prompt`."""
    ref = prompt + hf_greedy(model, prompt, n + num_heads + 2)
    loaded = specdec.load(model, heads=OracleHeads(model, ref, num_heads, rank_of), device="cpu", tokenizer=tokenizer)
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


def load_script(name: str):
    """A module from scripts/ (which is not a package), e.g. load_script("eval_embedded")."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A free loopback port for a test server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- UI: synthetic round events, and handlers on the embedded model --------------------------------

P0 = {"temperature": 0.7, "top_k": 50, "top_p": 0.95, "min_p": 0.0, "seed": 1}


def node(tok, text, parent, depth, rank, q, p, status, source="heads"):
    return TreeNode(tok, text, parent, depth, rank, q, p, status, "root" if parent < 0 else source)


def tree_event(index: int = 1, params: dict | None = None) -> RoundEvent:
    """root -> ' fib' (accepted) -> '(n' (accepted) -> '):' (rejected); a correction '\\n' follows.

    Node ids: 0 root, 1 ' fib' (d1 r0, accepted), 2 '<b>' (d1 r1, not reached), 3 '(' (d2 r0, rejected),
    4 '(n' (d2 r1, accepted), 5 '):' (d3 r0, rejected), 6 'x' (d2 r0 under node 2, not reached).
    """
    nodes = (
        node(10, "def", -1, 0, -1, None, None, "root"),
        node(11, " fib", 0, 1, 0, 0.6, 0.7, "accepted"),
        node(12, "<b>", 0, 1, 1, 0.2, None, "not_reached"),
        node(13, "(", 1, 2, 0, 0.5, 0.1, "rejected"),
        node(14, "(n", 1, 2, 1, 0.3, 0.8, "accepted"),
        node(15, "):", 4, 3, 0, 0.4, 0.05, "rejected"),
        node(16, "x", 2, 2, 0, 0.1, None, "not_reached"),
    )
    emitted = (EmittedToken(11, " fib", "accepted", 0.6, 0.7), EmittedToken(14, "(n", "accepted", 0.3, 0.8),
               EmittedToken(17, "\n", "correction", None, 0.5))
    return RoundEvent(index, nodes, (0, 1, 4), emitted, dict(params or P0), "lossless", True,
                      {"draft": 1.0, "forward": 8.0, "verify": 1.0, "total": 10.0}, 3 * index + 1)


def prefill_event(params: dict | None = None, kind: str = "bonus") -> RoundEvent:
    return RoundEvent(0, (), (), (EmittedToken(9, "x", kind, None, 0.9),), dict(params or P0),
                      "lossless", kind != "baseline", {"forward": 20.0, "total": 20.0}, 1, prompt_tokens=4)


def plain_event(index: int) -> RoundEvent:
    return RoundEvent(index, (), (0,), (EmittedToken(20 + index, "y", "baseline", None, 0.4),), dict(P0), "plain",
                      False, {"forward": 5.0, "total": 5.0}, index + 1)


def figure(value):
    """A figure the handlers streamed (`plots.plot_data`, serialized for Gradio) as a Plotly figure again."""
    import json

    import plotly.graph_objects as go
    from gradio.components.plot import PlotData

    return go.Figure(json.loads(value.plot)) if isinstance(value, PlotData) else value


def by_name(fig) -> dict:
    """A figure's traces by name."""
    return {t.name: t for t in fig.data}


def lookup_event() -> RoundEvent:
    """Two head drafts under the root and, listed after them, an 8-token lookup chain grafted below the root.

    Node ids: 0 root, 1 'a' (d1 r0, rejected), 2 'b' (d1 r1, not reached), 3..10 the chain (rank -1):
    3..7 accepted, 8 rejected, 9 and 10 not reached. A correction follows node 7.
    """
    nodes = [node(10, "x", -1, 0, -1, None, None, "root"),
             node(11, "a", 0, 1, 0, 0.5, 0.1, "rejected"),
             node(12, "b", 0, 1, 1, 0.2, None, "not_reached")]
    for k in range(8):
        status = "accepted" if k < 5 else "rejected" if k == 5 else "not_reached"
        nodes.append(node(20 + k, f"t{k}", 0 if k == 0 else 2 + k, k + 1, -1, None,
                          0.9 if k <= 5 else None, status, "lookup"))
    emitted = tuple(EmittedToken(20 + k, f"t{k}", "accepted", None, 0.9) for k in range(5)) + \
        (EmittedToken(30, "!", "correction", None, 0.4),)
    return RoundEvent(1, tuple(nodes), (0, 3, 4, 5, 6, 7), emitted, dict(P0), "lossless", True,
                      {"draft": 1.0, "forward": 8.0, "verify": 1.0, "total": 10.0}, 7)


def run_events() -> list[RoundEvent]:
    changed = dict(P0, temperature=1.2)
    return [prefill_event(), tree_event(1), tree_event(2), tree_event(3, changed)]


def race_lane(tokens_per_round: list[int], total_ms: float, forward_ms: float, nodes: int) -> list[RoundEvent]:
    events = [prefill_event()]
    for i, k in enumerate(tokens_per_round, start=1):
        emitted = tuple(EmittedToken(i, "t", "accepted" if j < k - 1 else "correction", None, 0.5) for j in range(k))
        tree = tuple(node(1, "t", -1 if j == 0 else 0, min(j, 1), j - 1, 0.5, 0.5, "root" if j == 0 else "rejected")
                     for j in range(nodes))
        events.append(RoundEvent(i, tree, (0,), emitted, dict(P0), "lossless", nodes > 0,
                                 {"forward": forward_ms, "total": total_ms}, i))
    return events


@pytest.fixture(scope="session")
def handlers():
    """Handlers over the embedded model, shared by the UI tests (each test uses its own Session)."""
    from components.handlers import Handlers  # gradio: imported by the UI tests only

    return Handlers(specdec.load(device="cpu"), max_prompt_tokens=64, figure_interval=0.0, text_interval=0.0)


CONTROLS = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, max_new_tokens=10, seed=0, tree="chain",
                acceptance="lossless", speculative=True, lookup=DEFAULT_LOOKUP, lookup_mode="first", chat=False)


def race_controls(versus: str = "plain", **change) -> list:
    """Compare's inputs: the controls less `speculative` (a race always runs both), then what it races against."""
    return [v for k, v in {**CONTROLS, **change}.items() if k != "speculative"] + [versus]


def chat_loaded(handlers):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(specdec.api.DEFAULT_MODEL))
    tok.chat_template = ("{% for m in messages %}<|user|> {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|> {% endif %}")
    return specdec.load(handlers.loaded.model, heads=None, tokenizer=tok, device="cpu")


def submit_together(s, requests, **kw) -> list:
    """Submit while the scheduler thread waits in a call, so that all of them join in one iteration."""
    started, go = threading.Event(), threading.Event()
    s.call_soon(lambda: started.set() or go.wait(30))
    assert started.wait(30)
    tickets = [s.submit(r, **kw) for r in requests]
    go.set()
    return tickets


# A small shape for the hub's config classes (tests/test_target.py, tests/test_architectures.py).
HUB_SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, initializer_range=0.1, bos_token_id=None, eos_token_id=None,
                 pad_token_id=None)


def tiny_hub_model(spec) -> nn.Module:
    """A tiny random fp32 model from (config class, model class, config overrides, attention implementation)."""
    cfg_cls, model_cls, overrides, attn = spec
    cfg = cfg_cls(**{**HUB_SMALL, **overrides})
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = model_cls(cfg).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# Every Scheduler made in this process, for `schedulers_idle` (a weak set: a closed one can still be collected).
_SCHEDULERS: "weakref.WeakSet" = __import__("weakref").WeakSet()
_scheduler_init = specdec.scheduler.Scheduler.__init__


def _tracked_init(self, *args, **kwargs) -> None:
    _scheduler_init(self, *args, **kwargs)
    _SCHEDULERS.add(self)


specdec.scheduler.Scheduler.__init__ = _tracked_init


@pytest.fixture
def schedulers_idle():
    """After the test, every scheduler in this process has ended every request it accepted, runs no call,
    and never had to end a request it had lost (`Scheduler.idle`): a request left unended is a client
    waiting forever. Opt in with `pytestmark = pytest.mark.usefixtures("schedulers_idle")`."""
    yield
    busy = [s.stats() for s in list(_SCHEDULERS) if not s.idle(timeout=10.0)]
    assert not busy, f"schedulers not idle after the test: {busy}"


def wait_until(pred, timeout: float = 30.0, what: str = "the condition", every: float = 0.01):
    """Poll `pred()` until it returns something truthy (returned); AssertionError naming `what` past `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(every)
