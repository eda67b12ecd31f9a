"""The target's vocabulary rows for several nodes at once on a CPU: oneDNN with a prepacked weight.

ATen's CPU matmul pays about a one-row product per row; oneDNN, with the weight reordered once into its
blocked layout, runs a few rows in about the time of one. `TargetModel.logits` uses it where
`cost.packed_rows_pay` says it pays, never for plain decoding's single row (which keeps HF's exact logits);
verification is exact for whatever logits the target computes.
"""
from __future__ import annotations

import torch
from torch import nn

# A weight packed for this many rows serves every row count well.
PACK_ROWS = 16


def available(linear: nn.Module) -> bool:
    """Can oneDNN run this output projection here: an fp32 nn.Linear on a CPU, in a build with oneDNN?"""
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
