"""One decoding round for a batch of requests: B trees, one target forward, B verdicts.

Each request keeps its own state (`run_state.RunState`: params, generator, tree policy, lookup index,
decoder) and goes through the engine's own steps; only the forward is shared:

  1. draft: each request drafts its own tree (its heads' rows are computed together);
  2. forward: one target forward over every request's tree, padded to the largest, each request in
     its own row of a `kv_cache.BatchCache`, at its own length, positions and mask rows;
  3. verify, commit, learn, event: each request on its own rows, by its own rule, params and
     generator, committing its accepted path in its own row. Greedy requests are verified together
     (`verify_greedy_batch`: one vocabulary product over all their rows, one argmax, one gather),
     exactly as each would be alone.

Faults stay with their request. An exception in one request's step (its params callable, its
draft, a callback), a non-finite row in its part of the forward, or a forward that fails for it
alone ends that request with a `Failure`; the others' rows are untouched and their round goes on.
When the shared forward itself raises (a CUDA out-of-memory, say), every request is retried alone
in its own row, so only a request that fails on its own is ended. Nothing is committed before the
verdict, so a failed round leaves every row as it was.

Exactness: a request's rows are those of its own forward (padding is masked both ways), so greedy
output equals the same request run alone, up to float rounding in the batched products (the tests
compare tokens with solo runs and HF `generate` in fp32 on three architectures).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import torch

from . import drafting, kv_cache
from .failure import Failure, Outcome, cause_of, failed, message_of
from .run_state import Draft, RunState
from .sampler import SamplingParams
from .stopwatch import Stopwatch
from .verifier import Verdict, all_rows_at_once, verify_greedy_batch

if TYPE_CHECKING:
    from .engine import Engine

# fault_hook(request id, round index, step) is called before each step of each request; whatever it
# raises is handled as that step's own failure (tests use it to simulate faults).
FaultHook = Callable[[int, int, str], None]
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

    In batched mode member i sits in row i (a leaving member's row is refilled from the last one).
    A model that cannot take the batched path keeps each request's own cache and runs their
    forwards one after another inside the round (`batched=False`).
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
            if isinstance(staged, kv_cache.RowCache):  # round 0 ran in a row after the members' (`first_rounds`)
                if staged.row != row:  # a request staged before it left: rows stay contiguous
                    self.cache.move(staged.row, row)
                    staged.row = row
            else:
                self._stage(m, row)
        self.members.append(m)

    def _stage(self, m: Member, row: int, release: bool = True) -> None:
        """Move a joining request's committed KV (none, a prefix-cache hit or prefill chunks) into `row`;
        its own buffer goes back now, or (`release=False`) is the caller's to give back."""
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
        """A request that never joined is done with its KV: a staged row is free again (zeroed after a
        failure, whose stale slots may hold NaN), its own buffer goes back (a pooled one)."""
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
        self.engine.remember(m.run, failed)
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

    # -- round 0: the prefill, one request at a time --------------------------------------
    def prefill(self, m: Member, budget: int) -> int:
        """Feed up to `budget` prompt tokens of a joining request, leaving its last chunk to round 0.

        Returns the tokens fed; 0 when the rest fits the budget (`first_rounds` runs it next).
        """
        run = m.run
        start = kv_cache.length(run.cache)
        rest = len(run.plan.ids) - start
        if rest <= budget:
            return 0
        self._hook(m, "prefill")
        hidden = self.engine.target.forward(torch.tensor(run.plan.ids[start : start + budget], dtype=torch.long),
                                            run.cache, taps=run.eagle is not None)
        self.engine.fed(run, hidden, start)
        return budget

    def first_rounds(self, ms: list[Member]) -> list[tuple[Member, Outcome]]:
        """Round 0 of requests whose prompt (its rest) is now fed: each one's first token.

        Returns (member, outcome) in the order to take them: first those that shared one forward, in
        the rows they were staged in after the members' (`add` moves a staged row down, so never onto
        one not yet taken), then those that ran round 0 on their own buffer, as a solo stream does.
        Measured (embedded model, 24 requests through 8 rows): round 0 was 12% of the scheduler's
        time with one forward per joining request.
        """
        shared = self._sharing(ms)
        out = self._shared_first_rounds(shared) if shared else []
        return out + [(m, self._first_round(m)) for m in ms if m not in shared]

    def _sharing(self, ms: list[Member]) -> list[Member]:
        """The joining requests that share round 0's forward, shortest rest first (none: each alone).

        Every row is padded to the longest rest, so a request joins the group only while the padded
        forward stays within the buffer and costs at most twice its real tokens (or 16 per row). With
        CUDA graphs a request's own round 0 replays a graph, where rows after the members' would run
        eagerly: there the group forms only in an empty batch, whose rows from 0 replay too.
        """
        if not self.batched or len(ms) < 2 or (self.engine.target.graphs is not None and self.members):
            return []
        capacity = max(kv_cache.bucket(m.run.cache.capacity) for m in ms)
        if self.cache is not None:
            capacity = max(capacity, self.cache.capacity)
        group, starts, rests = [], [], []
        for m in sorted(ms, key=lambda m: len(m.run.plan.ids) - kv_cache.length(m.run.cache)):
            start = kv_cache.length(m.run.cache)
            rest = len(m.run.plan.ids) - start
            b, T = len(group) + 1, max(rests + [rest])
            if max(starts + [start]) + T <= capacity and b * T <= max(2 * (sum(rests) + rest), 16 * b):
                group.append(m)
                starts.append(start)
                rests.append(rest)
        return group if len(group) >= 2 else []

    def _shared_first_rounds(self, ms: list[Member]) -> list[tuple[Member, Outcome]]:
        """Round 0 of `ms` in one forward over rows staged after the members'. Their own buffers go back
        (zeroed after a failure: their prefill chunks may have been NaN) once the outcomes are known."""
        outcome: dict[int, Outcome] = {}
        clocks: dict[int, Stopwatch] = {}
        live, solos, tokens = [], {}, []
        lo = len(self.members)
        try:
            for i, m in enumerate(ms):
                clocks[i] = Stopwatch()  # laps: the shared forward with its own commit, then its token
                clocks[i].lap("draft")
                solo = m.run.cache
                try:
                    self._hook(m, "forward")
                    self._stage(m, lo + len(live), release=False)
                except Exception as e:  # noqa: BLE001 (isolated: it ends, still holding its own buffer)
                    outcome[i] = failed("forward", e, m.index)
                    continue
                solos[i] = solo
                live.append(i)
                tokens.append(m.run.plan.ids[kv_cache.length(m.run.cache):])  # [n_i]: never empty
            t0 = time.perf_counter()
            hidden = self._prompt_rows(ms, live, lo, tokens, outcome)
            forward_ms = (time.perf_counter() - t0) * 1e3
            for i, n in zip(live, map(len, tokens)):
                if i not in outcome:
                    outcome[i] = self._commit_prompt(ms[i], hidden[i], n, clocks[i], forward_ms, len(live))
        finally:
            for i, solo in solos.items():
                self.engine.target.release(solo, failed=i not in outcome or outcome[i].failure is not None)
        return [(ms[i], outcome[i]) for i in live] + [(ms[i], outcome[i]) for i in range(len(ms)) if i not in live]

    def _commit_prompt(self, m: Member, hidden: torch.Tensor, n: int, clock: Stopwatch, forward_ms: float,
                       size: int) -> Outcome:
        """A staged request after the shared forward: its prompt's rest committed (and offered to the
        prefix cache), then its first token and event (`_finish`). `hidden` [n, H]: the prompt rest's rows."""
        try:
            start = time.perf_counter()
            first = kv_cache.length(m.run.cache)
            self.engine.fed(m.run, hidden, first)
            hidden = hidden[n - 1 : n]  # the prompt's last row gives the first token
            kv_cache.keep_path(m.run.cache, first, list(range(n)))  # the chain: the prompt
            if self.engine.prefix_cache is not None:
                self.engine.prefix_cache.insert(m.run.plan.ids, m.run.cache)
        except Exception as e:  # noqa: BLE001 (isolated, as in `Engine.forward` on its own buffer)
            return failed("forward", e, m.index)
        clock.last = time.perf_counter()
        clock.ms["forward"] = forward_ms + (clock.last - start) * 1e3  # the shared forward, then its own commit
        return self._finish(m, None, hidden, m.run.plan.first, clock, size=size)

    def _prompt_rows(self, ms: list[Member], live: list[int], lo: int, tokens: list[list[int]],
                     outcome: dict) -> dict[int, torch.Tensor]:
        """The staged requests' prompt rests as causal chains in rows [lo, lo + len(live)) -> hidden [n_i, H]
        each; if the shared forward raises, each runs alone in its row, so a fault stays its own."""
        try:
            taps = any(ms[i].run.eagle is not None for i in live)
            rows = self.engine.target.forward_rows(self.cache, lo, tokens, [None] * len(live), taps)  # [b, T, H]
            out = {i: rows[j, : len(tokens[j])] for j, i in enumerate(live)}
        except Exception:  # noqa: BLE001 (the shared forward failed: retry each request alone)
            out = {}
            for j, i in enumerate(live):
                try:
                    out[i] = self.engine.target.forward_rows(self.cache, lo + j, [tokens[j]], [None],
                                                             ms[i].run.eagle is not None)[0]
                except Exception as e:  # noqa: BLE001
                    outcome[i] = failed("forward", e, ms[i].index)
        return self._check_finite(ms, out, outcome)

    def _first_round(self, m: Member) -> Outcome:
        """Round 0 on the request's own buffer: the rest of the prompt in one forward, then the first token."""
        eng, run = self.engine, m.run
        params = run.plan.first
        clock = Stopwatch()
        clock.lap("draft")
        try:
            self._hook(m, "forward")
            hidden = eng.forward(run, None)
        except Exception as e:  # noqa: BLE001 (isolated: this request alone ends)
            return failed("forward", e, m.index)
        clock.lap("forward")
        if not bool(torch.isfinite(hidden).all()):
            return Outcome(None, Failure("non_finite", "forward", m.index, "the target's hidden state has NaN or inf values"))
        return self._finish(m, None, hidden, params, clock, size=1)

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
        shared = drafting.SharedHeads(eng.heads, members) if b > 1 else None  # alone: the engine's own call (graphs, probes)
        for i, m in enumerate(members):
            clock = clocks[i] = Stopwatch()
            m.run.shared_heads = shared
            try:
                self._hook(m, "params")
                params[i] = m.run.plan.get_params()
                if not isinstance(params[i], SamplingParams):
                    raise ValueError("`params` must return a SamplingParams")
                clock.last = time.perf_counter()  # this request's own draft time only
                self._hook(m, "draft")
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
            outcome[i] = self._finish(m, drafts[i], hidden[i], params[i], clock, size=b, verdict=verdicts.get(i))
        return [(m, outcome[i]) for i, m in enumerate(members)]

    def _verify_greedy(self, drafts: dict[int, Draft], params: dict[int, SamplingParams],
                       hidden: dict[int, torch.Tensor]) -> tuple[dict[int, Verdict], float]:
        """Step 3 for the greedy members, together: the verdicts `Engine.verify` would give each alone,
        and the milliseconds the vocabulary rows took (the engine's "rows" lap).

        A member joins when its params are greedy and its tree is one the engine verifies from all
        its rows at once (`verifier.all_rows_at_once`: on a CPU, small trees; bigger ones compute rows
        on demand there). If the joint pass fails, each member verifies alone in `_finish`.
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
                    self._hook(members[i], "forward")
                    out[i] = self.engine.forward(members[i].run, drafts[i])
                except Exception as e:  # noqa: BLE001
                    outcome[i] = failed("forward", e, members[i].index)
            return self._check_finite(members, out, outcome)
        # Failed members still hold their rows this round (the rows are contiguous): they run their
        # pending token alone, and nothing of it is committed.
        tokens, trees = [], []
        for i, m in enumerate(members):
            d = drafts.get(i)
            tokens.append(d.tokens if d is not None else [max(m.run.pending, 0)])
            trees.append((d.tree.ancestor_mask, d.tree.depth_t) if d is not None and d.tree.num_nodes > 1 else None)
        try:
            for i in live:
                self._hook(members[i], "forward")
            taps = any(members[i].run.eagle is not None for i in live)  # the drafter's states, for every row
            rows = self.engine.target.forward_rows(self.cache, 0, tokens, trees, taps)  # [b, T, H]
            out = {i: rows[i, : len(tokens[i])] for i in live}
        except Exception:  # noqa: BLE001 (the shared forward failed: retry each request alone)
            out = {}
            for i in live:
                m = members[i]
                try:
                    self._hook(m, "forward")
                    out[i] = self.engine.target.forward_rows(self.cache, m.run.cache.row, [tokens[i]], [trees[i]],
                                                             m.run.eagle is not None)[0]
                except Exception as e:  # noqa: BLE001
                    outcome[i] = failed("forward", e, m.index)
        return self._check_finite(members, out, outcome)

    @staticmethod
    def _check_finite(members, out: dict[int, torch.Tensor], outcome: dict) -> dict[int, torch.Tensor]:
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

    def _finish(self, m: Member, draft: Draft | None, hidden: torch.Tensor, params: SamplingParams,
                clock: Stopwatch, size: int, verdict: Verdict | None = None) -> Outcome:
        """Steps 3-4 and the event for one request (round 0 included); callbacks see the event first.

        `verdict`: this request's verdict when the batch already verified it (greedy members).
        A failing callback still leaves the round's event with its request: its tokens were decoded.
        """
        eng, run = self.engine, m.run
        step, ev = "verify", None
        try:
            self._hook(m, "verify")
            if verdict is None:
                verdict = eng.verify(run, draft, hidden, params, clock)
            clock.lap("verify")
            step = "commit"
            self._hook(m, "commit")
            emitted = eng.commit(run, draft, verdict, hidden)
            clock.lap("cache")
            drafting.learn(run, draft, verdict, params)
            step = "event"
            ev = eng.event(run, m.index, draft, verdict, emitted, params, clock)
            ev = replace(ev, extra={**ev.extra, "batch": size})
            step = "callback"
            self._hook(m, "callback")
            for cb in m.callbacks:
                cb(ev)
        except Exception as e:  # noqa: BLE001 (isolated: this request alone ends)
            if ev is not None:
                m.index += 1
            return Outcome(ev, Failure(cause_of(step, e), step, m.index - (ev is not None), message_of(e)), e)
        m.index += 1
        return Outcome(ev)

    def _hook(self, m: Member, step: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(m.rid, m.index, step)


@dataclass(frozen=True)
class chaos:  # noqa: N801 (used as a function: `chaos(0.25)` is a fault hook)
    """A fault hook for chaos runs: about `fraction` of requests (by id) fail in round `at_round`,
    alternately with a simulated CUDA out-of-memory in the shared forward and an error in their verify.
    A plain value, so that it can be sent to an engine process."""

    fraction: float
    at_round: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise ValueError(f"`fraction` must be in (0, 1], got {self.fraction!r}")

    def __call__(self, rid: int, index: int, step: str) -> None:
        every = round(1 / self.fraction)
        if rid % every == every - 1 and index == self.at_round:
            if (rid // every) % 2 == 0 and step == "forward":
                raise torch.OutOfMemoryError("CUDA out of memory (injected by the chaos hook)")
            if (rid // every) % 2 == 1 and step == "verify":
                raise RuntimeError("injected by the chaos hook")
