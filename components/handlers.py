"""Event handlers: validate the controls, drive the engine's public API, yield UI updates.

`Handlers` holds only read-only shared things (the loaded model, options)
and one lock that serialises the sampler view's small forwards. Every
piece of user data lives in the `Session` passed in from `gr.State`.
"""
from __future__ import annotations

import html
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable

import gradio as gr
import torch

from specdec import Loaded, RoundEvent
from specdec.api import encode
from specdec.metrics import Metrics
from specdec.sampler import filter_stages
from specdec.verifier import LOSSY_RULES

from . import plots
from .serving import RequestMetrics, arrival_time
from .session import Run, Session, Settings
from .stats import accepted_by_lookup, stats_markdown, summarize
from .tokens import render_round, render_tokens


class Throttle:
    """True at most once per `interval` seconds (the first call is always True)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = float("-inf")

    def __call__(self, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            return True
        return False


def prompt_html(prompt: str) -> str:
    return f'<span class="sd-prompt" title="prompt">{html.escape(prompt, quote=False)}</span>'


def _code(text: str) -> str:
    return "`" + repr(text).replace("`", "ˋ") + "`"


def round_markdown(ev: RoundEvent | None) -> str:
    """A short description of one round for the round view."""
    if ev is None:
        return ""
    p = ev.params
    sampler = "greedy" if not p.get("temperature") else \
        f"T={p['temperature']:g}, top-k {p['top_k'] or 'off'}, top-p {p['top_p']:g}, min-p {p['min_p']:g}"
    rule = ev.acceptance + (" (LOSSY)" if ev.acceptance in LOSSY_RULES else "")
    toks = ", ".join(f"{_code(t.text)} {t.kind}" for t in ev.emitted)
    t = ev.timings
    times = ", ".join(f"{k} {t[k]:.1f} ms" for k in ("draft", "forward", "verify", "total") if k in t)
    head = "prefill" if ev.index == 0 else f"{len(ev.nodes) - 1 if ev.nodes else 0} drafts"
    looked_up = sum(1 for n in ev.nodes if n.source == "lookup")
    if looked_up:
        head += f", {looked_up} by prompt lookup, {accepted_by_lookup(ev)} of them accepted"
    return (f"**Round {ev.index}** ({head}) · rule {rule} · sampler {sampler}  \n"
            f"emitted: {toks}  \n{times}" + (f" · finished: {ev.finished}" if ev.finished else ""))


class Handlers:
    """The app's event handlers over one loaded model."""

    def __init__(self, loaded: Loaded, max_prompt_tokens: int = 512, figure_interval: float = 1.0,
                 text_interval: float = 0.1, chart_interval: float | None = None,
                 on_round: Iterable[Callable[[RoundEvent], None]] = (), sampler_top: int = 20,
                 metrics: Metrics | None = None) -> None:
        self.loaded = loaded
        self.metrics = metrics  # the app's Prometheus metrics (Generate requests only), or None
        self.engine = loaded.engine
        ctx = self.engine.target.max_length
        self.max_prompt_tokens = min(max_prompt_tokens, ctx - 2) if ctx else max_prompt_tokens
        # Plotly redraws are the browser's heaviest work while streaming (measured: a page
        # stalled for many seconds with four figures every 0.5 s), so the tree updates every
        # `figure_interval` s and the three charts less often; the final update has them all.
        self.figure_interval = figure_interval
        self.chart_interval = 4 * figure_interval if chart_interval is None else chart_interval
        self.text_interval = text_interval
        self.on_round = list(on_round)
        self.sampler_top = sampler_top
        self.sampler_lock = threading.Lock()  # one small sampler-view forward at a time, across sessions
        self.tree_choices = self._tree_choices()

    # -- helpers -------------------------------------------------------------
    def _tree_choices(self) -> list[tuple[str, str]]:
        if self.loaded.heads is None:
            return [("none (no draft heads loaded: prompt lookup only)", "none")]
        names = (["trained"] if self.loaded.tree_paths else []) + ["default", "small", "chain"]
        out = []
        for name in names:
            n = self.engine.resolve_tree(name).num_nodes
            what = "shipped with the heads" if name == "trained" else "preset"
            out.append((f"{name} ({n} nodes, {what})", name))
        out.append(("none (root only: prompt lookup drafts everything)", "none"))
        return out

    @property
    def default_tree(self) -> str:
        return self.tree_choices[0][1]

    def encode(self, prompt) -> list[int]:
        """Prompt text -> ids, or ValueError for an empty or over-long prompt."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("The prompt is empty: type some text or pick an example.")
        ids = encode(self.loaded, prompt, None)
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"The prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}.")
        return ids

    def _validate(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                  speculative, lookup, lookup_mode) -> tuple[Settings, list[int]]:
        try:
            settings = Settings.validate(temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                                         speculative, lookup, lookup_mode, trees=[v for _, v in self.tree_choices])
            ids = self.encode(prompt)
            if settings.speculative and not settings.lookup:
                if self.loaded.heads is None:
                    raise ValueError("Speculation needs draft heads or prompt lookup: set prompt lookup tokens "
                                     ">= 1, start the app with --heads, or turn speculation off.")
                if settings.tree == "none":
                    raise ValueError("The draft tree 'none' drafts nothing by itself: set prompt lookup tokens "
                                     ">= 1 or pick another tree.")
        except ValueError as e:
            raise gr.Error(str(e), title="Invalid input", print_exception=False) from None
        return settings, ids

    def next_logits(self, ids: list[int]) -> torch.Tensor:
        """The target's next-token logits after `ids`: one small forward, under the shared lock. -> [V]"""
        ctx = self.engine.target.max_length
        ids = ids[-(ctx - 1):] if ctx else ids  # the sampler view only needs the most recent context
        with self.sampler_lock:
            return self.engine.next_logits(ids)

    def _sampler_figure(self, session: Session, ids: list[int], settings: Settings, note: str):
        key = tuple(ids)
        cache = session.sampler_cache
        if cache is None or cache[0] != key:
            cache = session.sampler_cache = (key, self.next_logits(ids))
        params = settings.sampling_params()
        rows = filter_stages(cache[1], params, top=self.sampler_top)
        return plots.sampler_figure(rows, self.engine.token_text, params.to_dict(), len(ids), note)

    def _json(self, run: Run, ev: RoundEvent, stopped: bool = False) -> dict:
        """The compact per-round record sent to API clients (and shown in the JSON panel)."""
        return {"run": run.run_id, "round": ev.index, "new_tokens": ev.total_tokens, "text": run.text,
                "accepted_length": ev.accepted_length, "emitted": [t.kind for t in ev.emitted],
                "acceptance": ev.acceptance, "lossy": ev.acceptance in LOSSY_RULES,
                "speculative": ev.speculative, "params": ev.params, "seed": run.seed,
                "accepted_lookup": accepted_by_lookup(ev),
                "finished": ev.finished or ("stopped" if stopped else None)}

    # -- Generate --------------------------------------------------------------
    def generate(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                 speculative, lookup, lookup_mode, session: Session, request: gr.Request | None = None):
        """Stream one generation: an update per round, the tree at most every `figure_interval` s.

        Rounds faster than `text_interval` (a GPU does hundreds per second) are batched into one
        update: each yield costs Gradio a diff and a message, and the engine only runs while we
        are not suspended at a yield, so yielding per round would pace decoding by the UI.
        `request` is injected by Gradio; its arrival time starts the request's latency metrics.
        """
        with RequestMetrics(self.metrics, arrival_time(request), self.engine.prefix_cache) as req:
            settings, ids = self._validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree,
                                           acceptance, speculative, lookup, lookup_mode)
            run = session.start_run(prompt, ids, settings)
            try:
                stream = self.engine.stream(ids, settings.max_new_tokens, session.live_params, settings.tree,
                                            settings.speculative, settings.acceptance,
                                            on_round=[run.record, req.on_round, *self.on_round],
                                            should_stop=session.should_stop(run),
                                            **self._lookup_kwargs(settings, settings.speculative))
            except ValueError as e:
                session.finish(run)
                raise gr.Error(str(e), title="Invalid input", print_exception=False) from None
            tree_due, charts_due = Throttle(self.figure_interval), Throttle(self.chart_interval)
            text_due = Throttle(self.text_interval)
            text_html, prev, ev = prompt_html(prompt), None, None
            try:
                for ev in stream:  # `run.record` has already stored it
                    text_html += render_round(ev, prev)
                    prev = ev.params
                    if text_due():
                        yield self._updates(run, ev, text_html, tree_due(), charts_due(), sampler=gr.skip())
            finally:
                stream.close()  # frees the KV cache also when Gradio closes us (Stop, disconnect)
                session.finish(run)
            if ev is None:
                return
            req.cancelled = run.stopped and ev.finished is None  # Stop (or a newer run) ended it early
            # The final update always carries every figure, and the sampler view at the new position.
            note = "position after the generated text; moving a slider re-filters it"
            sampler = self._sampler_figure(session, run.prompt_ids + run.token_ids, session.live, note)
            yield self._updates(run, ev, text_html, True, True, sampler)

    @staticmethod
    def _lookup_kwargs(settings: Settings, speculative: bool) -> dict:
        """Prompt lookup for `engine.stream`: plain decoding drafts nothing, so it gets lookup=0."""
        return {"lookup": settings.lookup if speculative else 0, "lookup_mode": settings.lookup_mode}

    def _updates(self, run: Run, ev: RoundEvent, text_html: str, tree: bool, charts: bool, sampler) -> tuple:
        stopped = run.stopped and ev.finished is None
        stats = stats_markdown(summarize(run.events), stopped=stopped or run.done)
        sk = gr.skip()
        tree_out = (sk, sk, sk)
        if tree:
            # Show the newest round that verified a tree: the last rounds of a run can be plain
            # (no room left under max_new_tokens), and their empty view would hide the last tree.
            shown = next((e for e in reversed(run.events) if e.nodes), ev)
            tree_out = (plots.tree_figure(shown), gr.Slider(minimum=0, maximum=max(1, ev.index), value=shown.index,
                                                           step=1), round_markdown(shown))
        charts_out = (sk, sk, sk)
        if charts:
            charts_out = (plots.accepted_length_figure(run.events), plots.depth_acceptance_figure(run.events),
                          plots.throughput_figure(run.events))
        return (text_html, stats, *tree_out, *charts_out, sampler, self._json(run, ev, stopped))

    def stop(self, session: Session) -> None:
        """Stop the session's running generation (or Compare); the engine sees it before its next round."""
        session.request_stop()

    def clear(self, session: Session) -> tuple:
        session.clear()
        empty = plots.tree_figure(None)
        return ("", "", empty, gr.Slider(minimum=0, maximum=1, value=0, step=1), "",
                plots.accepted_length_figure([]), plots.depth_acceptance_figure([]),
                plots.throughput_figure([]), gr.skip(), None, "", "", "")

    # -- views that never touch the model queue ----------------------------------
    def show_round(self, index, session: Session) -> tuple:
        """Step back to round `index` of the last run: its tree, description and full event."""
        run = session.run
        if run is None or not run.events:
            return plots.tree_figure(None), "", None
        try:
            i = int(index)
        except (TypeError, ValueError):
            raise gr.Error(f"`round` must be an integer, got {index!r}", print_exception=False) from None
        i = max(0, min(i, len(run.events) - 1))
        ev = run.events[i]
        return plots.tree_figure(ev), round_markdown(ev), ev.to_dict()

    def sampler_view(self, prompt, temperature, top_k, top_p, min_p, acceptance, session: Session):
        """Update the live settings and redraw the sampler view. A running generation picks up the
        new values at its next round; the rule only changes between runs."""
        try:
            live = session.live.with_live(temperature, top_k, top_p, min_p)
            if not session.running:
                live = Settings.validate(live.temperature, live.top_k, live.top_p, live.min_p,
                                         live.max_new_tokens, live.seed, live.tree, acceptance, live.speculative,
                                         live.lookup, live.lookup_mode)
        except ValueError as e:
            raise gr.Error(str(e), title="Invalid input", print_exception=False) from None
        session.live = live
        view = replace(live, acceptance=acceptance if acceptance in ("lossless", "greedy", "typical") else
                       live.acceptance)
        run = session.run
        if run is not None and run.done and run.prompt == prompt:
            ids, note = run.prompt_ids + run.token_ids, "position after the generated text"
        else:
            try:
                ids = self.encode(prompt)
            except ValueError as e:
                return plots.empty_figure(f"Sampler view: {e}", 320)
            note = "position after the prompt"
        return self._sampler_figure(session, ids, view, note)

    # -- Compare -----------------------------------------------------------------
    def compare(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                speculative, lookup, lookup_mode, session: Session):
        """Run speculative then plain decoding with identical, fixed settings; report the speedup."""
        settings, ids = self._validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree,
                                       acceptance, True, lookup, lookup_mode)
        run = session.start_run(prompt, ids, settings, main=False)
        params = settings.sampling_params(run.seed)
        results = {}
        tick = Throttle(0.5)
        try:
            # Untimed warm-up of both paths: first calls pay for kernel selection and allocator
            # growth. On CUDA that cost recurs for every new (query, cache) length, and can exceed
            # a whole run, so there the warm-up is the same run (same seed, so the same shapes).
            warm = settings.max_new_tokens if self.loaded.device.type == "cuda" else min(4, settings.max_new_tokens)
            yield "Warming up both decoders…", gr.skip(), gr.skip()
            for spec in (True, False):
                for _ in self.engine.stream(ids, warm, params, settings.tree, spec, settings.acceptance,
                                            should_stop=session.should_stop(run),
                                            **self._lookup_kwargs(settings, spec)):
                    pass
            for name, spec in (("speculative", True), ("baseline", False)):
                stream = self.engine.stream(ids, settings.max_new_tokens, params, settings.tree, spec,
                                            settings.acceptance, should_stop=session.should_stop(run),
                                            **self._lookup_kwargs(settings, spec))
                events, busy = [], 0.0
                try:
                    while True:
                        t0 = time.perf_counter()
                        ev = next(stream, None)
                        busy += time.perf_counter() - t0  # model time only, not our yields
                        if ev is None:
                            break
                        events.append(ev)
                        if tick():
                            yield (f"Running **{name}**… {ev.total_tokens}/{settings.max_new_tokens} tokens",
                                   gr.skip(), gr.skip())
                finally:
                    stream.close()
                results[name] = (events, busy)
                if run.stopped:
                    yield "Compare stopped.", gr.skip(), gr.skip()
                    return
        finally:
            session.finish(run)
        yield (self._compare_markdown(results, params.greedy, settings),
               prompt_html(prompt) + render_tokens(results["speculative"][0]),
               prompt_html(prompt) + render_tokens(results["baseline"][0]))

    @staticmethod
    def _compare_markdown(results: dict, greedy: bool, settings: Settings) -> str:
        (sev, sbusy), (bev, bbusy) = results["speculative"], results["baseline"]
        s, b = summarize(sev, sbusy), summarize(bev, bbusy)
        st, bt = s["wall_tokens_per_second"], b["wall_tokens_per_second"]
        speedup = st / bt if st and bt else None
        s_ids = [t.token_id for ev in sev for t in ev.emitted]
        b_ids = [t.token_id for ev in bev for t in ev.emitted]
        if greedy:
            if s_ids == b_ids:
                same = "✓ **identical** texts (greedy: speculative decoding must reproduce the baseline exactly)"
            else:
                k = next((i for i, (x, y) in enumerate(zip(s_ids, b_ids)) if x != y), min(len(s_ids), len(b_ids)))
                same = (f"✗ texts **differ** from token {k} (greedy should match exactly; in fp16/bf16 "
                        "tiny numeric differences between a tree forward and a single-token forward can flip a tie)")
        elif settings.acceptance in LOSSY_RULES:
            same = "typical acceptance is **LOSSY**: the output no longer follows the target distribution"
        else:
            same = ("sampling: the two texts need not match; lossless verification means both follow the same "
                    "distribution")
        sp = "n/a" if speedup is None else f"**{speedup:.2f}×**"
        how = f" (prompt lookup {settings.lookup}, {settings.lookup_mode})" if settings.lookup else ""
        return (f"| | tokens | time (s) | tok/s | mean accepted length |\n|---|---|---|---|---|\n"
                f"| speculative{how} | {s['new_tokens']} | {sbusy:.2f} | {st or 0:.1f} | "
                f"{s['mean_accepted_length'] or 0:.2f} |\n"
                f"| baseline | {b['new_tokens']} | {bbusy:.2f} | {bt or 0:.1f} | 1.00 |\n\n"
                f"Measured speedup {sp} (same prompt, settings and seed; engine time after an untimed warm-up, "
                f"UI excluded). "
                f"{same}.")
