"""The sampler: temperature -> top-k -> top-p -> min-p, in Hugging Face's order.

`filter_logits` alone shapes the target law: plain sampling, the lossless verifier, the bonus token and the
UI's sampler view all call it, so their filters cannot differ. Maths runs in float32 whatever the model
dtype, and filtering never leaves an empty support.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings for one request, validated on construction."""

    temperature: float = 0.0  # 0 = greedy (argmax); > 0 divides the logits
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches p; 1 = off
    min_p: float = 0.0  # keep tokens with prob >= min_p * max prob; 0 = off
    seed: int | None = None  # seeds the request's uniforms (`position_uniforms`); None draws a fresh seed

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or math.isnan(t) or t < 0 or math.isinf(t):
            raise ValueError(f"`temperature` must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"`top_k` must be an integer >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or isinstance(p, bool) or math.isnan(p) or not 0 < p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1] (1 = off), got {p!r}")
        m = self.min_p
        if not isinstance(m, (int, float)) or isinstance(m, bool) or math.isnan(m) or not 0 <= m <= 1:
            raise ValueError(f"`min_p` must be in [0, 1] (0 = off), got {m!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ValueError(f"`seed` must be a non-negative integer or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return dict(vars(self))  # the fields, all plain values: what `asdict` gives, without its deep copy per round

    def replace(self, **changes) -> "SamplingParams":
        return SamplingParams(**{**vars(self), **changes})


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p; removed tokens become -inf.

    Args:
        logits: [..., V] raw model logits, any float dtype. Not modified.
        params: the sampler settings; temperature must be > 0.
    Returns:
        [..., V] float32 logits whose softmax is the filtered target law.
    """
    assert params.temperature > 0, "greedy decoding takes the argmax path, not filter_logits"
    x = finite_logits(logits.float())
    if bool(torch.isnan(x).any() | torch.isneginf(x).all(dim=-1).any()):  # one host sync for both checks
        raise ValueError("logits contain NaN, or are -inf for every token: there is no distribution to sample")
    # Subtracting the max first keeps a tiny temperature from overflowing to inf (and softmax from NaN).
    x = (x - x.amax(dim=-1, keepdim=True)) / params.temperature
    V = x.shape[-1]
    if 0 < params.top_k < V:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        x = x.masked_fill(x < kth, float("-inf"))  # ties with the k-th are kept, as in HF
    if params.top_p < 1:
        x = _top_p(x, params.top_p)
    if params.min_p > 0:
        probs = torch.softmax(x, dim=-1)
        threshold = params.min_p * probs.amax(dim=-1, keepdim=True)
        x = x.masked_fill(probs < threshold, float("-inf"))
    return x


def finite_logits(x: torch.Tensor) -> torch.Tensor:
    """Rows with +inf logits (an fp16 overflow) get their limit law: the +inf tokens share the mass equally.

    Args:
        x: [..., V] float logits; rows without +inf pass unchanged (with one, `x - max` would be NaN).
    """
    pos = torch.isposinf(x)
    if x.device.type == "cpu" and not bool(pos.any()):  # a host sync is free on a CPU, not on an accelerator
        return x
    limit = torch.zeros_like(x).masked_fill(~pos, float("-inf"))
    return torch.where(pos.any(dim=-1, keepdim=True), limit, x)


_TOP_P_PREFIX = 256  # sorted first, as a full sort costs more than a CPU sampling step; wider nuclei sort all


def _top_p(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; the top token always stays.

    Args:
        x: [..., V] float32 logits.
    """
    V = x.shape[-1]
    k = min(V, _TOP_P_PREFIX)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    top_x, order = torch.topk(x, k, dim=-1)  # [..., k], descending
    probs = (top_x - lse).exp()  # the same formula in both paths, so they round alike
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens sorted before each one
    if k < V and not bool((mass_before[..., -1] >= top_p).all()):
        top_x, order = torch.sort(x, dim=-1, descending=True)  # a flat distribution: sort it all
        probs = (top_x - lse).exp()
        mass_before = torch.cumsum(probs, dim=-1) - probs
    # The kept tokens' logits put back in place over -inf: two passes over V instead of four.
    kept = top_x.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.full_like(x, float("-inf")).scatter_(-1, order, kept)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The filtered target law p, [..., V] -> [..., V] float32: the argmax's one-hot at temperature 0."""
    if params.greedy:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter(-1, idx, 1.0)
    return torch.softmax(filter_logits(logits, params), dim=-1)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor | float) -> torch.Tensor:
    """The first token whose cumulative mass exceeds u * sum(probs), as a [1] long tensor (no host sync).

    Args:
        probs: [V] non-negative, not necessarily normalised; a token with probability 0 is never drawn.
        u: in [0, 1), so the result is < V whenever the law has mass, and V when it has none.
    """
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # [V]
    return torch.searchsorted(cdf, cdf[-1:] * u, right=True)  # [1]


