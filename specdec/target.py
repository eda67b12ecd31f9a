"""The target model: any HF causal LM, driven through its public inputs.

Tree attention needs only what `forward` already accepts: a 4D additive mask [B, 1, q, past + q] and
`position_ids`. One base-model forward gives the hidden states the drafters read; the output projection
runs only on the rows the verifier visits.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from . import kv_cache, masks
from .attention import attention_layout
from .sampler import finite_logits

log = logging.getLogger(__name__)
# Attention implementations that honour a 4D additive mask; flash, flex and paged kernels would drop the tree's.
MASK_AWARE_ATTENTION = ("sdpa", "eager")


class TargetModel:
    """Thin wrapper: hidden states from one forward, logits on demand."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model.eval()
        self.base = model.base_model
        if self.base is model:  # e.g. Llama-4, whose `base_model_prefix` names no attribute of its causal LM
            self.base = getattr(model, "model", model)
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None or self.base is model:
            raise ValueError(f"{type(model).__name__} is not a causal LM with a separate output projection")
        self.cache_arg = cache_arg(self.base.forward)
        cfg = model.config
        # Decided once, at load: refuse what cannot roll back, switch what would ignore the tree mask.
        self.layout = attention_layout(cfg)
        self.window = self.layout.window
        impl = getattr(cfg, "_attn_implementation", None) or "eager"
        if impl not in MASK_AWARE_ATTENTION:
            log.warning("attention implementation %r ignores a 4D tree mask; switching %s to 'sdpa'",
                        impl, type(model).__name__)
            try:
                model.set_attn_implementation("sdpa")
            except (ValueError, ImportError, AttributeError) as e:
                raise ValueError(f"attention implementation {impl!r} ignores the 4D tree mask, and switching "
                                 f"{type(model).__name__} to 'sdpa' failed ({e}); load it with "
                                 "attn_implementation='sdpa' or 'eager'") from e
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.logit_scale = getattr(cfg, "logit_scale", None)  # Cohere-style scaling
        self.vocab_size = int(self.lm_head.weight.shape[0])
        self.hidden_size = int(self.lm_head.weight.shape[1])
        self.max_length = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.window_mode = self._window_mode()
        # The last position a request may reach exactly: None (no limit) once the window is in the masks.
        self.exact_limit = self.window if self.window_mode == "bounded" else None
        self.graphs = None  # specdec.graphs.Graphs once `use_graphs` is called: captured forwards
        # HF `hidden_states` indices an EAGLE-3 drafter reads; only its requests ask, as every layer's states cost.
        self.taps: tuple[int, ...] | None = None
        # specdec's position-addressed buffer where the model's attention honours it; HF's growing cache else.
        self.slots = self._slots_work()
        ok, raised, why = self._trees_work()
        if not ok:
            why = (f"{type(model).__name__} cannot verify a draft tree exactly: a tree forward ({why}). specdec "
                   "passes each tree as a 4D attention mask with explicit positions; models that build their "
                   "positions from a 2D mask instead (ALiBi: BLOOM, MPT, Falcon-RW) cannot take it")
            # Below fp32 the probe cannot always tell kernel rounding from a wrong mask, so only a raise is refused.
            if raised or self.dtype == torch.float32:
                raise ValueError(why)
            log.warning("%s (in %s; this probe is strict in float32 only)", why, self.dtype)
        self.packed_rows = None  # specdec.packed.PackedProjection once `use_packed_rows` is called

    def use_taps(self, layers) -> None:
        """Set the states a `taps=True` forward returns after the last hidden state: [..., H + len(layers) * H].

        Args:
            layers: HF `output_hidden_states` indices of the states entering those layers (0 = the embeddings).
        """
        n = getattr(self.model.config, "num_hidden_layers", None)
        layers = tuple(int(i) for i in layers)
        if n is not None and not all(0 <= i <= n for i in layers):
            raise ValueError(f"the drafter reads the target's hidden states {layers}, but "
                             f"{type(self.model).__name__} has {n} layers (indices 0..{n})")
        self.taps = layers

    def _hidden(self, out, taps: bool) -> torch.Tensor:
        """The base model's output rows: the last hidden state, then with `taps` the tapped states (`use_taps`)."""
        if not taps:
            return out.last_hidden_state
        states = out.hidden_states
        return torch.cat([out.last_hidden_state] + [states[i] for i in self.taps], -1)

    def use_packed_rows(self, on: bool = True) -> bool:
        """Project two or more rows through a prepacked oneDNN lm_head (CPU, fp32); returns whether it is on."""
        from . import packed

        self.packed_rows = packed.PackedProjection(self.lm_head) if on and packed.available(self.lm_head) else None
        return self.packed_rows is not None

    def use_graphs(self, capture: str = "cuda") -> bool:
        """Replay captured forwards from now on (CUDA graphs; "recorded" is the CPU stand-in for tests).

        Returns False, with a log line, where the model cannot: its attention does not use the slot buffer.
        """
        from .graphs import Graphs

        if not self.slots:
            log.warning("%s uses HF's DynamicCache, whose shapes change every round: no CUDA graphs",
                        type(self.model).__name__)
            return False
        self.graphs = Graphs(self, capture)
        return True

    def new_cache(self, slots: int | None):
        """A request's empty KV buffer for `slots` (None: growing); with graphs, a pooled one until `release`."""
        if slots is not None and self.graphs is not None:
            lent = self.graphs.cache(slots)
            if lent is not None:
                return lent
        return kv_cache.new_cache(self.model, None if slots is None else kv_cache.bucket(slots))

    def release(self, cache, failed: bool = False) -> None:
        """A request is done with its cache: a pooled one goes back to the pool (zeroed if it `failed`)."""
        if self.graphs is not None:
            self.graphs.release(cache, failed)

    def _window_mode(self) -> str | None:
        """How the window reaches sliding layers, since HF hands a tree's 4D mask to every layer unchanged.

        Returns:
            "uniform" (every layer slides by one window: one windowed mask), "mapping" (full and sliding layers
            mixed: a mask per layer type, if the model takes that dict), "bounded" (otherwise: exact only within
            the smallest window, and `Engine` refuses longer requests), or None without windows.
        """
        windows = {w for w in self.layout.windows if w}
        if not windows:
            return None
        kinds = set(self.layout.types)
        if len(windows) > 1 or "chunked_attention" in kinds:
            return "bounded"
        if kinds == {"sliding_attention"}:
            return "uniform"
        return "mapping" if self._accepts_mask_mapping() else "bounded"

    @torch.inference_mode()
    def _accepts_mask_mapping(self) -> bool:
        """Does the model apply a {layer type: 4D mask} dict (hiding token 0 must change token 1's state)?"""
        ids = torch.tensor([[1, 2]], device=self.device)
        neg = torch.finfo(self.dtype).min
        blind = torch.tensor([[0.0, neg], [neg, 0.0]], dtype=self.dtype, device=self.device)[None, None]
        try:
            free = self.base(input_ids=ids, use_cache=False).last_hidden_state[0, 1]
            masked = self.base(input_ids=ids, use_cache=False, attention_mask={t: blind for t in set(
                self.layout.types)}).last_hidden_state[0, 1]
        except (TypeError, AttributeError, KeyError, ValueError, RuntimeError) as e:
            log.info("%s does not take per-layer-type masks (%s): exact only within its %d-token window",
                     type(self.model).__name__, e, self.window)
            return False
        return not torch.allclose(free, masked)

    @torch.inference_mode()
    def _slots_work(self) -> bool:
        """Does a forward through a SlotCache match a cache-free one? If not, the model uses HF's DynamicCache."""
        ids = (torch.arange(4) * 7 + 3) % self.vocab_size
        try:
            want = self.base(input_ids=ids[None].to(self.device), use_cache=False).last_hidden_state[0, -1]
            cache = kv_cache.new_cache(self.model, capacity=8)
            self.forward(ids[:3], cache)
            got = self.forward(ids[3:], cache)[-1]
            ok = self._agrees(got, want, ids[3:])
        except (RuntimeError, ValueError, TypeError, AttributeError, IndexError, AssertionError) as e:
            ok, why = False, f"{type(e).__name__}: {e}"
        else:
            why = "its hidden states differ from a cache-free forward"
        if not ok:
            log.warning("%s cannot use specdec's position-addressed KV buffer (%s); using HF's DynamicCache",
                        type(self.model).__name__, why)
        return ok

    @torch.inference_mode()
    def _trees_work(self) -> tuple[bool, bool, str]:
        """Does a tree forward give each node its own path's cache-free hidden state? -> (ok, raised, why not)."""
        ids = ((torch.arange(4) * 11 + 5) % self.vocab_size).tolist()
        tree = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
        try:
            cache = kv_cache.new_cache(self.model, capacity=8 if self.slots else None)
            self.forward(torch.tensor(ids[:2]), cache)
            got = self.forward(torch.tensor([ids[2], ids[3], ids[1]]), cache, tree, torch.tensor([0, 1, 1]))
            paths = [ids[:3], ids[:4], ids[:3] + ids[1:2]]
            want = [self.base(input_ids=torch.tensor([p], device=self.device), use_cache=False).last_hidden_state[0, -1]
                    for p in paths]
            ok = all(self._agrees(got[i], want[i], torch.tensor(paths[i][-1:])) for i in range(3))
        except (RuntimeError, ValueError, TypeError, AttributeError, IndexError, AssertionError, KeyError) as e:
            return False, True, f"{type(e).__name__}: {e}"
        return ok, False, "" if ok else "its nodes' hidden states differ from cache-free forwards of their paths"

    def _agrees(self, got: torch.Tensor, want: torch.Tensor, token: torch.Tensor) -> bool:
        """Is a probe's hidden state [H] the reference's, up to this dtype's rounding?

        Below fp32 another kernel alone moves a deep model's states by percents, so there it need only be much
        nearer than the token without its context (what a model ignoring the buffer computes).
        """
        err, norm = (got - want).float().norm(), want.float().norm()
        if err <= 1e-2 * norm + 1e-5:
            return True
        if self.dtype == torch.float32:
            return False
        wrong = self.base(input_ids=token[None].to(self.device), use_cache=False).last_hidden_state[0, -1]
        return bool(err <= 0.15 * norm and err <= 0.25 * (wrong - want).float().norm())

    @torch.inference_mode()
    def rows_work(self) -> tuple[bool, str]:
        """Can this model run a batch of requests in the rows of one KV buffer (`forward_rows`)? -> (ok, why not)."""
        ids = ((torch.arange(7) * 5 + 2) % self.vocab_size).tolist()
        try:
            L = self.model.config.get_text_config(decoder=True).num_hidden_layers
            batch = kv_cache.BatchCache(L, 2, 16, fixed_shapes=self.device.type == "cuda")
            for row, n in enumerate((4, 2)):
                solo = kv_cache.new_cache(self.model, capacity=16)
                self.forward(torch.tensor(ids[:n]), solo)
                batch.adopt(row, solo)
            tree = (torch.tensor([[True, False, False], [True, True, False], [True, False, True]]),
                    torch.tensor([0, 1, 1]))
            got = self.forward_rows(batch, 0, [ids[4:5], ids[2:5]], [None, tree])[..., : self.hidden_size]
            want = [self.base(input_ids=torch.tensor([ids[:5]], device=self.device), use_cache=False),
                    self.base(input_ids=torch.tensor([ids[:4], ids[:3] + ids[4:5]], device=self.device),
                              use_cache=False)]
            pairs = [(got[0, 0], want[0].last_hidden_state[0, 4]), (got[1, 1], want[1].last_hidden_state[0, 3]),
                     (got[1, 2], want[1].last_hidden_state[1, 3])]
            lone = [torch.tensor([ids[4]]), torch.tensor([ids[3]]), torch.tensor([ids[4]])]  # each query's token
            ok = all(self._agrees(g, w, t) for (g, w), t in zip(pairs, lone))
        except (RuntimeError, ValueError, TypeError, AttributeError, IndexError, AssertionError, KeyError) as e:
            return False, f"{type(e).__name__}: {e}"
        return ok, "" if ok else "its batched hidden states differ from cache-free forwards"

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache, tree_mask: torch.Tensor | None = None,
                depth: torch.Tensor | None = None, taps: bool = False) -> torch.Tensor:
        """Run T new tokens after the cached prefix; returns hidden states [T, H] ([T, 4H] with `taps`).

        Args:
            input_ids: [T] long.
            tree_mask: [T, T] bool ancestor mask, or None for plain causal attention.
            depth: [T] position offsets (tree depth), required with tree_mask.
            taps: also return the states an EAGLE-3 drafter reads (`use_taps`).
        """
        taps = taps and self.taps is not None
        if self.graphs is not None and not taps:  # a captured forward returns the last hidden state alone
            hidden = self.graphs.forward(input_ids, cache, tree_mask, depth)
            if hidden is not None:
                return hidden
        past = kv_cache.length(cache)
        T = input_ids.shape[0]
        hides = kv_cache.hides_slots(cache)
        pos, kwargs = self._inputs(T, past, kv_cache.mask_width(cache, T), tree_mask, depth, hides)
        out = self.base(input_ids=input_ids.to(self.device)[None], position_ids=pos[None],
                        **{self.cache_arg: cache}, use_cache=True, output_hidden_states=taps, **kwargs)
        kv_cache.advance(cache, T)
        return self._hidden(out, taps)[0]

    @torch.inference_mode()
    def forward_rows(self, cache: kv_cache.BatchCache, lo: int, tokens: list[list[int]],
                     trees: list[tuple[torch.Tensor, torch.Tensor] | None], taps: bool = False) -> torch.Tensor:
        """One forward of several requests' trees, request i in row lo + i after its own prefix; -> [b, T, H].

        Padding and real queries are masked from each other, so each request's rows are what its own forward
        gives; nothing is committed (`kv_cache.keep_path` does that per row).

        Args:
            tokens: [b][N_i] each request's node tokens, root first.
            trees: per request, (ancestor mask [N_i, N_i] bool, depth [N_i]), or None for a causal chain.
            taps: also return the states an EAGLE-3 drafter reads, for every row (`forward`).
        """
        taps = taps and self.taps is not None
        if self.graphs is not None and not taps:
            hidden = self.graphs.forward_rows(cache, lo, tokens, trees)
            if hidden is not None:
                return hidden
        b, T = len(tokens), max(len(t) for t in tokens)
        width = cache.begin(lo, b, T)
        ids, pos, kwargs = (self._lone_inputs if b == 1 else self._batch_inputs)(cache, tokens, trees, width)
        out = self.base(input_ids=ids.to(self.device), position_ids=pos.to(self.device), **{self.cache_arg: cache},
                        use_cache=True, output_hidden_states=taps, **kwargs)
        return self._hidden(out, taps)  # [b, T, H]

    def _lone_inputs(self, cache: kv_cache.BatchCache, tokens: list[list[int]], trees: list, width: int):
        """One request needs no padding: its own forward's inputs. A chain over only the slots in use (a buffer
        without fixed shapes) leaves the masks to HF, cheaper than a 4D one. -> (ids [1, T], positions [1, T], kwargs)"""
        start, T = cache.starts[0], len(tokens[0])
        pos, kwargs = self._inputs(T, start, width, *(trees[0] or (None, None)), hides_slots=width > start + T)
        return torch.tensor(tokens), pos[None], kwargs

    def _batch_inputs(self, cache: kv_cache.BatchCache, tokens: list[list[int]], trees: list, width: int):
        """Trees padded to the longest: a padding query sees only its own slot. -> (ids, positions, mask kwargs)"""
        b, T = len(tokens), max(len(t) for t in tokens)
        past = torch.tensor(cache.starts)  # [b]
        ids = torch.zeros(b, T, dtype=torch.long)
        depth = torch.zeros(b, T, dtype=torch.long)
        see = torch.eye(T, dtype=torch.bool).repeat(b, 1, 1)  # [b, T, T] query t sees new slot s
        for i, (toks, tree) in enumerate(zip(tokens, trees)):
            n = len(toks)
            ids[i, :n] = torch.tensor(toks)
            ids[i, n:] = toks[0]
            if tree is None:  # a causal run is the chain tree
                tree = (torch.ones(n, n, dtype=torch.bool).tril_(), torch.arange(n))
            see[i, :n, :n] = tree[0]
            depth[i, :n] = tree[1]
        mask = self._on_device(masks.build(past, see, depth, width, self.dtype, self.window, self.window_mode))
        return ids, past[:, None] + depth, {"attention_mask": mask}

    def _inputs(self, T: int, past: int, width: int, tree_mask: torch.Tensor | None, depth: torch.Tensor | None,
                hides_slots: bool) -> tuple[torch.Tensor, dict]:
        """Positions [T] and the mask argument of T new tokens after `past` committed ones, one request.

        A causal run over the slots in use leaves masking to HF, which is cheaper (none for one token); a tree, or
        a buffer whose unused slots must be hidden, gets the 4D mask over `width` key slots.
        """
        if tree_mask is None and not hides_slots:
            return torch.arange(past, past + T, device=self.device), {}
        if tree_mask is None:  # a causal run is the chain tree
            tree_mask = torch.ones(T, T, dtype=torch.bool).tril_()
            depth = torch.arange(T)
        return depth.to(self.device) + past, {"attention_mask": self._mask(tree_mask, depth, past, width)}

    def _mask(self, tree_mask: torch.Tensor, depth: torch.Tensor, past: int, width: int):
        """`masks.build` for one request's T new tokens (ancestor mask [T, T], depth [T]) over `width` key slots."""
        assert past + len(depth) <= width, f"KV buffer overflow: {past + len(depth)} slots > capacity {width}"
        return self._on_device(masks.build(torch.tensor([past]), tree_mask.cpu().bool()[None], depth.cpu()[None],
                                           width, self.dtype, self.window, self.window_mode))

    def _on_device(self, mask):
        """A mask built from host data (no device sync), moved to the model's device (each layer type's)."""
        if isinstance(mask, dict):
            return {k: v.to(self.device) for k, v in mask.items()}
        return mask.to(self.device)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, pack_one: bool = False) -> torch.Tensor:
        """[..., H] -> [..., V] float32 logits, as the model's own head computes them.

        With packed rows on, two or more rows use the packed copy; one row stays on the lm_head (HF's logits bit
        for bit, as plain decoding promises) unless `pack_one`, which speculative requests pass so that only
        one copy of the weight competes for the CPU cache.
        """
        hidden = hidden[..., : self.hidden_size]  # without the states an EAGLE-3 drafter reads
        rows = hidden.reshape(-1, hidden.shape[-1]) if hidden.dim() <= 2 else None  # [M, H]; batches: the head
        if self.packed_rows is not None and rows is not None and (pack_one or rows.shape[0] > 1):
            x = self.packed_rows(rows).reshape(*hidden.shape[:-1], -1)
        else:
            x = self.lm_head(hidden)
        if self.logit_scale is not None:
            x = x * self.logit_scale
        if self.softcap:
            x = torch.tanh(x / self.softcap) * self.softcap
        return finite_logits(x.float())  # an fp16 overflow to +inf must not become NaN downstream


def cache_arg(fn) -> str:
    """The name `fn` gives its KV cache input: `cache` in newer transformers, else `past_key_values`."""
    import inspect

    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"
