"""The decoding loop: one generator that yields a RoundEvent per round.

Each speculative round has Medusa's four steps:
  1. draft: the heads read the hidden state of the last accepted token and
     fill the static tree with their top-k candidates; with `lookup > 0`,
     a prompt-lookup chain (the tokens that followed the last occurrence
     of the current n-gram) replaces the heads' tree for that round
     (lookup_mode="first") or is merged into it ("merge");
  2. tree forward: one target forward over all N nodes (4D mask + positions);
  3. verify: the acceptance rule picks the accepted path and the target's
     own next token (correction or bonus);
  4. update: the KV cache keeps exactly the accepted path (a gather).

With `speculative=False` the same loop does one target forward per token,
through the same sampler and event stream, which is the plain baseline.
The engine knows nothing about the UI; a tokenizer is optional and only
used to put text into events.
"""
from __future__ import annotations

import numbers
import random
import time
from typing import Callable, Iterable, Iterator

import torch

from . import kv_cache
from .detok import IncrementalDecoder
from .draft_tree import Tree, build_tree, candidates, graft_chain, merge_chain, resolve_tree
from .events import EmittedToken, RoundEvent, TreeNode
from .heads import MedusaHeads
from .lookup import MAX_LOOKUP, NgramIndex
from .sampler import SamplingParams, next_token
from .target import TargetModel
from .verifier import ACCEPTANCE_RULES, LOSSY_RULES, verify, verify_greedy

LOOKUP_MODES = ("first", "merge")
_BATCHED_VERIFY_MAX_CPU = 32  # nodes; above this a CPU computes greedy rows on demand
_ROOT_ONLY = build_tree(())  # a round drafted by prompt lookup alone
ParamsSource = SamplingParams | Callable[[], SamplingParams]
RoundCallback = Callable[[RoundEvent], None]


def _ids(value) -> set[int]:
    """An EOS setting (None, an id, or a list of ids) as a set."""
    if value is None:
        return set()
    return {int(value)} if isinstance(value, numbers.Integral) else {int(v) for v in value}


def default_eos(tokenizer, model) -> frozenset[int]:
    """Every id that ends a turn: the tokenizer's EOS plus each id of `generation_config.eos_token_id`.

    Instruct models (Llama-3, Qwen2.5) list their end-of-turn ids in the generation config, and
    the tokenizer's single EOS is often not among them, so neither alone is enough.
    """
    gen = getattr(model, "generation_config", None)
    return frozenset(_ids(getattr(tokenizer, "eos_token_id", None)) | _ids(getattr(gen, "eos_token_id", None)))