def draw(probs: torch.Tensor, u: float, at: list[int] = ()) -> tuple[int, list[float], float]:
    """Draw by inverse CDF at uniform u, in one host sync: (token, [probs[i] for i in at], probs[token]).

    Args:
        probs: [V] non-negative, not necessarily normalised; ValueError if it has no positive finite mass.
    """
    y = inverse_cdf(probs, u)  # [1], V when the law has no mass
    idx = y.clamp_max(probs.shape[-1] - 1)
    if at:
        idx = torch.cat([torch.tensor(at, dtype=torch.long, device=probs.device), idx])
    host = torch.cat([y.to(probs.dtype), probs[idx]]).tolist()  # ids < 2**24 are exact in float32
    tok = int(host[0])
    if tok >= probs.shape[-1]:  # no mass, or NaN: never return a token past V
        raise ValueError("sample: the distribution has no positive finite mass to draw from")
    return tok, host[1:-1], host[-1]


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """A token id from a [V] law at a float64 uniform from `generator` (`draw`; cheaper than multinomial)."""
    return draw(probs, float(torch.rand(1, generator=generator, dtype=torch.float64, device=probs.device)))[0]


def position_uniforms(seed: int, n: int) -> list[float]:
    """A request's uniforms, one per output position: the token at position t is drawn with the t-th."""
    # Keyed to positions, not draw counts, so a seeded request's tokens do not depend on what drafted them;
    # a CPU generator, so a seed means the same on any device.
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).tolist()


def filter_stages(logits: torch.Tensor, params: SamplingParams, top: int = 20) -> list[dict]:
    """The `top` likeliest tokens under temperature alone, for the UI's sampler view.

    Args:
        logits: [V].
    Returns:
        per token: its probability before and after filtering, and the filter that removed it (None: kept).
    """
    x = finite_logits(logits.float())
    t = params.temperature if params.temperature > 0 else 1.0
    base = torch.softmax((x - x.max()) / t, dim=-1)
    stages: list[tuple[str, SamplingParams]] = []
    if params.greedy:
        final = target_probs(x, params)
    else:
        final = torch.softmax(filter_logits(x, params), dim=-1)
        off = SamplingParams(temperature=t)
        stages = [
            ("top_k", off.replace(top_k=params.top_k)),
            ("top_p", off.replace(top_k=params.top_k, top_p=params.top_p)),
            ("min_p", off.replace(top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)),
        ]
    kept_after = [(name, torch.isfinite(filter_logits(x, sp))) for name, sp in stages]
    values, ids = torch.topk(base, min(top, base.shape[-1]))
    rows = []
    for v, i in zip(values.tolist(), ids.tolist()):
        removed_by = None
        if params.greedy:
            removed_by = None if final[i] > 0 else "greedy"
        else:
            for name, kept in kept_after:
                if not kept[i]:
                    removed_by = name
                    break
        rows.append({"token_id": i, "prob": v, "filtered_prob": float(final[i]), "removed_by": removed_by})
    return rows
