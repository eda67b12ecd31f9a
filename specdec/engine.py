"""The engine: one target model, its drafters, and the four steps of a request's round.

Every round, round 0 included, is the same four steps (Medusa's, and gpt-fast's): 1. `draft` a tree
(Medusa heads, EAGLE-3 or a prompt-lookup chain; a plain round's tree is the root, round 0's the prompt);
2. `forward` its N nodes in one target forward; 3. `verify` the accepted path and the target's next token
(pure); 4. `commit` that path and cut at EOS or the length limit, into the round's `event`.
`specdec.batch.Batch` runs them for every request (a batch of one for `Engine.stream`); no UI here.
"""
from __future__ import annotations

import random
import threading
from typing import Callable, Iterable, Iterator

import torch

from . import cost as cost_mod
from . import eagle as eagle_mod
from . import drafting, kv_cache, prefill
from .batch import Batch, Member
from .detok import IncrementalDecoder
from .draft_tree import PRESETS, Tree, resolve_tree
from .events import EmittedToken, RoundEvent
from .failure import RequestFailed
from .heads import MedusaHeads
from .lookup import NgramIndex
from .request import LOOKUP_MODES, ROOT_ONLY, GenerationRequest, Plan, as_request, callbacks_of, default_eos
from .run_state import Draft, RunState, cut, tree_nodes, with_text
from .sampler import SamplingParams, filter_stages, position_uniforms
from .stopwatch import Stopwatch
from .target import TargetModel
from .tree_policy import DynamicTree
from .verifier import Verdict, all_rows_at_once, verify, verify_greedy

__all__ = ["Engine", "GenerationRequest", "LOOKUP_MODES", "default_eos"]
RoundCallback = Callable[[RoundEvent], None]