class Engine:
    """Speculative decoding over one target model and its draft heads.

    Holds only read-only shared state (weights, tokenizer, a token-text
    memo); every call to `stream` carries its own cache and generator.
    """

    def __init__(self, target: TargetModel, heads: MedusaHeads | None, tokenizer=None,
                 trained_tree=None, prefix_cache=None) -> None:
        self.target = target
        self.heads = heads
        self.tokenizer = tokenizer
        self.trained_tree = tuple(tuple(p) for p in trained_tree) if trained_tree else None
        self.prefix_cache = prefix_cache
        self._text_memo: dict[int, str] = {}
        self.eos_token_ids = default_eos(tokenizer, target.model)

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
        n = self.heads.config.num_heads if self.heads is not None else 4
        if tree == "auto":
            tree = "trained" if self.trained_tree else "default"
        return resolve_tree(tree, self.trained_tree, n)

    def check_prompt(self, prompt_ids) -> list[int]:
        if isinstance(prompt_ids, torch.Tensor):
            if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
                prompt_ids = prompt_ids[0]  # a batch of one, as HF tokenizers return it
            if prompt_ids.dim() != 1 or prompt_ids.is_floating_point():
                raise ValueError(f"`prompt_ids` must be a 1-D (or [1, T]) integer tensor, "
                                 f"got shape {tuple(prompt_ids.shape)} and dtype {prompt_ids.dtype}")
            prompt_ids = prompt_ids.tolist()
        not_int = [i for i in prompt_ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
        if not_int:
            raise ValueError(f"`prompt_ids` must be integer token ids, got {not_int[:5]!r}")
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise ValueError("`prompt` is empty: give at least one token")
        V = self.target.vocab_size
        bad = [i for i in ids if not 0 <= i < V]
        if bad:
            raise ValueError(f"`prompt_ids` must be in [0, {V - 1}] (the vocabulary), got {bad[:5]}")
        limit = self.target.max_length
        if limit is not None and len(ids) >= limit:
            raise ValueError(f"`prompt` has {len(ids)} tokens; the model's context holds {limit}, "
                             f"so the prompt must be at most {limit - 1} tokens")
        return ids

    def check_window(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, before any token, a request that would outrun a window the tree masks cannot express.

        Sliding windows are folded into the tree's mask where the model allows it (`TargetModel`);
        chunked attention, several window sizes, or a mixed model that takes one mask for all layers
        are exact only within the smallest window, where every layer sees the whole sequence.
        """
        window = self.target.exact_limit
        if window is not None and prompt_tokens + max_new_tokens > window:
            raise ValueError(
                f"`max_new_tokens` = {max_new_tokens} with a {prompt_tokens}-token prompt needs "
                f"{prompt_tokens + max_new_tokens} positions, but this model has sliding-window (or chunked) attention "
                f"layers with a window of {window} tokens that specdec decodes exactly only within the window: "
                f"use max_new_tokens <= {max(window - prompt_tokens, 0)} (or a shorter prompt)")

    def next_logits(self, prompt_ids) -> torch.Tensor:
        """The target's logits for the token after `prompt_ids`: one cache-free forward. -> [V] float32, CPU."""
        ids = self.check_prompt(prompt_ids)
        hidden = self.target.forward(torch.tensor(ids, dtype=torch.long), kv_cache.new_cache(self.target.model))
        return self.target.logits(hidden[-1]).cpu()  # [V]

    # -- the loop ------------------------------------------------------------
    def stream(self, prompt_ids, max_new_tokens: int = 64, params: ParamsSource = SamplingParams(),
               tree="auto", speculative: bool = True, acceptance: str = "auto",
               eos_token_id: int | Iterable[int] | None | str = "auto",
               on_round: RoundCallback | Iterable[RoundCallback] | None = None,
               should_stop: Callable[[], bool] | None = None,
               lookup: int = 0, lookup_ngram: int = 3, lookup_mode: str = "first") -> Iterator[RoundEvent]:
        """Decode up to `max_new_tokens` tokens, yielding one RoundEvent per round.

        Args:
            prompt_ids: [T] token ids.
            params: SamplingParams, or a callable read once per round (live tuning).
            tree: preset name ("auto", "trained", "chain", "small", "default"), paths, or a Tree.
            acceptance: "auto" (greedy at temperature 0, else lossless), "greedy",
                "lossless" or "typical" (lossy: output no longer follows p).
            on_round: callbacks that receive every event, before it is yielded.
            should_stop: polled once per round; True ends the stream early.
            lookup: prompt-lookup tokens drafted per round (0 = off). With no heads,
                speculation runs on prompt lookup alone.
            lookup_ngram: the longest suffix n-gram matched against the context.
            lookup_mode: "first": a round whose context has a match drafts the lookup chain
                alone, and the heads draft only the other rounds (on a CPU the heads cost about as
                much as the forward of a short chain); "merge": every round drafts the heads' tree
                with the lookup chain merged into it.
        """
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` must be an integer >= 1, got {max_new_tokens!r}")
        if acceptance != "auto" and acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"`acceptance` must be 'auto' or one of {ACCEPTANCE_RULES}, got {acceptance!r}")
        get_params = params if callable(params) else (lambda: params)
        first = get_params()
        if not isinstance(first, SamplingParams):
            raise ValueError("`params` must be a SamplingParams or a callable returning one")
        if acceptance == "greedy":
            # Greedy acceptance is argmax decoding: every emitted token (round 0, tree rounds and
            # plain tail rounds alike) is the argmax, whatever the temperature. Events record the
            # temperature actually used (0), so one output never mixes two laws.
            sampled = get_params
            get_params = lambda: sampled().replace(temperature=0.0)  # noqa: E731
            first = get_params()
        if not isinstance(lookup, int) or isinstance(lookup, bool) or not 0 <= lookup <= MAX_LOOKUP:
            raise ValueError(f"`lookup` must be an integer in [0, {MAX_LOOKUP}] (prompt-lookup tokens; 0 = off), "
                             f"got {lookup!r}")
        if not isinstance(lookup_ngram, int) or isinstance(lookup_ngram, bool) or not 1 <= lookup_ngram <= 8:
            raise ValueError(f"`lookup_ngram` must be an integer in [1, 8], got {lookup_ngram!r}")
        if lookup_mode not in LOOKUP_MODES:
            raise ValueError(f"`lookup_mode` must be one of {LOOKUP_MODES}, got {lookup_mode!r}")
        ids = self.check_prompt(prompt_ids)
        self.check_window(len(ids), max_new_tokens)
        if speculative and self.heads is None and not lookup:
            raise ValueError("speculative decoding needs draft heads (load with heads=<path> or heads='random') "
                             "or prompt lookup (lookup >= 1)")
        full_tree = None
        if speculative:
            full_tree = self.resolve_tree(tree) if self.heads is not None else _ROOT_ONLY
        if eos_token_id == "auto":
            eos = self.eos_token_ids
        elif eos_token_id is None:
            eos = frozenset()
        else:
            eos = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        callbacks = [] if on_round is None else ([on_round] if callable(on_round) else list(on_round))
        return self._loop(ids, max_new_tokens, get_params, first, full_tree, speculative, acceptance, eos,
                          callbacks, should_stop, lookup, lookup_ngram, lookup_mode)

    def _loop(self, ids, max_new_tokens, get_params, params, full_tree, speculative, acceptance, eos,
              callbacks, should_stop, lookup, lookup_ngram, lookup_mode) -> Iterator[RoundEvent]:
        target, dev = self.target, self.target.device
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2**62)
        gen = torch.Generator(device=dev).manual_seed(seed)
        detok = IncrementalDecoder(self.tokenizer)
        limit = target.max_length or 1 << 62
        produced = 0
        ngram = NgramIndex(ids, lookup_ngram) if speculative and lookup else None

        # Round 0: prefill (reusing a cached prefix when there is one). The KV buffer is sized once, for
        # the prompt, every new token and the largest tree, rounded up so shapes repeat across requests.
        t0 = time.perf_counter()
        most_nodes = (full_tree.num_nodes + lookup) if full_tree is not None else 1
        capacity = kv_cache.bucket(len(ids) + max_new_tokens + most_nodes) if target.slots else None
        cache, hit = None, 0
        if self.prefix_cache is not None:
            cache, hit = self.prefix_cache.lookup(target.model, ids, capacity)
        if cache is None:
            cache, hit = kv_cache.new_cache(target.model, capacity), 0
        hidden = target.forward(torch.tensor(ids[hit:], dtype=torch.long), cache)  # [T, H]
        if self.prefix_cache is not None:
            self.prefix_cache.insert(ids, cache)
        h_last = hidden[-1]  # [H]
        tok, prob = next_token(target.logits(h_last), params, gen)
        t1 = time.perf_counter()
        kind = "bonus" if speculative else "baseline"
        raw = [(tok, kind, None, prob)]
        produced, finished = self._finish(raw, produced, max_new_tokens, eos, len(ids), limit)
        emitted = self._emit(raw, detok, finished)
        ev = RoundEvent(0, (), (), tuple(emitted), params.to_dict(), "plain" if not speculative else self._rule(acceptance, params),
                        speculative, {"forward": (t1 - t0) * 1e3, "total": (t1 - t0) * 1e3}, produced, finished,
                        prompt_tokens=len(ids), prefix_cache_hit=hit, extra={"seed": seed})
        for cb in callbacks:
            cb(ev)
        yield ev
        pending = emitted[-1].token_id
        if ngram is not None:
            ngram.extend([pending])
        cache_len = len(ids)
        rnd = 0
        while finished is None:
            if should_stop is not None and should_stop():
                return
            rnd += 1
            params = get_params()
            t0 = time.perf_counter()
            # The root (pending) goes at position cache_len; a depth-d node at cache_len + d.
            room = min(max_new_tokens - produced - 1, limit - 1 - cache_len)
            tree = None
            if speculative and room >= 1:
                tree = full_tree if full_tree.max_depth <= room else full_tree.truncated(room)
            timings: dict[str, float] = {}
            if tree is None:
                hidden = target.forward(torch.tensor([pending], dtype=torch.long), cache)
                t1 = time.perf_counter()
                tok, prob = next_token(target.logits(hidden[-1]), params, gen)
                t2 = time.perf_counter()
                cache_len += 1
                raw = [(tok, "baseline" if not speculative else "bonus", None, prob)]
                nodes, path, rule = (), (0,), "plain" if not speculative else self._rule(acceptance, params)
                timings.update(draft=0.0, forward=(t1 - t0) * 1e3, verify=(t2 - t1) * 1e3, cache=0.0)
                h_last = hidden[-1]
                t5 = t2
            else:
                rule = self._rule(acceptance, params)
                chain = ngram.propose(min(lookup, room)) if ngram is not None else []
                if chain and lookup_mode == "first":
                    tree = _ROOT_ONLY  # the context repeats: skip the heads' cost this round
                tokens, q_list = self._draft(tree, pending, h_last)
                if chain:
                    tree, tokens = self._graft(tree, tokens, chain)
                    q_list += [None] * (len(tokens) - len(q_list))
                tok_list = tokens
                tokens = torch.tensor(tok_list, dtype=torch.long)
                t1 = time.perf_counter()
                hidden = target.forward(tokens, cache, tree.ancestor_mask, tree.depth_t)  # [N, H]
                t2 = time.perf_counter()
                with torch.inference_mode():
                    if rule == "greedy" and (tree.num_nodes <= _BATCHED_VERIFY_MAX_CPU or dev.type != "cpu"):
                        # Every row in one product and two host syncs. On a CPU a big tree's rows
                        # cost real compute (64 rows: 2.1 ms against 1.6 ms for the few visited).
                        verdict = verify_greedy(tok_list, tree, target.logits(hidden))
                    else:  # rows on demand: sampling visits few nodes and filters each row anyway
                        verdict = verify(tok_list, tree, lambda i: target.logits(hidden[i]), params, rule, gen)
                t3 = time.perf_counter()
                kv_cache.keep_path(cache, cache_len, list(verdict.accepted))
                cache_len += len(verdict.accepted)
                h_last = hidden[verdict.accepted[-1]]
                t4 = t5 = time.perf_counter()  # building the node list below counts as event time
                raw = [(tok_list[n], "accepted", q_list[n], verdict.target_prob.get(n)) for n in verdict.accepted[1:]]
                raw.append((verdict.next_token, verdict.next_kind, None, verdict.next_prob))
                nodes = self._nodes(tree, tok_list, q_list, verdict)
                path = verdict.accepted
                timings.update(draft=(t1 - t0) * 1e3, forward=(t2 - t1) * 1e3, verify=(t3 - t2) * 1e3,
                               cache=(t4 - t3) * 1e3)
            produced, finished = self._finish(raw, produced, max_new_tokens, eos, cache_len, limit)
            emitted = self._emit(raw, detok, finished)
            pending = emitted[-1].token_id
            if ngram is not None:
                ngram.extend([e.token_id for e in emitted])
            t6 = time.perf_counter()
            timings["event"] = (t6 - t5) * 1e3
            timings["total"] = (t6 - t0) * 1e3
            ev = RoundEvent(rnd, nodes, tuple(path), tuple(emitted), params.to_dict(), rule, speculative, timings,
                            produced, finished, prompt_tokens=len(ids))
            for cb in callbacks:
                cb(ev)
            yield ev

    def _draft(self, tree: Tree, pending: int, h_last: torch.Tensor) -> tuple[list[int], list[float | None]]:
        """The heads fill the tree: N tokens and their draft probabilities (None at the root)."""
        if tree.num_nodes == 1:  # prompt lookup alone: no heads to run
            return [pending], [None]
        with torch.inference_mode():
            head_logits = self.heads(h_last)  # [K, V]
            tokens, q = candidates(pending, head_logits, tree)  # [N], [N]
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

    @staticmethod
    def _rule(acceptance: str, params: SamplingParams) -> str:
        if params.greedy:
            return "greedy"
        return "lossless" if acceptance == "auto" else acceptance

    @staticmethod
    def _emit(raw: list[tuple], detok: IncrementalDecoder, finished: str | None) -> list[EmittedToken]:
        """Turn (token, kind, q, p) tuples into events, with incremental text.

        Runs after the EOS / length cut, so dropped tokens never reach the decoder; on the last
        round the decoder is flushed so a trailing partial character is not lost.
        """
        out = [EmittedToken(t, detok.push(t), k, dq, tp) for t, k, dq, tp in raw]
        if finished is not None and out:
            tail = detok.flush()
            if tail:
                last = out[-1]
                out[-1] = EmittedToken(last.token_id, last.text + tail, last.kind, last.draft_prob, last.target_prob)
        return out

    @staticmethod
    def _finish(emitted: list[tuple], produced: int, max_new: int, eos, cache_len: int, limit: int):
        """Cut the round's (token, ...) tuples at EOS or max_new_tokens (in place); return (produced, finished)."""
        finished = None
        for i, t in enumerate(emitted):
            if t[0] in eos:
                del emitted[i + 1 :]
                finished = "eos"
                break
        if produced + len(emitted) >= max_new:
            del emitted[max_new - produced :]
            finished = finished or "length"
        produced += len(emitted)
        # The pending token still has to be fed at position cache_len next round.
        if finished is None and cache_len >= limit:
            finished = "context"
        return produced, finished

    def _nodes(self, tree: Tree, toks: list[int], q: list[float], verdict) -> tuple[TreeNode, ...]:
        on_path = set(verdict.accepted)
        rejected = set(verdict.rejected)
        looked_up = set(tree.lookup)
        out = []
        for i in range(tree.num_nodes):
            if i == 0:
                status = "root"
            elif i in on_path:
                status = "accepted"
            elif i in rejected:
                status = "rejected"
            else:
                status = "not_reached"
            source = "root" if i == 0 else "lookup" if i in looked_up else "heads"
            out.append(TreeNode(toks[i], self.token_text(toks[i]), tree.parent[i], tree.depth[i], tree.rank[i],
                                q[i], verdict.target_prob.get(i), status, source))
        return tuple(out)
