"""Oracle draft heads: heads that know the reference continuation, so the accepted length is set by design.

The one test double for draft heads, shared by the benchmark (`--heads oracle:0.8`) and the tests
(`tests/conftest.py`): with the drafter's quality fixed, speedup / accepted length measures the
engine itself, and the tests can force long paths, later siblings and rejections at will.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from specdec.heads import HeadsConfig, MedusaHeads, target_dims

RankOf = Callable[[int, int], int]  # (reference position of the last accepted token, head k) -> rank of the truth
MISS = 1 << 30  # a rank beyond every tree (clamped to the last one): the head never proposes the truth


def accuracy_ranks(accuracy: float, positions: int, num_heads: int, seed: int) -> RankOf:
    """A `rank_of` that is right (rank 0) with probability `accuracy`, drawn once per (position, head) from `seed`.

    On a miss the truth falls out of every top-k, so a chain accepts sum(accuracy**d) tokens per round.
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"oracle `accuracy` must be in [0, 1], got {accuracy!r}")
    g = torch.Generator().manual_seed(seed)
    hits = (torch.rand(positions, num_heads, generator=g) < accuracy).tolist()  # [T, K]
    return lambda pos, k: 0 if pos < len(hits) and hits[pos][k] else MISS


class OracleHeads(MedusaHeads):
    """Draft heads that know a reference sequence (prompt + the target's greedy continuation).

    The engine calls the heads with the hidden state of the last accepted token; the oracle finds the
    reference position of that hidden state (nearest neighbour among the target's own hidden states
    of the reference), and head k ranks the true token at position + k + 2 at `rank_of(position, k)`.
    Rank 0 everywhere is a perfect drafter; other ranks force the verifier onto later siblings
    (non-contiguous accepted paths); a rank outside the tree forces a reject. The position comes
    from the hidden state, not from a counter, so the heads keep no state between rounds.

    With `accuracy`, `begin(ref, key)` draws a fresh hit pattern (`accuracy_ranks`) for each request.
    With `mimic_cost`, every call also runs the shared lm_head K times, as real shared heads do.
    """

    def __init__(self, model: nn.Module, ref_ids: list[int] | None = None, num_heads: int = 4,
                 rank_of: RankOf | None = None, accuracy: float | None = None, seed: int = 0,
                 mimic_cost: bool = False) -> None:
        hidden, vocab = target_dims(model)
        super().__init__(HeadsConfig(hidden, vocab, num_heads, num_layers=0, shared_lm_head=True),
                         model.get_output_embeddings())
        if accuracy is not None:
            accuracy_ranks(accuracy, 0, num_heads, seed)  # checks it now, not at the first request
        self._model = [model]  # a plain list: the target is not a submodule of its heads
        self.accuracy, self.seed, self.mimic_cost = accuracy, seed, mimic_cost
        self.rank_of = rank_of or (lambda pos, k: 0)
        self.ref: list[int] = []
        self.h_ref: torch.Tensor | None = None  # [T, H]
        if ref_ids is not None:
            self.begin(ref_ids)

    @torch.inference_mode()
    def begin(self, ref_ids: list[int], key: int = 0) -> None:
        """Take a new reference (prompt + continuation); with `accuracy`, `key` seeds its hit pattern."""
        model = self._model[0]
        self.ref = list(ref_ids)
        x = torch.tensor([self.ref], device=next(model.parameters()).device)
        self.h_ref = model.base_model(x).last_hidden_state[0].float()  # [T, H]
        if self.accuracy is not None:
            self.rank_of = accuracy_ranks(self.accuracy, len(self.ref), self.config.num_heads,
                                          self.seed * 1_000_003 + key)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [H] -> [K, V]
        assert self.h_ref is not None, "call begin(reference ids) first"
        K, V = self.config.num_heads, self.config.vocab_size
        pos = int((self.h_ref - hidden.float()).norm(dim=-1).argmin())
        ids = torch.arange(V, device=hidden.device)  # [V]
        ranks = []
        for k in range(K):
            j = pos + k + 2
            true = self.ref[j] if j < len(self.ref) else 0
            r = min(self.rank_of(pos, k), V - 1)
            others = ids - (ids > true).long()  # rank among the other tokens, in id order
            rank = others + (others >= r).long()  # ... with the truth inserted at rank r
            rank[true] = r
            ranks.append(rank)
        scores = 10.0 - 10.0 * torch.stack(ranks).float() / (V - 1)  # [K, V], 10 at rank 0 down to 0
        # float32 whatever the model's dtype: bf16 steps by 0.0625 at 10, so over a 151,936-token vocabulary
        # its top ~475 scores would tie and top-k would never return the truth (measured: tau 1.00).
        if not self.mimic_cost:
            return scores
        return super().forward(hidden).float().zero_().add_(scores)
