"""components/gate.py and the engine's narrow face it wraps: `Engine.info()` and `Engine.sampler_rows()`."""
from __future__ import annotations

import json

import gradio as gr
import pytest
import torch

from components.gate import ModelGate
from specdec import GenerationRequest, SamplingParams
from specdec.sampler import filter_stages


def test_info_is_plain_values(loaded_llama):
    info = loaded_llama.engine.info()
    assert json.loads(json.dumps(info)) == info  # nothing but plain values
    model = loaded_llama.model
    assert info["params"] == sum(p.numel() for p in model.parameters())
    assert (info["dtype"], info["device"], info["device_type"]) == ("float32", "cpu", "cpu")
    assert info["context"] == model.config.max_position_embeddings and info["heads"] == 4
    assert info["trees"]["default"] == 64 and info["trees"]["chain"] == 5 and "trained" not in info["trees"]
    assert info["prefix_cache"] is None


def test_sampler_rows_are_the_filter_stages_of_the_next_logits(loaded_llama):
    engine, params = loaded_llama.engine, SamplingParams(temperature=0.8, top_k=3)
    rows = engine.sampler_rows([1, 2, 3], params, top=6)
    assert rows == filter_stages(engine.next_logits([1, 2, 3]), params, top=6)
    assert len(rows) == 6 and sum(r["removed_by"] is None for r in rows) == 3
    assert all(not isinstance(v, torch.Tensor) for r in rows for v in r.values())


def test_gate_turns_refusals_into_toasts_and_trims_the_context(loaded_llama):
    gate = ModelGate(loaded_llama.engine)
    with pytest.raises(gr.Error, match="vocabulary"):
        gate.stream(GenerationRequest([10_000], 4))
    ctx = gate.info["context"]
    rows = gate.sampler_rows(list(range(5)) * ctx, SamplingParams(), top=3)  # longer than the context: no error
    assert len(rows) == 3
    stream = gate.stream(GenerationRequest([1, 2, 3], 2, speculative=False))
    first, seconds = gate.step(stream)
    assert first.index == 0 and seconds >= 0
    gate.close(stream)
    assert gate.device_name == "CPU" and gate.prefix_cache() is None
