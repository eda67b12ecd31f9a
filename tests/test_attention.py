"""specdec.attention: layer types and windows from real config classes; recurrent layers refused by name."""
from __future__ import annotations

import pytest

from specdec.attention import attention_layout


def test_attention_layout_reads_windows_and_refuses_recurrent_layers():
    from transformers import Gemma2Config, LlamaConfig, MambaConfig, MistralConfig, Qwen2Config, Qwen3NextConfig

    assert attention_layout(LlamaConfig()).window is None
    assert attention_layout(MistralConfig()).window == 4096  # Mistral-7B-v0.1's default window
    layout = attention_layout(Gemma2Config(sliding_window=300, num_hidden_layers=4))
    assert layout.types == ("sliding_attention", "full_attention") * 2
    assert layout.windows == (300, None, 300, None) and layout.window == 300
    assert attention_layout(Qwen2Config(use_sliding_window=False)).window is None
    assert attention_layout(Qwen2Config(use_sliding_window=True, sliding_window=64)).window == 64
    for cfg in (Qwen3NextConfig(), MambaConfig()):
        with pytest.raises(ValueError, match="'linear_attention' layers"):
            attention_layout(cfg)
