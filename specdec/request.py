"""One generation request, checked once, in one place.

`GenerationRequest` checks its own fields on construction (like HF's `GenerationConfig.validate()`), and
`plan` checks what needs the model and returns the `Plan` the engine runs; nothing after `plan` checks again.
Every message names the parameter and its allowed values.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

import torch

from .draft_tree import PRESETS, Tree, build_tree
from .lookup import MAX_LOOKUP
from .sampler import SamplingParams
from .verifier import ACCEPTANCE_RULES

if TYPE_CHECKING:
    from .engine import Engine

LOOKUP_MODES = ("first", "merge")
DRAFTERS = ("auto", "medusa", "eagle3")  # the model drafter a request uses; prompt lookup adds to either
TREE_NAMES = ("auto", "trained", "none", *PRESETS)  # "trained": the tree shipped with the heads
MAX_LOOKUP_NGRAM = 8
ROOT_ONLY = build_tree(())  # a round drafted by prompt lookup alone, or a plain round
ParamsSource = SamplingParams | Callable[[], SamplingParams]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, and how.

    Args:
        prompt_ids: [T] token ids (a list, a 1-D tensor, or a [1, T] tensor as tokenizers return it).
        max_new_tokens: tokens to generate at most (EOS can end it sooner).
        params: SamplingParams, or a callable read once per round (live tuning).
        tree: "auto" (the dynamic tree, `tree_policy`), a preset ("trained", "chain", "small", "default",
            "mc_sim_7b_63", "none"), rank paths, or a Tree.
        speculative: False decodes one token per target forward, the plain baseline.
        acceptance: "auto" (greedy at temperature 0, else lossless), "greedy" (argmax at any temperature),
            "lossless", or "typical" (Medusa's, lossy).
        eos_token_id: "auto" (the model's EOS ids), None (never stop early), an id, or ids.
        lookup: prompt-lookup tokens drafted per round (0 = off).
        lookup_ngram: the longest suffix n-gram matched against the context.
        lookup_mode: "first" (a round with a match drafts the chain alone) or "merge" (into the heads' tree).
        drafter: "auto" (the engine's default), "medusa" or "eagle3"; EAGLE-3 grows its own tree each
            round, so with it `tree` is "auto" or "trained".
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 64
    params: ParamsSource = field(default_factory=SamplingParams)
    tree: str | Tree | tuple | list = "auto"
    speculative: bool = True
    acceptance: str = "auto"
    eos_token_id: int | Iterable[int] | None | str = "auto"
    lookup: int = 0
    lookup_ngram: int = 3
    lookup_mode: str = "first"
    drafter: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", _prompt_ids(self.prompt_ids))
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be an integer >= 1, got {self.max_new_tokens!r}")
        if not (isinstance(self.params, SamplingParams) or callable(self.params)):
            raise ValueError("`params` must be a SamplingParams or a callable returning one")
        if not isinstance(self.speculative, bool):
            raise ValueError(f"`speculative` must be True or False, got {self.speculative!r}")
        if isinstance(self.tree, str) and self.tree not in TREE_NAMES:
            raise ValueError(f"`tree` must be one of {TREE_NAMES} (or rank paths, or a Tree), got {self.tree!r}")
        if self.acceptance != "auto" and self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"`acceptance` must be 'auto' or one of {ACCEPTANCE_RULES}, got {self.acceptance!r}")
        if not _is_int(self.lookup) or not 0 <= self.lookup <= MAX_LOOKUP:
            raise ValueError(f"`lookup` must be an integer in [0, {MAX_LOOKUP}] (prompt-lookup tokens; 0 = off), "
                             f"got {self.lookup!r}")
        if not _is_int(self.lookup_ngram) or not 1 <= self.lookup_ngram <= MAX_LOOKUP_NGRAM:
            raise ValueError(f"`lookup_ngram` must be an integer in [1, {MAX_LOOKUP_NGRAM}], got {self.lookup_ngram!r}")
        if self.lookup_mode not in LOOKUP_MODES:
            raise ValueError(f"`lookup_mode` must be one of {LOOKUP_MODES}, got {self.lookup_mode!r}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"`drafter` must be one of {DRAFTERS}, got {self.drafter!r}")
        eos = self.eos_token_id
        if not (eos is None or eos == "auto" or _is_int(eos)
                or (isinstance(eos, Iterable) and not isinstance(eos, str) and all(_is_int(e) for e in eos))):
            raise ValueError(f"`eos_token_id` must be 'auto', None, a token id or a list of ids, got {eos!r}")

    def plan(self, engine: "Engine") -> "Plan":
        """Check the request against the loaded model and resolve it into what the engine runs."""
        target = engine.target
        ids = list(self.prompt_ids)
        V = target.vocab_size
        bad = [i for i in ids if not 0 <= i < V]
        if bad:
            raise ValueError(f"`prompt_ids` must be in [0, {V - 1}] (the vocabulary), got {bad[:5]}")
        limit = target.max_length
        if limit is not None and len(ids) >= limit:
            raise ValueError(f"`prompt` has {len(ids)} tokens; the model's context holds {limit}, "
                             f"so the prompt must be at most {limit - 1} tokens")
        window = target.exact_limit
        if window is not None and len(ids) + self.max_new_tokens > window:
            raise ValueError(
                f"`max_new_tokens` = {self.max_new_tokens} with a {len(ids)}-token prompt needs "
                f"{len(ids) + self.max_new_tokens} positions, but this model has sliding-window (or chunked) "
                f"attention layers with a window of {window} tokens that specdec decodes exactly only within the "
                f"window: use max_new_tokens <= {max(window - len(ids), 0)} (or a shorter prompt)")
        drafter = engine.default_drafter if self.drafter == "auto" else self.drafter
        if self.drafter == "auto" and engine.heads is not None and not (isinstance(self.tree, str) and self.tree in (
                "auto", "trained", "none")):
            drafter = "medusa"  # a static preset or rank paths: the heads' tree
        if isinstance(self.tree, str) and self.tree == "none":
            drafter = None  # prompt lookup alone
        if self.drafter == "medusa" and engine.heads is None:
            raise ValueError("`drafter` 'medusa' needs Medusa heads, and this model was loaded without them")
        if self.drafter == "eagle3" and engine.eagle is None:
            raise ValueError("`drafter` 'eagle3' needs an EAGLE-3 drafter, and this model was loaded without one")
        if self.speculative and isinstance(self.tree, str) and self.tree == "none" and not self.lookup:
            raise ValueError("`tree` 'none' drafts the root alone, so it needs prompt lookup (lookup >= 1); "
                             "with lookup 0 use speculative=False for plain decoding")
        if self.speculative and drafter is None and not self.lookup:
            raise ValueError("speculative decoding needs draft heads (load with heads=<path> or heads='random') "
                             "or prompt lookup (lookup >= 1)")
        if self.speculative and drafter == "eagle3" and not (isinstance(self.tree, str) and self.tree in ("auto", "trained")):
            raise ValueError(f"`tree` must be 'auto', 'trained' or 'none' with the EAGLE-3 drafter, which grows its "
                             f"own tree each round; got {self.tree!r}")
        tree, dynamic = None, False
        if self.speculative and drafter == "eagle3":
            tree = ROOT_ONLY  # each round's tree is the drafter's own
        elif self.speculative:
            dynamic = isinstance(self.tree, str) and self.tree == "auto"
            tree = engine.resolve_tree(self.tree) if engine.heads is not None and not dynamic else ROOT_ONLY
        get_params = self.params if callable(self.params) else (lambda p=self.params: p)
        first = get_params()  # round 0's params: a live source is read once per round, this one included
        if not isinstance(first, SamplingParams):
            raise ValueError("`params` must be a SamplingParams or a callable returning one")
        if self.acceptance == "greedy":
            # Every round is argmax decoding and its event records temperature 0, so one output has one law.
            get_params = (lambda src: lambda: src().replace(temperature=0.0))(get_params)
            first = first.replace(temperature=0.0)
        eos = self.eos_token_id
        if eos == "auto":
            eos = engine.eos_token_ids
        eos = frozenset([] if eos is None else [eos] if _is_int(eos) else eos)
        return Plan(self, ids, tree, first, get_params, eos, dynamic,
                    drafter if self.speculative else None)


@dataclass(frozen=True)
class Plan:
    """A request resolved against one engine: what `Engine` runs, trusting every field."""

    request: GenerationRequest
    ids: list[int]
    tree: Tree | None  # the full static draft tree (None: plain decoding; the root alone when dynamic)
    first: SamplingParams  # round 0's params (and its seed)
    get_params: Callable[[], SamplingParams]  # every later round's
    eos: frozenset[int]
    dynamic: bool = False  # each round's tree comes from the dynamic policy ("auto")
    drafter: str | None = None  # "medusa", "eagle3", or None (prompt lookup alone, or plain decoding)

    def rule(self, params: SamplingParams) -> str:
        """The acceptance rule of a round with these params ("plain" when not speculative)."""
        if not self.request.speculative:
            return "plain"
        if params.greedy:
            return "greedy"
        return "lossless" if self.request.acceptance == "auto" else self.request.acceptance


def as_request(request, fields: tuple, named: dict) -> GenerationRequest:
    """A GenerationRequest as callers pass it: built from its fields, or given whole (not both)."""
    if not isinstance(request, GenerationRequest):
        return GenerationRequest(request, *fields, **named)
    if fields or named:
        raise TypeError("pass a GenerationRequest alone, or its fields, not both")
    return request


def callbacks_of(on_round) -> list:
    """`on_round` as a list of callbacks: None, one callable, or several."""
    return [] if on_round is None else ([on_round] if callable(on_round) else list(on_round))


def _ids(value) -> set[int]:
    """An EOS setting (None, an id, or a list of ids) as a set."""
    if value is None:
        return set()
    return {int(value)} if isinstance(value, numbers.Integral) else {int(v) for v in value}


def default_eos(tokenizer, model) -> frozenset[int]:
    """Every id that ends a turn: the tokenizer's EOS plus each id of `generation_config.eos_token_id`.

    Instruct models list end-of-turn ids in the generation config that the tokenizer's one EOS often misses.
    """
    gen = getattr(model, "generation_config", None)
    return frozenset(_ids(getattr(tokenizer, "eos_token_id", None)) | _ids(getattr(gen, "eos_token_id", None)))


def _prompt_ids(prompt_ids) -> tuple[int, ...]:
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]  # a batch of one, as HF tokenizers return it
        if prompt_ids.dim() != 1 or prompt_ids.is_floating_point():
            raise ValueError(f"`prompt_ids` must be a 1-D (or [1, T]) integer tensor, "
                             f"got shape {tuple(prompt_ids.shape)} and dtype {prompt_ids.dtype}")
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Iterable):
        raise ValueError(f"`prompt_ids` must be a list of integer token ids, got {type(prompt_ids).__name__}")
    ids = list(prompt_ids)
    not_int = [i for i in ids if not _is_int(i)]
    if not_int:
        raise ValueError(f"`prompt_ids` must be integer token ids, got {not_int[:5]!r}")
    if not ids:
        raise ValueError("`prompt` is empty: give at least one token")
    return tuple(int(i) for i in ids)