class Engine:
    """Speculative decoding over one target model and its drafters.

    Shared state (weights, tokenizer, a token-text memo) is read-only; each request carries its own cache.
    """

    def __init__(self, target: TargetModel, heads: MedusaHeads | None, tokenizer=None,
                 trained_tree=None, prefix_cache=None, cost: cost_mod.CostModel | None = None,
                 cost_cache: str | None = None, eagle: "eagle_mod.Eagle3 | None" = None,
                 eagle_shape: "eagle_mod.Shape | None" = None, default_drafter: str | None = None) -> None:
        """Args:
            cost: the round-cost model the dynamic tree sizes itself by; None measures it on first use, or
                reads it from `cost_cache`, a folder keyed by model, device and dtype.
            eagle: an EAGLE-3 drafter (the target then returns the hidden states it reads), drafting trees of
                `eagle_shape` (its shipped one by default).
            default_drafter: what `drafter="auto"` requests use, "medusa" or "eagle3" (default: EAGLE-3 when
                loaded, else the heads).
        """
        self.target = target
        self.heads = heads
        self.eagle = eagle
        self.eagle_drafter = eagle_mod.Eagle3Drafter(eagle, eagle_shape) if eagle is not None else None
        self.heads_drafter = drafting.HeadsDrafter(self) if heads is not None else None
        if eagle is not None:
            target.use_taps(eagle.config.layers)
        if default_drafter not in (None, "medusa", "eagle3") or (default_drafter == "medusa" and heads is None) \
                or (default_drafter == "eagle3" and eagle is None):
            raise ValueError(f"`default_drafter` must be None or a drafter this engine holds, got {default_drafter!r}")
        self.default_drafter = default_drafter or ("eagle3" if eagle is not None else "medusa" if heads is not None
                                                   else None)
        self.tokenizer = tokenizer
        self.trained_tree = tuple(tuple(p) for p in trained_tree) if trained_tree else None
        self.prefix_cache = prefix_cache
        self._text_memo: dict[int, str] = {}
        self.eos_token_ids = default_eos(tokenizer, target.model)
        self._cost = cost
        self._cost_cache = cost_cache
        self._cost_lock = threading.Lock()

    # -- helpers -------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return ""
        text = self._text_memo.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._text_memo[token_id] = text
        return text

    def resolve_tree(self, tree) -> Tree:
        """A static tree (a preset name, rank paths or a Tree), checked against these heads."""
        n = self.heads.config.num_heads if self.heads is not None else 4
        return resolve_tree(tree, self.trained_tree, n)

    def cost_model(self) -> cost_mod.CostModel:
        """The measured round-cost model (measured once, on first use, unless given or cached)."""
        with self._cost_lock:  # concurrent first requests measure once
            if self._cost is None:
                self._cost = cost_mod.load_or_measure(self, self._cost_cache)
            return self._cost

    def set_cost_model(self, model: cost_mod.CostModel) -> None:
        """Use this cost model for later requests (a measured one from elsewhere, or a test's)."""
        with self._cost_lock:
            self._cost = model

    def next_logits(self, prompt_ids) -> torch.Tensor:
        """The target's logits for the token after `prompt_ids`: one cache-free forward. -> [V] float32, CPU."""
        ids = GenerationRequest(prompt_ids, 1, speculative=False).plan(self).ids
        hidden = self.target.forward(torch.tensor(ids, dtype=torch.long), kv_cache.new_cache(self.target.model))
        return self.target.logits(hidden[-1]).cpu()  # [V]

    # -- the narrow face a UI reads: plain values only -------------------------------
    def info(self) -> dict:
        """What this engine runs, as plain values: model, size, dtype, device, context, trees, heads, prefix cache."""
        model = self.target.model
        names = ((["trained"] if self.trained_tree else []) + list(PRESETS)) if self.heads is not None else []
        cache = self.prefix_cache
        return {
            "model": getattr(model.config, "_name_or_path", "") or type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()),
            "dtype": str(self.target.dtype).replace("torch.", ""),
            "device": str(self.target.device),
            "device_type": self.target.device.type,
            "context": self.target.max_length,  # None: no limit known
            "heads": self.heads.config.num_heads if self.heads is not None else 0,
            # the EAGLE-3 drafter's shipped tree: nodes (root included), levels, children per node; None: not loaded
            "eagle3": None if self.eagle is None else {"nodes": self.eagle_drafter.shape.budget + 1,
                                                       "depth": self.eagle_drafter.shape.depth,
                                                       "top_k": self.eagle_drafter.shape.top_k},
            "default_drafter": self.default_drafter,
            # what the heads' vocabulary projections are stored in (on a CPU, measured at load: `specdec.load`)
            "heads_dtype": str(self.heads.projection_dtype).replace("torch.", "") if self.heads is not None else None,
            "trees": {name: self.resolve_tree(name).num_nodes for name in names},  # presets: nodes, root included
            "cuda_graphs": None if self.target.graphs is None else self.target.graphs.info(),
            "prefix_cache": None if cache is None else {  # its budget, and how full and useful it is now
                "max_bytes": cache.max_bytes, "bytes": cache.bytes, "hit_ratio": cache.hit_ratio},
        }

    def sampler_rows(self, prompt_ids, params: SamplingParams, top: int = 20) -> list[dict]:
        """The sampler view after `prompt_ids`: the `top` likeliest tokens as `filter_stages` rows (plain values)."""
        return filter_stages(self.next_logits(prompt_ids), params, top)

    # -- the loop ------------------------------------------------------------
    def stream(self, request, *fields, on_round: RoundCallback | Iterable[RoundCallback] | None = None,
               should_stop: Callable[[], bool] | None = None, **named) -> Iterator[RoundEvent]:
        """Decode a request, yielding one RoundEvent per round.

        Args:
            request: a GenerationRequest, or its fields (prompt_ids, max_new_tokens, params, ...),
                which build one. Every check happens there, before the first round.
            on_round: callbacks that receive every event, before it is yielded.
            should_stop: polled once per round; True ends the stream early.
        """
        return self._loop(as_request(request, fields, named).plan(self), callbacks_of(on_round), should_stop)

    def _loop(self, plan: Plan, callbacks: list[RoundCallback], should_stop) -> Iterator[RoundEvent]:
        """A solo request is a batch of one: the scheduler's own round, on the caller's thread."""
        batch, m = Batch(self, 1, batched=False), Member(0, self.open(plan), callbacks)
        joined = failed = False
        try:
            [(_, out)] = prefill.first_rounds(batch, [m])
            while True:
                if out.event is not None:
                    yield out.event
                if out.failure is not None:
                    raise out.error if out.error is not None else RequestFailed(out.failure)
                if m.finished is not None or (should_stop is not None and should_stop()):
                    return
                if not joined:
                    batch.add(m)
                    joined = True
                [(_, out)] = batch.round()
        except Exception:  # not GeneratorExit: a consumer letting go early is no failure
            failed = True
            raise
        finally:  # finished, stopped, let go or failed: a pooled KV buffer goes back
            if joined:
                batch.remove(m, failed)
            else:
                batch.release(m, failed)

    def open(self, plan: Plan) -> "RunState":
        """A request's own state, with a KV buffer sized once for its prompt, new tokens and largest tree."""
        req, target = plan.request, self.target
        seed = plan.first.seed if plan.first.seed is not None else random.SystemRandom().randrange(2**62)
        policy = None
        if plan.dynamic:
            k = self.heads.config.num_heads if self.heads is not None else 0
            policy = DynamicTree(k, self.cost_model(), lookup=req.lookup)
        most_nodes = (plan.tree.num_nodes + req.lookup) if plan.tree is not None else 1
        if policy is not None:
            most_nodes = policy.max_nodes + req.lookup
        # A captured forward pads a round of N nodes to its bucket (< 2N): with graphs, room for that too.
        room = most_nodes * (2 if target.graphs is not None else 1)
        outputs = req.max_new_tokens  # at most: decoding ends at the model's context ("context")
        if target.max_length is not None:
            outputs = min(outputs, target.max_length - len(plan.ids) + 1)
        slots = len(plan.ids) + outputs + room if target.slots else None
        cache, hit = target.new_cache(slots), 0
        if self.prefix_cache is not None:  # seeds the request's own buffer (a pooled one: what the graphs write)
            _, hit = self.prefix_cache.lookup(target.model, plan.ids, into=cache)
        ngram = NgramIndex(plan.ids, req.lookup_ngram) if plan.tree is not None and req.lookup else None
        # Drawn for greedy requests too: a live slider can turn one into a sampled request midway.
        return RunState(plan, cache, hit, seed, position_uniforms(seed, outputs),
                        IncrementalDecoder(self.tokenizer), ngram, limit=target.max_length or 1 << 62, policy=policy,
                        eagle=self.eagle_drafter.start() if plan.drafter == "eagle3" else None)

    # -- the four steps -----------------------------------------------------------
    def fed(self, run: "RunState", hidden: torch.Tensor, start: int) -> None:
        """Hand the EAGLE-3 drafter the tapped states of prompt rows [n, ...] computed from position `start`."""
        if run.eagle is not None:
            ids = run.plan.ids
            run.eagle.add(hidden[:, self.target.hidden_size :], ids[start + 1 : start + 1 + hidden.shape[0]], start)

    def forward(self, run: "RunState", draft: "Draft | None") -> torch.Tensor:
        """Step 2: one target forward of the round's nodes (round 0: the uncached prompt). -> [N, H]"""
        if draft is None:  # what the prefix cache (or a chunked prefill) has not already put in the buffer
            start = kv_cache.length(run.cache)
            hidden = self.target.forward(torch.tensor(run.plan.ids[start:], dtype=torch.long), run.cache,
                                         taps=run.eagle is not None)
            self.fed(run, hidden, start)
            # Never cache a NaN prompt (every request starting with it would fail); the last row shows any NaN.
            if self.prefix_cache is not None and bool(torch.isfinite(hidden[-1]).all()):
                self.prefix_cache.insert(run.plan.ids, run.cache)
            return hidden[-1:]  # only the last position's row is verified
        tree = draft.tree
        taps = run.eagle is not None
        if tree.num_nodes == 1:  # causal: HF's own masks, or the buffer's
            return self.target.forward(torch.tensor(draft.tokens, dtype=torch.long), run.cache, taps=taps)
        return self.target.forward(torch.tensor(draft.tokens, dtype=torch.long), run.cache, tree.ancestor_mask,
                                   tree.depth_t, taps=taps)

    def verify(self, run: "RunState", draft: "Draft | None", hidden: torch.Tensor, params: SamplingParams,
                clock: Stopwatch | None = None) -> Verdict:
        """Step 3: the accepted path and the target's own next token (pure given the logits and uniforms).

        With a `clock`, the vocabulary projection is timed apart as "rows", since it is the target's compute.
        """
        tree = draft.tree if draft is not None else ROOT_ONLY
        tokens = draft.tokens if draft is not None else [run.plan.ids[-1]]
        rule = run.plan.rule(params)
        rule = "lossless" if rule == "plain" else rule  # a one-node tree: every rule samples p at the root
        lap = clock.lap if clock is not None else (lambda name: None)

        pack_one = run.plan.request.speculative  # plain decoding keeps HF's own one-row logits

        def rows(x: torch.Tensor) -> torch.Tensor:
            lap("verify")  # verification's own work up to here
            logits = self.target.logits(x, pack_one)
            lap("rows")
            return logits

        with torch.inference_mode():
            at_once = all_rows_at_once(tree.num_nodes, hidden.device)
            if params.greedy and at_once:  # the "greedy" rule, and plain decoding at temperature 0
                return verify_greedy(tokens, tree, rows(hidden))  # one product, two host syncs
            if at_once and tree.num_nodes > 1 and self.target.packed_rows is not None:
                row = rows(hidden).__getitem__  # a packed product of a few rows costs about one row's
            else:  # rows on demand: sampling visits few nodes and filters each row anyway
                row = lambda i: rows(hidden[i])  # noqa: E731
            return verify(tokens, tree, row, params, rule, run.uniforms[run.produced : run.produced + tree.max_depth + 1])

    def commit(self, run: "RunState", draft: "Draft | None", verdict: Verdict, hidden: torch.Tensor
                ) -> tuple[EmittedToken, ...]:
        """Step 4: keep the accepted path in the KV buffer; cut the new tokens at EOS or the length limit."""
        speculative = run.plan.request.speculative
        if draft is None:  # the prefill wrote exactly the prompt
            run.committed = len(run.plan.ids)
            proposed: tuple[EmittedToken, ...] = ()
        else:
            kv_cache.keep_path(run.cache, run.committed, list(verdict.accepted))
            run.committed += len(verdict.accepted)
            proposed = tuple(EmittedToken(draft.tokens[n], "", "accepted", draft.q[n], verdict.target_prob.get(n))
                             for n in verdict.accepted[1:])
        run.h_last = hidden[verdict.accepted[-1], : self.target.hidden_size]
        if run.eagle is not None:  # the drafter reads the accepted positions, each with the token after it
            if draft is None:
                run.eagle.follow.append(verdict.next_token)
            else:
                path = list(verdict.accepted)
                run.eagle.add(hidden[path, self.target.hidden_size :],
                              [draft.tokens[n] for n in path[1:]] + [verdict.next_token])
        kind = verdict.next_kind if speculative else "baseline"
        proposed += (EmittedToken(verdict.next_token, "", kind, None, verdict.next_prob),)
        tokens, run.finished = cut(proposed, run.produced, run.plan, run.committed, run.limit)
        run.produced += len(tokens)
        emitted = with_text(tokens, run.detok, run.finished)
        run.pending = emitted[-1].token_id
        if run.ngram is not None:
            run.ngram.extend([e.token_id for e in emitted])
        return emitted

    def event(self, run: "RunState", index: int, draft: "Draft | None", verdict: Verdict,
               emitted: tuple[EmittedToken, ...], params: SamplingParams, clock: Stopwatch) -> RoundEvent:
        drafted = draft is not None and draft.drafted
        nodes = tree_nodes(draft.tree, draft.tokens, draft.q, verdict, self.token_text, draft.source) if drafted else ()
        path = verdict.accepted if draft is not None else ()
        clock.lap("event")  # building the node list counts as event time
        extra = {"seed": run.seed} if index == 0 else {}
        if draft is not None and draft.heads_ran:
            extra["heads_ran"] = draft.heads_ran  # the share of the heads: 1, or 1/K for a probe
        if draft is not None and draft.match:
            extra["lookup_match"] = draft.match  # the n-gram the lookup chain followed: 1, 2, 3, ...
        return RoundEvent(index, nodes, tuple(path), emitted, params.to_dict(), run.plan.rule(params),
                          run.plan.request.speculative, clock.total(), run.produced, run.finished,
                          prompt_tokens=len(run.plan.ids), prefix_cache_hit=run.hit if index == 0 else 0,
                          extra=extra, expected_length=draft.expected if draft is not None else None)

    # -- pieces of the steps --------------------------------------------------
    def head_logits(self, hidden: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """The first k heads' logits (all: None) for one hidden state [H] -> [k, V], through a graph if captured."""
        K = self.heads.config.num_heads
        k = K if k is None else min(k, K)
        hidden = hidden[..., : self.target.hidden_size]  # without the states an EAGLE-3 drafter reads
        if self.target.graphs is not None:
            logits = self.target.graphs.heads(self.heads, hidden, k)
            if logits is not None:
                return logits
        return self.heads.first(hidden, k) if k < K else self.heads(hidden)

