"""One decoding round for a batch of requests: B trees, one target forward, B verdicts.

Each request keeps its own `RunState` and goes through the engine's steps; the heads' logits, the forward (each
request in its own row of a `kv_cache.BatchCache`, padding masked both ways) and the greedy verify are shared,
so output equals the request run alone up to float rounding. Faults stay with their request: a failed step or non-finite
row ends that request only, a raising shared forward is retried row by row, and nothing is committed before
the verdict.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from . import drafting, kv_cache
from .failure import Failure, FaultHook, Outcome, cause_of, failed, message_of
from .run_state import Draft, RunState
from .sampler import SamplingParams
from .stopwatch import Stopwatch
from .verifier import Verdict, all_rows_at_once, verify_greedy_batch

if TYPE_CHECKING:
    from .engine import Engine

@dataclass(eq=False)
class Member:
    """One request in the batch: its run, callbacks and round counter."""

    rid: int
    run: RunState
    callbacks: list = field(default_factory=list)
    index: int = 0  # the next round's index (0: the prefill has not run)

    @property
    def finished(self) -> str | None:
        return self.run.finished


class Batch:
    """The decoding requests that share each round's target forward, and their rows of the KV buffer.

    Batched, member i sits in row i; else (`batched=False`) each request keeps its own cache, forwards in turn.
    """

    def __init__(self, engine: "Engine", max_size: int, batched: bool, fault_hook: FaultHook | None = None) -> None:
        self.engine = engine
        self.max_size = max_size
        self.batched = batched
        self.fault_hook = fault_hook
        self.members: list[Member] = []
        self.cache: kv_cache.BatchCache | None = None

    def __len__(self) -> int:
        return len(self.members)

    # -- membership --------------------------------------------------------------------
    def add(self, m: Member) -> None:
        """A request joins after its round 0: its committed KV moves into the next free row."""
        assert len(self.members) < self.max_size
        if self.batched:
            row = len(self.members)
            staged = m.run.cache
            if isinstance(staged, kv_cache.RowCache):  # round 0 ran in a row after the members' (`prefill`)
                if staged.row != row:  # a request staged before it left: rows stay contiguous
                    self.cache.move(staged.row, row)
                    staged.row = row
            else:
                self.stage(m, row)
        self.members.append(m)

    def stage(self, m: Member, row: int, release: bool = True) -> None:
        """Move a joining request's committed KV into `row`; its own buffer goes back unless `release=False`."""
        solo = m.run.cache
        need = kv_cache.bucket(solo.capacity)
        if self.cache is None:
            target = self.engine.target
            self.cache = kv_cache.BatchCache(target.model.config.get_text_config(decoder=True).num_hidden_layers,
                                             self.max_size, need, fixed_shapes=target.device.type == "cuda")
        self.cache.grow(need)
        self.cache.adopt(row, solo)
        m.run.cache = kv_cache.RowCache(self.cache, row)
        if release:
            self.engine.target.release(solo)  # a pooled buffer goes back now that the row holds its KV

    def release(self, m: Member, failed: bool = False) -> None:
        """A request that never joined frees its staged row or own buffer (zeroed after a failure: NaN spreads)."""
        cache = m.run.cache
        if isinstance(cache, kv_cache.RowCache):
            if failed:
                self.cache.clear(cache.row)
        else:
            self.engine.target.release(cache, failed)

    def remove(self, m: Member, failed: bool = False) -> None:
        """A request leaves (finished, stopped, disconnected or failed): its row is free for the next round."""
        i = self.members.index(m)
        last = len(self.members) - 1
        if not self.batched:  # its own buffer: a pooled one goes back (zeroed after a failure)
            self.engine.target.release(m.run.cache, failed)
        else:
            if failed:  # its stale slots may hold NaN, which would spread through a masked score
                self.cache.clear(i)
            if i != last:
                self.cache.move(last, i)
                self.members[last].run.cache.row = i
        self.members[i] = self.members[last]
        self.members.pop()

    # -- a batched round ------------------------------------------------------------------
    def round(self) -> list[tuple[Member, Outcome]]:
        """One round for every member: each drafts, one forward for all, each verifies and commits."""
        eng = self.engine
        members = list(self.members)
        b = len(members)
        outcome: dict[int, Outcome] = {}
        params: dict[int, SamplingParams] = {}
        drafts: dict[int, Draft] = {}
        clocks: dict[int, Stopwatch] = {}
        shared = drafting.SharedHeads(eng.heads, members) if b > 1 else None  # alone: the engine's (graphs, probes)
        for i, m in enumerate(members):
            clock = clocks[i] = Stopwatch()
            m.run.shared_heads = shared
            try:
                self.hook(m, "params")
                params[i] = m.run.plan.get_params()
                if not isinstance(params[i], SamplingParams):
                    raise ValueError("`params` must return a SamplingParams")
                clock.last = time.perf_counter()  # this request's own draft time only
                self.hook(m, "draft")
                drafts[i] = drafting.draft(eng, m.run, params[i])
            except Exception as e:  # noqa: BLE001 (isolated: this request alone ends)
                outcome[i] = failed("params" if i not in params else "draft", e, m.index)
                continue
            clock.lap("draft")
        for m in members:
            m.run.shared_heads = None
        t0 = time.perf_counter()
        hidden = self._forward(members, drafts, outcome)
        forward_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        verdicts, rows_ms = self._verify_greedy(drafts, params, hidden)
        shared_ms = (time.perf_counter() - t0) * 1e3 / max(len(verdicts), 1)
        rows_ms /= max(len(verdicts), 1)
        for i, m in enumerate(members):
            if i in outcome:
                continue
            clock = clocks[i]
            clock.ms["forward"] = forward_ms
            if i in verdicts:  # its share of the joint verify: the vocabulary rows, then the walk
                clock.ms["rows"] = rows_ms
            clock.last = time.perf_counter() - (shared_ms - rows_ms) / 1e3 * (i in verdicts)
            outcome[i] = self.finish(m, drafts[i], hidden[i], params[i], clock, size=b, verdict=verdicts.get(i))
        return [(m, outcome[i]) for i, m in enumerate(members)]

    def _verify_greedy(self, drafts: dict[int, Draft], params: dict[int, SamplingParams],
                       hidden: dict[int, torch.Tensor]) -> tuple[dict[int, Verdict], float]:
        """Step 3 for greedy members together -> (the verdicts each would get alone, the "rows" lap in ms).

        Only trees `verifier.all_rows_at_once` takes join; if the joint pass fails, each verifies alone in `finish`.
        """
        live = [i for i in hidden if params[i].greedy and all_rows_at_once(drafts[i].tree.num_nodes, hidden[i].device)]
        if len(live) < 2:
            return {}, 0.0
        try:
            with torch.inference_mode():
                t0 = time.perf_counter()
                H = self.engine.target.hidden_size  # rows with and without the drafter's states alike
                logits = self.engine.target.logits(torch.cat([hidden[i][:, :H] for i in live]))  # [sum N_i, V]
                rows_ms = (time.perf_counter() - t0) * 1e3
                out = verify_greedy_batch([(drafts[i].tokens, drafts[i].tree) for i in live], logits)
        except Exception:  # noqa: BLE001 (each member then verifies alone, where a fault stays its own)
            return {}, 0.0
        return dict(zip(live, out)), rows_ms

    def _forward(self, members: list[Member], drafts: dict[int, Draft], outcome: dict) -> dict[int, torch.Tensor]:
        """Step 2 for the whole batch -> each live member's hidden rows [N_i, H]; failures go to `outcome`."""
        live = [i for i in range(len(members)) if i not in outcome]
        if not live:
            return {}
        if not self.batched:  # each request's own cache, one forward after another
            out = {}
            for i in live:
                try:
                    self.hook(members[i], "forward")
                    out[i] = self.engine.forward(members[i].run, drafts[i])
                except Exception as e:  # noqa: BLE001
                    outcome[i] = failed("forward", e, members[i].index)
            return self.check_finite(members, out, outcome)
        # Failed members keep their rows (rows are contiguous), running their pending token uncommitted.
        tokens, trees = [], []
        for i, m in enumerate(members):
            d = drafts.get(i)
            tokens.append(d.tokens if d is not None else [max(m.run.pending, 0)])
            trees.append((d.tree.ancestor_mask, d.tree.depth_t) if d is not None and d.tree.num_nodes > 1 else None)
        try:
            for i in live:
                self.hook(members[i], "forward")
            taps = any(members[i].run.eagle is not None for i in live)  # the drafter's states, for every row
            rows = self.engine.target.forward_rows(self.cache, 0, tokens, trees, taps)  # [b, T, H]
            out = {i: rows[i, : len(tokens[i])] for i in live}
        except Exception:  # noqa: BLE001 (the shared forward failed: retry each request alone)
            out = {}
            for i in live:
                m = members[i]
                try:
                    self.hook(m, "forward")
                    out[i] = self.engine.target.forward_rows(self.cache, m.run.cache.row, [tokens[i]], [trees[i]],
                                                             m.run.eagle is not None)[0]
                except Exception as e:  # noqa: BLE001
                    outcome[i] = failed("forward", e, m.index)
        return self.check_finite(members, out, outcome)

    @staticmethod
    def check_finite(members, out: dict[int, torch.Tensor], outcome: dict) -> dict[int, torch.Tensor]:
        """A request whose rows hold NaN or inf ends here, before its verdict (one host sync for all)."""
        if not out:
            return out
        keys = list(out)
        finite = torch.stack([torch.isfinite(out[i]).all() for i in keys]).tolist()
        for i, ok in zip(keys, finite):
            if not ok:
                outcome[i] = Outcome(None, Failure("non_finite", "forward", members[i].index,
                                                   "the target's hidden state has NaN or inf values in this request's rows"))
                del out[i]
        return out

    def finish(self, m: Member, draft: Draft | None, hidden: torch.Tensor, params: SamplingParams,
                clock: Stopwatch, size: int, verdict: Verdict | None = None) -> Outcome:
        """Steps 3-4 and the event for one request (round 0 included); callbacks see the event first.

        A failing callback still leaves the round's event with its request, since its tokens were decoded.

        Args:
            verdict: this request's verdict when the batch already verified it (greedy members).
        """
        eng, run = self.engine, m.run
        step, ev = "verify", None
        try:
            self.hook(m, "verify")
            if verdict is None:
                verdict = eng.verify(run, draft, hidden, params, clock)
            clock.lap("verify")
            step = "commit"
            self.hook(m, "commit")
            emitted = eng.commit(run, draft, verdict, hidden)
            clock.lap("cache")
            drafting.learn(run, draft, verdict, params)
            step = "event"
            ev = eng.event(run, m.index, draft, verdict, emitted, params, clock)
            ev = replace(ev, extra={**ev.extra, "batch": size})
            step = "callback"
            self.hook(m, "callback")
            for cb in m.callbacks:
                cb(ev)
        except Exception as e:  # noqa: BLE001 (isolated: this request alone ends)
            if ev is not None:
                m.index += 1
            return Outcome(ev, Failure(cause_of(step, e), step, m.index - (ev is not None), message_of(e)), e)
        m.index += 1
        return Outcome(ev)

    def hook(self, m: Member, step: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(m.rid, m.index, step)
