"""The engine: one target model, its drafters, and the four steps of a request's round.

Every round, round 0 included, is the same four steps (Medusa's, and gpt-fast's), as methods here:
  1. `draft`: a drafter proposes a tree from the committed state: the Medusa heads (from the hidden
     state of the last accepted token), the EAGLE-3 drafter, and with `lookup > 0` a prompt-lookup chain
     (the tokens that followed the last occurrence of the current n-gram), alone ("first") or merged
     ("merge"). A plain round drafts nothing: its tree is the root alone. Round 0 drafts the prompt
     itself, as a causal chain (the prefill).
  2. `forward`: one target forward over all N nodes (4D mask + positions) into the KV buffer;
  3. `verify`: a pure function of (tokens, tree, logits, params, position uniforms) picks the accepted
     path and the target's own next token (correction or bonus);
  4. `commit`: the KV buffer keeps exactly the accepted path; the emitted tokens are cut at EOS or
     the length limit and become the round's `event`.

`specdec.batch.Batch` runs these steps for every request of a round, with one forward for all; it is the
only round. The scheduler drives it for every caller, and `Engine.stream` drives a batch of one on the
caller's thread. With `speculative=False` every round is the one-node case, one target forward per
token, through the same sampler and event stream: the plain baseline. The engine knows nothing about
the UI; a tokenizer is optional and only used to put text into events.
"""
from __future__ import annotations

import random
import threading
from typing import Callable, Iterable, Iterator

import torch

from . import cost as cost_mod
from . import eagle as eagle_mod
from . import kv_cache
from .batch import Batch, Member, RequestFailed
from .detok import IncrementalDecoder
from .draft_tree import PRESETS, Tree, build_tree, candidates, graft_chain, merge_chain, resolve_tree
from .events import EmittedToken, RoundEvent
from .heads import MedusaHeads
from .lookup import NgramIndex
from .request import LOOKUP_MODES, ROOT_ONLY, GenerationRequest, Plan, default_eos
from .run_state import Draft, RunState, cut, tree_nodes, with_text
from .sampler import SamplingParams, filter_stages, position_uniforms
from .stopwatch import Stopwatch
from .target import TargetModel
from .tree_policy import DynamicTree, PolicyMemory, head_scores
from .verifier import Verdict, all_rows_at_once, verify, verify_greedy

__all__ = ["Engine", "GenerationRequest", "LOOKUP_MODES", "default_eos"]
RoundCallback = Callable[[RoundEvent], None]


