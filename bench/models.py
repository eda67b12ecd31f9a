"""The model and heads under test: specdec.load plus the bench-only specs (random:..., none, oracle)."""
from __future__ import annotations

import torch

import specdec
from specdec.api import DEFAULT_MODEL, resolve_dtype

from .config import BenchConfig
from .oracle import OracleHeads

RANDOM_SHAPES = {
    # Qwen2-0.5B's shape (random weights): 24 layers, 14 heads, 2 KV heads.
    # A weight std above HF's 0.02 gives peaked logits, so that bf16 rounding rarely flips an argmax.
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                 max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, use_sliding_window=False, initializer_range=0.05)),
    # A few-MB model for tests and dry runs of the GPU script; its vocabulary is the embedded tokenizer's.
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True)),
    "tiny-qwen2": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=1024, use_sliding_window=False,
                                 initializer_range=0.1)),
}


def random_model(shape: str, device: str, dtype: torch.dtype, seed: int = 0, vocab_size: int | None = None):
    """A random-weight causal LM built from a config (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if shape not in RANDOM_SHAPES:
        raise ValueError(f"unknown random model shape {shape!r}; choose one of {sorted(RANDOM_SHAPES)}")
    kind, kw = RANDOM_SHAPES[shape]
    kw = {"vocab_size": vocab_size, **kw}
    if kw["vocab_size"] is None:
        raise ValueError(f"random model shape {shape!r} needs a vocab_size")
    config = AutoConfig.for_model(kind, bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config._name_or_path = f"random:{shape}"
    return model.eval()


def load_target(cfg: BenchConfig) -> tuple[specdec.Loaded, OracleHeads | None]:
    """specdec.load with the bench-only model specs (random:...) and head specs (none, oracle) resolved."""
    dev = torch.device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, dev)
    model, tokenizer = cfg.model, None
    if model is not None and model.startswith("random:"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
        model = random_model(model.split(":", 1)[1], cfg.device, dtype, cfg.seed, vocab_size=len(tokenizer))
        if len(tokenizer) != model.config.vocab_size:
            tokenizer = None  # prompts are still encoded with it, but it cannot decode this vocabulary
    heads = cfg.heads
    graphs = None if cfg.cuda_graphs else False  # None: on where the model runs on CUDA
    if heads == "none" or (heads or "").startswith("oracle"):
        # specdec.load(None, None) means "embedded model with embedded heads", so name the model explicitly.
        loaded = specdec.load(model if model is not None else str(DEFAULT_MODEL), None, cfg.device, dtype,
                              tokenizer=tokenizer, cuda_graphs=graphs)
        if heads == "none":
            return loaded, None
        acc = float(heads.split(":", 1)[1]) if ":" in heads else 1.0
        oracle = OracleHeads(loaded.model, accuracy=acc, seed=cfg.seed, mimic_cost=True)
        return specdec.load(loaded.model, oracle, cfg.device, dtype, tokenizer=loaded.tokenizer,
                            cuda_graphs=graphs), oracle
    return specdec.load(model, heads, cfg.device, dtype, tokenizer=tokenizer, cuda_graphs=graphs), None
