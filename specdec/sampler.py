"""The sampler: temperature -> top-k -> top-p -> min-p, in Hugging Face's order.

One pure function, `filter_logits`, shapes the target distribution. The
plain sampler, the lossless verifier, the bonus token and the UI's sampler
view all call it, so the filters can never differ between those paths (a
bug vLLM and SGLang both shipped once).

All maths runs in float32 whatever the model dtype. Filtering never leaves
an empty support: top-k keeps >= 1 token, top-p always keeps the most
likely token, and min-p's threshold is at most the top probability.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Settings for one request. Validated on construction.

    temperature: 0 means greedy (argmax); > 0 divides the logits.
    top_k: keep the k most likely tokens; 0 switches the filter off.
    top_p: keep the smallest set whose probability reaches p; 1 switches it off.
    min_p: keep tokens with prob >= min_p * max prob; 0 switches it off.
    seed: seeds the request's own torch.Generator; None draws a fresh seed.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

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
        return asdict(self)

    def replace(self, **changes) -> "SamplingParams":
        return SamplingParams(**{**asdict(self), **changes})


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
    # Subtracting the max before dividing keeps a tiny temperature from
    # overflowing to inf (inf - inf would be NaN in softmax).
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
    """Give rows with +inf logits (an fp16 overflow) their limit law. [..., V] float -> same shape.

    A +inf logit is the limit of an ever larger one, and in that limit the +inf tokens share all
    the mass equally while every other token gets none; as logits that is 0 for them, -inf for
    the rest. Without this, `x - max` is inf - inf = NaN. Rows without +inf pass unchanged. On
    an accelerator there is no host sync; on a CPU, where a sync is free, rows without +inf (all
    of them, nearly always) are returned after one pass instead of four.
    """
    pos = torch.isposinf(x)
    if x.device.type == "cpu" and not bool(pos.any()):
        return x
    limit = torch.zeros_like(x).masked_fill(~pos, float("-inf"))
    return torch.where(pos.any(dim=-1, keepdim=True), limit, x)


_TOP_P_PREFIX = 256  # tokens sorted first; the nucleus almost always ends inside them


def _top_p(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p. x: [..., V] float32.

    A token is dropped when the mass of the tokens sorted before it already
    reaches top_p (so the most likely token always stays). Sorting the whole
    vocabulary costs more than the rest of a sampling step on a CPU, so we
    sort only the top `_TOP_P_PREFIX` tokens (one `topk`); when the nucleus
    ends inside that prefix, every later token is dropped anyway and the
    result equals the full sort's. Otherwise we fall back to the full sort.
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
    """The filtered target distribution p. [..., V] -> [..., V] float32.

    For temperature 0 this is the one-hot of the argmax, so greedy is the
    limit case of the same law.
    """
    if params.greedy:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter(-1, idx, 1.0)
    return torch.softmax(filter_logits(logits, params), dim=-1)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor | float) -> torch.Tensor:
    """The token whose cumulative mass first exceeds u * sum(probs), as a [1] long tensor on probs' device
    (no host sync). probs: [V], non-negative, not necessarily normalised; u in [0, 1).

    Token i is hit with probability p_i / sum(p) up to float64 rounding, and a token with p_i = 0 never
    is (the first index whose cumulative mass exceeds u * sum lies where mass was added). u < 1 makes
    u * total < total in float64, so an index < V exists whenever the law has mass; V means it has none.
    """
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # [V]
    return torch.searchsorted(cdf, cdf[-1:] * u, right=True)  # [1]


def draw(probs: torch.Tensor, u: float, at: list[int] = ()) -> tuple[int, list[float], float]:
    """The token drawn from a [V] distribution (non-negative, not necessarily normalised) at uniform u,
    by inverse CDF, with probs at the ids `at` and at the drawn token: (token, [probs[i] for i in at],
    probs[token]), in one host sync. Raises ValueError when the law has no positive finite mass.
    """
    y = inverse_cdf(probs, u)  # [1], V when the law has no mass
    idx = y.clamp_max(probs.shape[-1] - 1)
    if at:
        idx = torch.cat([torch.tensor(at, dtype=torch.long, device=probs.device), idx])
    host = torch.cat([y.to(probs.dtype), probs[idx]]).tolist()  # ids < 2**24 are exact in float32
    tok = int(host[0])
    if tok >= probs.shape[-1]:  # no mass, or NaN: multinomial refused these; never return a token past V
        raise ValueError("sample: the distribution has no positive finite mass to draw from")
    return tok, host[1:-1], host[-1]


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a [V] distribution with one float64 uniform from `generator` (`draw`).

    `torch.multinomial` draws from the same law but cost ~75 us per [4096] row on a CPU, more than
    the rest of a sampling step; this is ~10.
    """
    return draw(probs, float(torch.rand(1, generator=generator, dtype=torch.float64, device=probs.device)))[0]


def position_uniforms(seed: int, n: int) -> list[float]:
    """A request's uniforms, one per output position: the token at position t is drawn with the t-th.

    Keying the randomness to the position, not to how many draws came before, is what makes a seeded
    sampled request emit the same tokens whatever tree, batch or policy drafted them: each position's
    token is the inverse CDF of the target's filtered law at that uniform, which is what plain
    sampling computes too (see `verifier.verify`). A CPU generator, so a seed means the same on any device.
    """
    return torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).tolist()


def filter_stages(logits: torch.Tensor, params: SamplingParams, top: int = 20) -> list[dict]:
    """Explain the filters for the UI's sampler view. logits: [V].

    Returns the `top` most likely tokens under temperature alone, each with
    its probability before filtering, after filtering, and which filter
    removed it (None when kept).
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