class Engine:
    """Speculative decoding over one target model and its draft heads.

    Holds only read-only shared state (weights, tokenizer, a token-text
    memo); every call to `stream` carries its own cache and position uniforms.
    """

    def __init__(self, target: TargetModel, heads: MedusaHeads | None, tokenizer=None,
                 trained_tree=None, prefix_cache=None, cost: cost_mod.CostModel | None = None,
                 cost_cache: str | None = None, eagle: "eagle_mod.Eagle3 | None" = None,
                 eagle_shape: "eagle_mod.Shape | None" = None, default_drafter: str | None = None) -> None:
        """Args:
            cost: the round-cost model the dynamic tree sizes itself by; None measures it on first
                use (a couple of seconds), or reads it from `cost_cache`, a folder keyed by model,
                device and dtype.
            eagle: an EAGLE-3 drafter (the target then returns the hidden states it reads), drafting trees of
                `eagle_shape` (its shipped one by default).
            default_drafter: what `drafter="auto"` requests use, "medusa" or "eagle3" (default: EAGLE-3 when
                loaded, else the heads).
        """
        self.target = target
        self.heads = heads
        self.eagle = eagle
        self.eagle_drafter = eagle_mod.Eagle3Drafter(eagle, eagle_shape) if eagle is not None else None
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
        # What finished requests taught the dynamic tree (None: every request starts cold).
        self.policy_memory: PolicyMemory | None = PolicyMemory()

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
            "trees": {name: self.resolve_tree(name).num_nodes for name in names},  # static presets: nodes, root included
            "cuda_graphs": None if self.target.graphs is None else self.target.graphs.info(),
            "prefix_cache": None if cache is None else {  # its budget, and how full and useful it is now
                "max_bytes": cache.max_bytes, "bytes": cache.bytes, "hit_ratio": cache.hit_ratio},
        }

    def sampler_rows(self, prompt_ids, params: SamplingParams, top: int = 20) -> list[dict]:
        """The sampler view after `prompt_ids`: the `top` likeliest tokens under temperature alone, each with its
        probability before and after the filters and the filter that removed it (`filter_stages`, plain values)."""
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
        if not isinstance(request, GenerationRequest):
            request = GenerationRequest(request, *fields, **named)
        elif fields or named:
            raise TypeError("pass a GenerationRequest alone, or its fields, not both")
        plan = request.plan(self)
        callbacks = [] if on_round is None else ([on_round] if callable(on_round) else list(on_round))
        return self._loop(plan, callbacks, should_stop)

    def _loop(self, plan: Plan, callbacks: list[RoundCallback], should_stop) -> Iterator[RoundEvent]:
        """A solo request is a batch of one: the scheduler's own round, on the caller's thread."""
        batch, m = Batch(self, 1, batched=False), Member(0, self.open(plan), callbacks)
        joined = failed = False
        try:
            [(_, out)] = batch.first_rounds([m])
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
                self.remember(m.run, failed)

    def remember(self, run: "RunState", failed: bool = False) -> None:
        """A request is done: what its dynamic tree learned goes to the engine's memory (not after a failure)."""
        if failed:
            return
        if run.policy is not None and self.policy_memory is not None:
            self.policy_memory.learn(run.policy)

    def open(self, plan: Plan) -> "RunState":
        """A request's own state: position uniforms, decoder, lookup index, and a KV buffer sized once, for the
        prompt, every new token and the largest tree, rounded up so shapes repeat across requests."""
        req, target = plan.request, self.target
        seed = plan.first.seed if plan.first.seed is not None else random.SystemRandom().randrange(2**62)
        policy = None
        if plan.dynamic:
            k = self.heads.config.num_heads if self.heads is not None else 0
            policy = DynamicTree(k, self.cost_model(), lookup=req.lookup, memory=self.policy_memory, law=plan.first)
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
    def draft(self, run: "RunState", params: SamplingParams) -> "Draft":
        """Step 1: the round's tree and tokens: heads, prompt lookup, or the root alone (a plain round)."""
        plan, req = run.plan, run.plan.request
        # The root (pending) goes at position `committed`; a depth-d node at committed + d.
        room = min(req.max_new_tokens - run.produced - 1, run.limit - 1 - run.committed)
        if plan.tree is None or room < 1:  # plain decoding, or the last token: nothing to draft
            return Draft(ROOT_ONLY, [run.pending], [None], drafted=False,
                         expected=1.0 if run.policy is not None else None)
        chain, match = run.ngram.match(min(req.lookup, room)) if run.ngram is not None else ([], 0)
        if run.eagle is not None:
            return self._draft_eagle(run, chain, match, room)
        if run.policy is not None:
            return self._draft_dynamic(run, params, chain, match, room)
        tree = plan.tree if plan.tree.max_depth <= room else plan.tree.truncated(room)
        if chain and req.lookup_mode == "first":
            tree = ROOT_ONLY  # the context repeats: skip the heads' cost this round
        heads_ran = 1.0 if tree.num_nodes > 1 else 0.0
        tokens, q = self._fill(tree, run)
        if chain:
            tree, tokens = self._graft(tree, tokens, chain)
            q += [None] * (len(tokens) - len(q))
        return Draft(tree, tokens, q, drafted=True, heads_ran=heads_ran, match=match if chain else 0)

    def _draft_dynamic(self, run: "RunState", params: SamplingParams, chain: list[int], match: int, room: int
                       ) -> "Draft":
        """Step 1 under the "auto" policy: score the heads' candidates, let the policy pick the tree
        (`match`: the length of the n-gram the lookup chain follows)."""
        policy, scores, top = run.policy, None, None
        k = policy.wants_heads(len(chain), room, params.greedy, match) if self.heads is not None else 0
        if k:
            with torch.inference_mode():
                # Scored under the round's own filters: that is the law the target is verified with.
                top_q, top_i, score = head_scores(self._head_logits(run, min(k, room)), params)  # [D, k] each
                host = torch.stack([top_q, score, top_i.float()]).tolist()  # one host sync; ids < 2**24 are exact
            top, scores = (host[0], host[2]), host[1]  # ids as floats: int() only for the nodes drafted
        if scores is None and not chain:  # the heads rest and nothing repeats: a plain round
            return Draft(ROOT_ONLY, [run.pending], [None], drafted=False, expected=1.0)
        choice = policy.choose(scores, len(chain), room, params.greedy, match)
        tree = build_tree(choice.paths, checked=True)  # prefix-closed and sorted by construction
        tokens, q, learn = [run.pending], [None], [None]
        for p in tree.paths[1:]:  # BFS order: node i is paths[i]
            d, r = len(p) - 1, p[-1]
            tokens.append(int(top[1][d][r]))
            q.append(top[0][d][r])
            learn.append(("heads", d, r, scores[d][r]))
        chain = chain[: choice.chain]
        if chain:
            tree, tokens = self._graft(tree, tokens, chain)
            grafted = len(tokens) - len(q)
            q += [None] * grafted
            first = len(chain) - grafted  # chain positions the merged head nodes stood in for
            learn += [("lookup", first + j) for j in range(grafted)]
        return Draft(tree, tokens, q, drafted=True, learn=tuple(learn), expected=choice.expected,
                     heads_ran=k / self.heads.config.num_heads if k else 0.0, match=match if chain else 0,
                     candidates=(scores, top[1]) if scores is not None and params.greedy else None)

    def _draft_eagle(self, run: "RunState", chain: list[int], match: int, room: int) -> "Draft":
        """Step 1 with the EAGLE-3 drafter: its EAGLE-2 tree, a lookup chain grafted in or ("first") alone."""
        tree, tokens, q = ROOT_ONLY, [run.pending], [None]
        if not (chain and run.plan.request.lookup_mode == "first"):
            grown = self.eagle_drafter.propose(run.eagle, run.pending, room)
            if grown is not None:
                tree, tokens, q = grown.tree, grown.tokens, grown.q
        if chain:
            tree, tokens = self._graft(tree, tokens, chain)
            q = q + [None] * (len(tokens) - len(q))
        if tree.num_nodes == 1:
            return Draft(ROOT_ONLY, [run.pending], [None], drafted=False)
        return Draft(tree, tokens, q, drafted=True, match=match if chain else 0, source=self.eagle_drafter.source)

    def fed(self, run: "RunState", hidden: torch.Tensor, start: int) -> None:
        """Prompt rows [n, ...] from position `start` were just computed: the EAGLE-3 drafter reads their
        tapped states (a no-op for other drafters)."""
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
            # Never keep a NaN prompt: every request starting with it would fail. (The check's host sync is
            # the one round 0 makes anyway.) The last row attends to every slot, so it shows any NaN.
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

        With a `clock`, the target's vocabulary projection of the rows it reads is timed apart, as "rows":
        it is the target model's compute, not verification's.
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

    @staticmethod
    def learn(run: "RunState", draft: "Draft | None", verdict: Verdict, params: SamplingParams) -> None:
        """The dynamic policy learns from the verdict: each drafted node whose parent was reached.

        Its outcome is, greedy, whether it was the target's argmax; sampling, the target's filtered
        p(token), the chance the lossless rule accepts it (known for the children it tried). Greedy
        rounds also teach how every head candidate that was not drafted would have fared under the
        accepted path: the target's token at each depth that path reached is known, and a head's guess
        for that depth does not depend on the path. Without that, a candidate the policy never drafts
        (a sibling whose score is low) never shows that it would have been accepted, and its estimate
        keeps the prior: measured on the embedded model, the policy drafted 7-node trees that yielded
        2.14 tokens where the static 16-node tree, drafting those siblings, yielded 2.59.
        """
        if run.policy is None or draft is None or not draft.drafted:
            return
        reached = set(verdict.accepted)
        heads, lookup = [], []
        for c in range(1, draft.tree.num_nodes):
            if draft.tree.parent[c] not in reached:
                continue
            outcome = (1.0 if c in reached else 0.0) if params.greedy else verdict.target_prob.get(c)
            if outcome is None:  # sampling stopped trying siblings after an earlier one was accepted
                continue
            kind = draft.learn[c]
            if kind[0] == "heads":
                heads.append((kind[1], kind[2], kind[3], outcome))
            else:
                lookup.append((kind[1], outcome))
        if draft.candidates is not None:
            heads += _undrafted(draft, verdict, {(d, r) for d, r, _, _ in heads})
        run.policy.observe(params.greedy, heads, lookup, draft.tree.num_nodes, len(verdict.accepted), draft.heads_ran,
                           draft.match)

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
    def _head_logits(self, run: "RunState", k: int | None = None) -> torch.Tensor:
        """The first k heads' logits (all: None) after the run's last committed token. -> [k, V]

        In a batched round `run.shared_heads` computes every member's rows in one call, on first use.
        """
        if run.shared_heads is not None:
            return run.shared_heads(run)[:k]
        return self.head_logits(run.h_last, k)

    def head_logits(self, hidden: torch.Tensor, k: int | None = None) -> torch.Tensor:
        """The first k heads' logits (all: None) for one hidden state [H] -> [k, V]: a captured graph where there is one."""
        K = self.heads.config.num_heads
        k = K if k is None else min(k, K)
        hidden = hidden[..., : self.target.hidden_size]  # without the states an EAGLE-3 drafter reads
        if self.target.graphs is not None:
            logits = self.target.graphs.heads(self.heads, hidden, k)
            if logits is not None:
                return logits
        return self.heads.first(hidden, k) if k < K else self.heads(hidden)

    def _fill(self, tree: Tree, run: "RunState") -> tuple[list[int], list[float | None]]:
        """The heads fill the tree: N tokens and their draft probabilities (None at the root)."""
        if tree.num_nodes == 1:  # prompt lookup alone: no heads to run
            return [run.pending], [None]
        with torch.inference_mode():
            tokens, q = candidates(run.pending, self._head_logits(run), tree)  # [N], [N]
        q_list = q.tolist()
        q_list[0] = None
        return tokens.tolist(), q_list

    @staticmethod
    def _graft(tree: Tree, tokens: list[int], chain: list[int]) -> tuple[Tree, list[int]]:
        """Merge a prompt-lookup chain into the filled tree; graft what does not match as new nodes.

        The chain is at most `room` long and each merged token is one level deeper, so the grafted
        nodes stay within `room` too.
        """
        attach, rest = merge_chain(tree, tokens, chain)
        if not rest:
            return tree, tokens
        return graft_chain(tree.paths[1:], attach, len(rest)), tokens + rest


def _undrafted(draft: "Draft", verdict: Verdict, seen: set[tuple[int, int]]) -> list[tuple[int, int, float, float]]:
    """(depth, rank, score, outcome) of the greedy head candidates a round did not draft under its accepted path.

    Head d guesses the token at depth d + 1; wherever the accepted path reached depth d, the target's
    token there is known (an accepted draft, or the round's own next token), so each candidate's outcome
    is whether it was that token. `seen`: the (depth, rank) pairs already learned as drafted nodes.
    """
    scores, ids = draft.candidates  # [D][k] each
    path = verdict.accepted
    truth = [draft.tokens[n] for n in path[1:]] + [verdict.next_token]  # the target's token at depth 1, 2, ...
    out = []
    for d in range(min(len(ids), len(path))):
        for r, (score, token) in enumerate(zip(scores[d], ids[d])):
            if (d, r) not in seen:
                out.append((d, r, score, 1.0 if int(token) == truth[d] else 0.0))
    return out
