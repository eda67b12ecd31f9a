"""Event handlers: validate the controls, drive the engine's public API, yield UI updates.

`Handlers` holds only read-only shared things (the loaded model, options)
and one `model_lock`: every target forward the app starts (each round of
a generation or a race, each sampler-view forward) runs under it, so the
sampler view interleaves between rounds and never runs during one. Every
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
from .race import race_markdown
from .replay import highlight_css, instructive_round, longest_accept, next_rejection, round_markdown
from .serving import RequestMetrics, arrival_time
from .session import Run, Session, Settings
from .stats import accepted_by_lookup, stats_markdown, summarize
from .tokens import render_round


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


class Handlers:
    """The app's event handlers over one loaded model."""

    def __init__(self, loaded: Loaded, max_prompt_tokens: int = 512, figure_interval: float = 1.0,
                 text_interval: float = 0.1, chart_interval: float | None = None,
                 on_round: Iterable[Callable[[RoundEvent], None]] = (), sampler_top: int = 20,
                 metrics: Metrics | None = None, replay_interval: float = 0.8) -> None:
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
        self.replay_interval = replay_interval  # seconds per round when ▶ replays a run
        self.on_round = list(on_round)
        self.sampler_top = sampler_top
        # One target forward at a time, across sessions: generation rounds, race rounds and the
        # sampler view's forwards all take it (Gradio's model queue already serialises the runs).
        self.model_lock = threading.Lock()
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

    @property
    def has_chat_template(self) -> bool:
        return self.loaded.has_chat_template

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """Prompt text -> ids (wrapped as a chat turn with `chat`), or ValueError for a bad prompt."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("The prompt is empty: type some text or pick an example.")
        if not isinstance(chat, bool):
            raise ValueError(f"`chat` must be true or false, got {chat!r}")
        ids = encode(self.loaded, prompt, None, chat=chat)
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"The prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}.")
        return ids

    def _validate(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                  speculative, lookup, lookup_mode, chat=False) -> tuple[Settings, list[int]]:
        try:
            settings = Settings.validate(temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                                         speculative, lookup, lookup_mode, trees=[v for _, v in self.tree_choices])
            ids = self.encode(prompt, chat)
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

    def _next(self, stream) -> tuple[RoundEvent | None, float]:
        """One round of an engine stream under the model lock -> (event or None at the end, seconds)."""
        with self.model_lock:
            t0 = time.perf_counter()
            ev = next(stream, None)
            return ev, time.perf_counter() - t0

    def _close(self, stream) -> None:
        with self.model_lock:
            stream.close()  # frees the KV cache (also when Gradio closes us: Stop, disconnect)

    def next_logits(self, ids: list[int]) -> torch.Tensor:
        """The target's next-token logits after `ids`: one small forward, under the model lock. -> [V]"""
        ctx = self.engine.target.max_length
        ids = ids[-(ctx - 1):] if ctx else ids  # the sampler view only needs the most recent context
        with self.model_lock:
            return self.engine.next_logits(ids)

    def _sampler_figure(self, session: Session, ids: list[int], settings: Settings, note: str,
                        emitted: int | None = None, emitted_prob: float | None = None):
        key = tuple(ids)
        cache = session.sampler_cache
        if cache is None or cache[0] != key:
            cache = session.sampler_cache = (key, self.next_logits(ids))
        params = settings.sampling_params()
        rows = filter_stages(cache[1], params, top=self.sampler_top)
        return plots.sampler_figure(rows, self.engine.token_text, params.to_dict(), len(ids), note, emitted,
                                    emitted_prob)

    def _run_sampler(self, session: Session, run: Run, settings: Settings):
        """The sampler view at the run's newest token: the law it was drawn from, that token starred."""
        last = next((t for ev in reversed(run.events) for t in reversed(ev.emitted)), None)
        if last is None:
            return self._sampler_figure(session, run.prompt_ids, settings, "next token after the prompt")
        ids = run.prompt_ids + run.token_ids[:-1]
        note = (f"where the run's token {len(run.token_ids)} was drawn; the sliders filter the next rounds"
                if not run.done else f"where the run's last token ({len(run.token_ids)}) was drawn")
        return self._sampler_figure(session, ids, settings, note, last.token_id, last.target_prob)

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
                 speculative, lookup, lookup_mode, chat, session: Session, request: gr.Request | None = None):
        """Stream one generation: an update per round (batched when rounds are fast), figures throttled.

        Each yield costs Gradio a diff and a message, and the engine only runs while we are not
        suspended at a yield, so yielding per round would pace decoding by the UI. Stop ends the
        run at the next round boundary and the last update still carries every figure. `request`
        (from Gradio) stamps the request's arrival for the latency metrics.
        """
        with RequestMetrics(self.metrics, arrival_time(request), self.engine.prefix_cache) as req:
            settings, ids = self._validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree,
                                           acceptance, speculative, lookup, lookup_mode, chat)
            run = session.start_run(prompt, ids, settings, chat=chat)
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
                while True:
                    try:
                        new, _ = self._next(stream)  # `run.record` has already stored it
                    except ValueError as e:  # a request the engine refuses once it starts
                        raise gr.Error(str(e), title="Invalid input", print_exception=False) from None
                    if new is None:
                        break
                    ev = new
                    text_html += render_round(ev, prev)
                    prev = ev.params
                    if text_due():
                        draw = tree_due()  # the tree, and the sampler view at the newest token (one forward)
                        sampler = self._run_sampler(session, run, session.live) if draw else gr.skip()
                        yield self._updates(run, ev, text_html, draw, charts_due(), sampler)
            finally:
                self._close(stream)
                session.finish(run)
            if ev is None:
                return
            req.cancelled = run.stopped and ev.finished is None  # Stop (or a newer run) ended it early
            # The final update carries every figure, the most instructive round, and the sampler view.
            yield self._updates(run, ev, text_html, True, True, self._run_sampler(session, run, session.live),
                                final=True)

    @staticmethod
    def _lookup_kwargs(settings: Settings, speculative: bool) -> dict:
        """Prompt lookup for `engine.stream`: plain decoding drafts nothing, so it gets lookup=0."""
        return {"lookup": settings.lookup if speculative else 0, "lookup_mode": settings.lookup_mode}

    def _updates(self, run: Run, ev: RoundEvent, text_html: str, tree: bool, charts: bool, sampler,
                 final: bool = False) -> tuple:
        stopped = run.stopped and ev.finished is None
        stats = stats_markdown(summarize(run.events), stopped=stopped or run.done)
        sk = gr.skip()
        tree_out = (sk, sk, sk, sk)
        if tree:
            if final:  # after the run: the round most worth a look, not simply the last one
                shown = run.events[instructive_round(run.events)]
            else:  # live: the newest round that verified a tree (the last rounds can be plain)
                shown = next((e for e in reversed(run.events) if e.nodes), ev)
            tree_out = (plots.tree_figure(shown), self._slider(run, shown.index), round_markdown(shown),
                        highlight_css(shown.index))
        charts_out = (sk, sk, sk)
        if charts:
            charts_out = (plots.accepted_length_figure(run.events), plots.depth_acceptance_figure(run.events),
                          plots.throughput_figure(run.events))
        return (text_html, stats, *tree_out[:3], *charts_out, sampler, tree_out[3], self._json(run, ev, stopped))

    @staticmethod
    def _slider(run: Run | None, value: int) -> gr.Slider:
        top = max(1, len(run.events) - 1) if run is not None else 1
        return gr.Slider(minimum=0, maximum=top, value=value, step=1)

    def stop(self, session: Session) -> None:
        """Stop the session's running generation or race; it ends before its next round."""
        session.request_stop()

    def clear(self, prompt, temperature, top_k, top_p, min_p, acceptance, chat, session: Session) -> tuple:
        """Forget the last run; the sampler view goes back to the position after the prompt."""
        session.clear()
        empty = plots.tree_figure(None)
        try:
            sampler = self.sampler_view(prompt, temperature, top_k, top_p, min_p, acceptance, chat, session)
        except gr.Error:
            sampler = gr.skip()
        return ("", "", empty, self._slider(None, 0), "", plots.accepted_length_figure([]),
                plots.depth_acceptance_figure([]), plots.throughput_figure([]), sampler, "", None,
                COMPARE_HINT, "", "")

    # -- round views: pure functions of the session's last run --------------------
    def _round_view(self, run: Run, i: int) -> tuple:
        ev = run.events[i]
        return plots.tree_figure(ev), round_markdown(ev), ev.to_dict(), self._slider(run, i), highlight_css(i)

    @staticmethod
    def _index(value) -> int:
        """A round number from the UI or the API; out-of-range values are clamped by the caller."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise gr.Error(f"`round` must be an integer, got {value!r}", title="Invalid input",
                           print_exception=False)
        return int(value)

    def show_round(self, index, session: Session) -> tuple:
        """Round `index` of the last run: its tree, narration, full event, the slider, and its tokens outlined.

        Any integer is accepted: past the last round (a run still streaming) it shows the last one."""
        run = session.run
        i = self._index(index)
        if run is None or not run.events:
            return plots.tree_figure(None), "", None, self._slider(None, 0), ""
        return self._round_view(run, max(0, min(i, len(run.events) - 1)))

    def step_round(self, index, session: Session, step: int) -> tuple:
        return self.show_round(self._index(index) + step, session)

    def jump_rejection(self, index, session: Session) -> tuple:
        """The next round (after the shown one, wrapping) in which the target rejected a draft."""
        run = session.run
        if run is None or not run.events:
            return self.show_round(0, session)
        return self.show_round(next_rejection(list(run.events), self._index(index)), session)

    def jump_longest(self, session: Session) -> tuple:
        """The round that accepted the most drafts."""
        run = session.run
        return self.show_round(longest_accept(list(run.events)) if run is not None else 0, session)

    def token_round(self, session: Session, evt: gr.SelectData) -> tuple:
        """A click on a token: show the round that wrote it."""
        return self.show_round(evt.index, session)

    def replay(self, index, session: Session):
        """▶: step through the run's rounds at a readable pace, tree, narration, tokens and chart in sync.

        Starts at the shown round (from the beginning when it is the last one)."""
        run = session.run
        if run is None or not run.events:
            yield (*self.show_round(0, session), gr.skip())
            return
        events = list(run.events)
        start = max(0, min(self._index(index), len(events) - 1))
        start = 0 if start >= len(events) - 1 else start
        for i in range(start, len(events)):
            yield (*self._round_view(run, i), plots.accepted_length_figure(events, current=i))
            time.sleep(self.replay_interval)

    # -- live settings and the sampler view ------------------------------------------
    @staticmethod
    def temperature_control(acceptance) -> gr.Slider:
        """The greedy rule ignores temperature, so its slider is greyed out."""
        return gr.Slider(interactive=acceptance != "greedy",
                         info="ignored: the greedy rule always takes the argmax" if acceptance == "greedy"
                         else "0 = greedy; live: applies from the next round")

    def sampler_view(self, prompt, temperature, top_k, top_p, min_p, acceptance, chat, session: Session):
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
        if run is not None and run.events and run.prompt == prompt and run.chat == bool(chat):
            return self._run_sampler(session, run, view)
        try:
            ids = self.encode(prompt, bool(chat))
        except ValueError as e:
            return plots.empty_figure(f"Sampler view: {e}", 320)
        return self._sampler_figure(session, ids, view, "next token after the prompt")

    # -- Compare: a race on one engine clock -------------------------------------------
    def compare(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance, lookup,
                lookup_mode, chat, session: Session):
        """Race speculative against plain decoding with identical settings and seed; explain the ratio.

        Both lanes advance on one engine clock: the lane that has used less engine time runs the
        next round, so the two panes grow as fast as each decoder really is."""
        settings, ids = self._validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree,
                                       acceptance, True, lookup, lookup_mode, chat)
        run = session.start_run(prompt, ids, settings, main=False, chat=chat)
        params = settings.sampling_params(run.seed)
        stop = session.should_stop(run)
        lanes = {spec: {"events": [], "seconds": 0.0, "html": prompt_html(prompt), "prev": None, "done": False}
                 for spec in (True, False)}
        how = f" (prompt lookup {settings.lookup}, {settings.lookup_mode})" if settings.lookup else ""

        def view(done: bool) -> tuple:
            s, b = lanes[True], lanes[False]
            md = race_markdown(s["events"], s["seconds"], b["events"], b["seconds"], done=done,
                               max_new_tokens=settings.max_new_tokens, greedy=params.greedy,
                               acceptance=settings.acceptance, device=self._device_name(),
                               temperature=params.temperature, how=how)
            return md, s["html"], b["html"]

        streams = {}
        try:
            # Untimed warm-up of both paths: first calls pay for kernel selection and allocator
            # growth. On CUDA that cost recurs for every new (query, cache) length, and can exceed
            # a whole run, so there the warm-up is the same run (same seed, so the same shapes).
            warm = settings.max_new_tokens if self.loaded.device.type == "cuda" else min(4, settings.max_new_tokens)
            yield "Warming up both decoders…", "", ""
            for spec in (True, False):
                s = self.engine.stream(ids, warm, params, settings.tree, spec, settings.acceptance,
                                       should_stop=stop, **self._lookup_kwargs(settings, spec))
                while self._next(s)[0] is not None:
                    pass
            for spec in (True, False):
                streams[spec] = self.engine.stream(ids, settings.max_new_tokens, params, settings.tree, spec,
                                                   settings.acceptance, should_stop=stop,
                                                   **self._lookup_kwargs(settings, spec))
            tick = Throttle(0.3)
            while not all(lane["done"] for lane in lanes.values()) and not run.stopped:
                spec = min((k for k in lanes if not lanes[k]["done"]), key=lambda k: lanes[k]["seconds"])
                lane = lanes[spec]
                ev, secs = self._next(streams[spec])
                lane["seconds"] += secs
                if ev is None:
                    lane["done"] = True
                    continue
                lane["events"].append(ev)
                lane["html"] += render_round(ev, lane["prev"])
                lane["prev"] = ev.params
                if tick():
                    yield view(False)
        finally:
            for s in streams.values():
                self._close(s)
            session.finish(run)
        if run.stopped:
            md, a, b = view(False)
            yield "**Race stopped.**\n\n" + md.split("\n\n", 1)[1], a, b
            return
        yield view(True)

    def _device_name(self) -> str:
        return {"cpu": "CPU", "cuda": "GPU"}.get(self.loaded.device.type, self.loaded.device.type)


COMPARE_HINT = "**Compare**: race speculative against plain decoding, side by side, and see why one wins."
