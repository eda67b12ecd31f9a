"""The target's vocabulary rows for several nodes at once on a CPU: oneDNN with a prepacked weight.

Verification reads the target's logits for a round's nodes: an [M, H] x [H, V] product. Through
ATen's CPU matmul (MKL) a product of a few rows costs about as many one-row products (on this
project's 2-core CPU, 4,096 x 192: 54 µs for one row, 96 µs for two, 145 µs for four, 210 µs for
sixteen), so every drafted node made the round's rows dearer. oneDNN, with the weight reordered once
into its blocked layout, runs one to five rows in about the time of one (31-36 µs) and sixteen in
72 µs; right after a round's forward, when the weight must come back from memory, a 16-node tree's
rows took 265 µs against 443 µs.

`specdec.load` measures whether this pays on the machine (`cost.packed_rows_pay`), and
`TargetModel.logits` uses it for two or more rows, and for every row of a speculative request
(`pack_one`: one copy of the weight in the cache, not two taking turns). Plain decoding's single row,
all that HF's own `generate` computes too, stays on the model's `lm_head`, so plain decoding keeps
HF's exact logits. The packed product differs from ATen's in the last bits, as ATen's own multi-row
product already does; verification is exact for whatever logits the target computes.
"""
from __future__ import annotations

import torch
from torch import nn

# A weight packed for this many rows serves every row count well (measured from 1 to 64 rows).
PACK_ROWS = 16


def available(linear: nn.Module) -> bool:
    """Can this output projection run through oneDNN here: an fp32 nn.Linear on a CPU, in a build with oneDNN?"""
    w = getattr(linear, "weight", None)
    return (isinstance(linear, nn.Linear) and w is not None and w.device.type == "cpu" and w.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class PackedProjection:
    """`linear`'s product through oneDNN: [M, H] -> [M, V], M >= 1. Repacks when the weight changes."""

    def __init__(self, linear: nn.Linear) -> None:
        if not available(linear):
            raise ValueError("PackedProjection needs an fp32 nn.Linear on the CPU and a PyTorch built with oneDNN")
        self.linear = linear
        self._packed: torch.Tensor | None = None
        self._seen: tuple | None = None  # (storage pointer, version) of the weight that was packed

    def _weight(self) -> torch.Tensor:
        w = self.linear.weight
        # An in-place update (fine-tuning, load_state_dict) bumps the version; a new tensor moves the pointer.
        seen = (w.data_ptr(), w._version)
        if seen != self._seen:
            with torch.inference_mode():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
            self._seen = seen
        return self._packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, H] -> [M, V] in float32."""
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._weight(), self.linear.bias, "none", [], "")
