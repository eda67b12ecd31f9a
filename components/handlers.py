"""Event handlers: validate the controls, drive the engine's narrow face, yield UI updates.

`Handlers` holds only read-only shared things (the model gate, options); every piece of user
data lives in the `Session` passed in from `gr.State`. Its parts, one module each: the round
views (round_views.py), the sampler view (sampler_view.py) and the race (compare.py); this
module has Generate, Stop and Clear.
"""
from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Callable, Iterable

import gradio as gr

from specdec import Loaded, RoundEvent
from specdec.api import encode
from specdec.metrics import Metrics, RequestMetrics
from specdec.stats import accepted_by_lookup, is_lossy, summarize

from . import plots
from .compare import COMPARE_HINT, RaceView
from .draft_tree_figure import tree_figure
from .gate import open_gate
from .node_table import node_table_html
from .pace import Feed, Pacer, check_pace, stale
from .replay import drafter_name, highlight_css, instructive_round, round_markdown
from .round_views import RoundViews, round_slider
from .sampler_view import SamplerView
from .serving import arrival_time
from .session import Run, Session, Settings
from .stats_line import stats_markdown
from .tokens import render_round
from .updates import Throttle, prompt_html, user_error

# Characters a prompt may not hold: C0 controls and DEL other than the whitespace text uses (tab, newlines,
# vertical tab, form feed), and lone surrogates (JSON can carry "\ud800"; no tokenizer can encode it).
_REFUSED = re.compile("[\x00-\x08\x0e-\x1f\x7f\ud800-\udfff]")


def check_prompt(prompt) -> None:
    """ValueError naming what is wrong with a prompt that is not plain text (None passes: it is empty)."""
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"`prompt` must be text, got {type(prompt).__name__}")
    bad = _REFUSED.search(prompt or "")
    if bad is not None:
        kind = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a control character"
        raise ValueError(f"`prompt` holds {kind} (U+{ord(bad.group()):04X}) at character {bad.start()}")

__all__ = ["Handlers", "Throttle", "round_markdown", "COMPARE_HINT", "tree_choices", "model_line"]


def tree_choices(info: dict) -> list[tuple[str, str]]:
    """The drafter-and-tree dropdown's (label, value) pairs from `Engine.info()`: EAGLE-3's tree where it is
    loaded, the heads' dynamic tree and static presets where they are, and prompt lookup alone."""
    eagle = info.get("eagle3")
    out = [(f"EAGLE-3 (a tree grown token by token, up to {eagle['nodes']} nodes)", "eagle3")] if eagle else []
    if not info["heads"]:
        if not eagle:
            out.append(("auto (dynamic: the lookup chain sized by this machine's cost)", "auto"))
        return out + [("none (no model drafter: prompt lookup only)", "none")]
    trees = info["trees"]
    out.append(("Medusa heads, auto (dynamic: grown each round from the heads' confidence, sized by this "
                "machine's cost)", "auto"))
    out += [(f"Medusa heads, {name} ({trees[name]} nodes, {'shipped with the heads' if name == 'trained' else 'preset'})",
             name) for name in ("trained", "default", "small", "chain") if name in trees]
    return out + [("none (root only: prompt lookup drafts everything)", "none")]


def model_line(info: dict, name: str = "") -> str:
    """One Markdown line on what runs: model, size, dtype, device, CUDA graphs, heads and prefix cache."""
    heads = f"{info['heads']} Medusa heads" if info["heads"] else "no draft heads"
    if info.get("eagle3"):
        heads = ("an EAGLE-3 drafter and " + heads) if info["heads"] else "an EAGLE-3 drafter"
    if info["heads"] and info.get("heads_dtype") not in (None, info["dtype"]):  # stored narrower for speed
        heads += f" ({info['heads_dtype']} projections)"
    cache = info["prefix_cache"]
    cache = f" · prefix cache {cache['max_bytes'] / 2**20:.0f} MiB" if cache is not None else ""
    graphs = " · CUDA graphs" if info.get("cuda_graphs") is not None else ""
    return (f"model **{name or info['model']}** ({info['params'] / 1e6:.1f}M params, {info['dtype']}, "
            f"{info['device']}){graphs} · {heads}{cache}")


class Handlers(RoundViews, SamplerView, RaceView):
    """The app's event handlers over one loaded model."""

    def __init__(self, loaded: Loaded, max_prompt_tokens: int = 512, figure_interval: float = 1.0,
                 text_interval: float = 0.1, chart_interval: float | None = None,
                 on_round: Iterable[Callable[[RoundEvent], None]] = (), sampler_top: int = 20,
                 metrics: Metrics | None = None, replay_interval: float = 0.8) -> None:
        self.loaded = loaded  # for `encode` (the tokenizer and its chat template)
        self.gate = open_gate(loaded)  # every model call goes through the scheduler
        self.metrics = metrics  # the app's Prometheus metrics (Generate requests only), or None
        ctx = self.gate.info["context"]
        self.max_prompt_tokens = min(max_prompt_tokens, ctx - 2) if ctx else max_prompt_tokens
        # Plotly redraws are the browser's heaviest work while streaming, so the tree updates every
        # `figure_interval` s and the three charts less often; the final update has them all.
        self.figure_interval = figure_interval
        self.chart_interval = 4 * figure_interval if chart_interval is None else chart_interval
        self.text_interval = text_interval
        self.replay_interval = replay_interval
        self.on_round = list(on_round)
        self.sampler_top = sampler_top
        self.streaming = 0  # Generate runs streaming now: their updates share one budget (Throttle's scale)
        self._streaming_lock = threading.Lock()
        self._blank: dict | None = None  # the blank views, serialized once (`_blank_views`)
        self.tree_choices = tree_choices(self.gate.info)
        self.model_line = model_line(self.gate.info, loaded.name)

    @property
    def default_tree(self) -> str:
        """The page's tree, chosen to teach: EAGLE-3's where it is loaded (a tree grown token by token, whose
        drafts the target accepts most), else the heads' own, else the first choice."""
        values = [v for _, v in self.tree_choices]
        return next((t for t in ("eagle3", "trained", "default") if t in values), values[0])

    def page_defaults(self) -> Settings:
        """The page's settings, chosen to teach (Compare tells the speed story): the heads' tree with the
        lookup chain merged into it, so most rounds draw branches and the heads make most accepted drafts."""
        drafts = self.gate.info["heads"] or self.gate.info.get("eagle3")
        return Settings(tree=self.default_tree, lookup_mode="merge" if drafts else "first")

    @property
    def has_chat_template(self) -> bool:
        return self.loaded.has_chat_template

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """Prompt text -> ids (wrapped as a chat turn with `chat`), or ValueError for a bad prompt."""
        check_prompt(prompt)
        if not prompt or not prompt.strip():
            raise ValueError("Type a prompt first: the prompt box is empty.")
        ids = encode(self.loaded, prompt if isinstance(prompt, str) else None, None, chat=chat)
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"The prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}.")
        return ids

    def validate(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                 speculative, lookup, lookup_mode, chat=False) -> tuple[Settings, list[int]]:
        """The controls as Settings and the prompt as ids, or a toast naming what is wrong."""
        try:
            settings = Settings.validate(temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                                         speculative, lookup, lookup_mode, trees=[v for _, v in self.tree_choices])
            if settings.tree != "eagle3" and self.gate.info["heads"]:  # the menu's other trees are the heads'
                settings = replace(settings, drafter="medusa")
            ids = self.encode(prompt, chat)
            if settings.speculative and settings.tree == "none" and not settings.lookup:
                raise ValueError("The draft tree 'none' drafts nothing by itself: set prompt lookup tokens "
                                 ">= 1 or pick another tree.")
        except ValueError as e:
            raise user_error(e) from None
        return settings, ids

    def _json(self, run: Run, ev: RoundEvent, stopped: bool = False, events: list | None = None) -> dict:
        """The compact per-round record sent to API clients (and shown in the JSON panel)."""
        text = run.text if events is None else "".join(e.text for e in events)
        return {"run": run.run_id, "round": ev.index, "new_tokens": ev.total_tokens, "text": text,
                "accepted_length": ev.accepted_length, "emitted": [t.kind for t in ev.emitted],
                "acceptance": ev.acceptance, "lossy": is_lossy(ev.acceptance),
                "speculative": ev.speculative, "params": ev.params, "seed": run.seed,
                "accepted_lookup": accepted_by_lookup(ev),
                "finished": ev.finished or ("stopped" if stopped else None)}

    # -- Generate --------------------------------------------------------------
    def generate_paced(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                       speculative, lookup, lookup_mode, chat, pace=None, session: Session | None = None,
                       request: gr.Request | None = None):
        """`generate` with the pace as its last input (the page sends its control's; the API, none: "fast")."""
        yield from self.generate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                                 speculative, lookup, lookup_mode, chat, session, request, pace=pace)

    def generate(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance,
                 speculative, lookup, lookup_mode, chat, session: Session, request: gr.Request | None = None,
                 pace=None):
        """Stream one generation: an update per round (batched when rounds are fast), figures throttled.

        The scheduler decodes this request together with other users' while we render; each yield
        costs Gradio a diff and a message, so rounds that arrive faster than `text_interval` share
        one update. At a `pace` other than "fast" every round is shown, each held until its time (see
        pace.py); Stop then ends the run at the round shown. Stop ends the run at the next round boundary
        and the last update still carries every figure. `request` (from Gradio) stamps the request's
        arrival for the latency metrics.
        """
        with RequestMetrics(self.metrics, arrival_time(request), self.gate.prefix_cache) as req:
            try:
                pace = check_pace(pace)
            except ValueError as e:
                raise user_error(e) from None
            settings, ids = self.validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree,
                                          acceptance, speculative, lookup, lookup_mode, chat)
            run = session.start_run(prompt, ids, settings, chat=chat)
            pacer = Pacer(pace, run)
            # A paced run's request ends in the engine long before its last round is shown: its latency is the
            # engine's, so it is counted as its last event arrives, not when the view catches up.
            ended = [lambda e: req.end("ok") if e.finished else None] if pacer.paced else []
            feed = Feed(run, [req.on_round, *self.on_round, *ended])
            try:
                stream = self.gate.stream(settings.request(ids, lambda: session.live_params(run)), on_round=[feed],
                                          should_stop=session.should_stop(run))
            except gr.Error:
                session.finish(run)
                raise
            share = lambda: max(1, self.streaming)  # noqa: E731
            with self._streaming_lock:
                self.streaming += 1
            tree_due, charts_due = Throttle(self.figure_interval, share), Throttle(self.chart_interval, share)
            text_due = Throttle(self.text_interval, share, first=True)  # the first token goes out at once
            text_html, prev, ev = prompt_html(prompt), None, None
            shown = self._blank_views()  # what this run's stream shows in each view until it is drawn
            try:
                while True:
                    new, _ = self.gate.step(stream)  # `feed` has already stored it
                    if new is None or run.replaced:  # a replaced run's tab shows its newer run now
                        break
                    if not pacer.wait():  # Stop while the round waited for its turn: the run ends at the shown one
                        feed.close(pacer.shown)
                        break
                    new = feed.shift(new)
                    if pacer.paced and run is session.run and stale(new, session.live_params(run)):
                        stream, feed = self._resume(run, session, settings, stream, feed, new.index)
                        new, _ = self.gate.step(stream)
                        if new is None:
                            break
                        new = feed.shift(new)
                    ev = new
                    text_html += render_round(ev, prev)
                    prev = ev.params
                    if pacer.paced or text_due():
                        draw = pacer.paced or tree_due()  # the tree, and the sampler view at the newest token
                        sampler = self._run_sampler(session, run, session.live) if draw and not pacer.paced else None
                        yield self._updates(run, ev, text_html, draw, charts_due(), sampler, shown, live=pacer.paced)
            finally:
                with self._streaming_lock:
                    self.streaming -= 1
                self.gate.close(stream)
                session.finish(run)
            if ev is None or run.replaced:
                return
            req.cancelled = run.stopped and ev.finished is None  # Stop (or a newer run) ended it early
            # The final update carries every figure, the most instructive round, and the sampler view.
            yield self._updates(run, ev, text_html, True, True, self._run_sampler(session, run, session.live),
                                shown, final=True)

    def _resume(self, run: Run, session: Session, settings: Settings, stream, feed: Feed, at: int) -> tuple:
        """The sliders moved while a paced run's round `at` waited: drop the rounds made from `at` on under the old
        settings and go on from the shown ones with the live settings, as a new request -> (its stream, its feed)."""
        self.gate.close(stream)
        feed.close(at)
        feed = Feed(run, self.on_round)
        request = settings.request(run.prompt_ids + run.token_ids, lambda: session.live_params(run),
                                   max_new_tokens=settings.max_new_tokens - len(run.token_ids))
        return self.gate.stream(request, on_round=[feed], should_stop=session.should_stop(run)), feed

    def _blank_views(self) -> dict:
        """A run's views before it draws them: blank figures (the last run's belong to it), round 0 on the
        slider, the sampler view as it is (None: gr.skip(), until the run draws it).

        A streamed update re-sends every view that is not due with the value it last sent, rather than
        gr.skip(): Gradio 6 handles each skipped output by building a new component from the output's
        constructor arguments and rebuilding its config, pydantic JSON schema included, which costs the
        server's event loop several times what re-sending them does. An unchanged
        value is an empty diff on the wire, and figures go as `plots.plot_data`, serialized once. The
        event loop shares the GIL with the scheduler's thread, so under load its time is decoding time.
        """
        if self._blank is None:
            busy = "Drawn every few seconds while several runs share the server, and when this run ends."
            self._blank = {"tree": plots.plot_data(plots.empty_figure(busy, 380)),
                           "charts": tuple(plots.plot_data(f([])) for f in (plots.accepted_length_figure,
                                                                             plots.depth_acceptance_figure,
                                                                             plots.throughput_figure))}
        return {"tree": self._blank["tree"], "slider": 0, "range": round_slider(None, 0), "info": "", "style": "",
                "nodes": node_table_html(None),
                "charts": self._blank["charts"], "sampler": None}

    def _updates(self, run: Run, ev: RoundEvent, text_html: str, tree: bool, charts: bool, sampler,
                 shown: dict, final: bool = False, live: bool = False) -> tuple:
        """One streamed update: what is due drawn anew, every other view re-sent as `shown` holds it.

        `live` (a paced run): the views show the run up to `ev`, whose later rounds wait their turn, and the
        tree is `ev`'s own round, not the newest that verified a tree."""
        stopped = run.stopped and ev.finished is None
        events = run.events[:ev.index + 1] if live else run.events
        stats = stats_markdown(summarize(events), stopped=stopped or run.done, drafter=drafter_name(events))
        if tree:
            if final:  # after the run: the round most worth a look, not simply the last one
                at = events[instructive_round(events)]
            elif live:
                at = ev
            else:  # live: the newest round that verified a tree (the last rounds can be plain)
                at = next((e for e in reversed(events) if e.nodes), ev)
            shown.update(tree=plots.plot_data(tree_figure(at)), slider=at.index, range=round_slider(run, at.index, len(events)),
                         info=round_markdown(at), style=highlight_css(at.index), nodes=node_table_html(at))
        if charts:
            shown["charts"] = tuple(plots.plot_data(f(events)) for f in (
                plots.accepted_length_figure, plots.depth_acceptance_figure, plots.throughput_figure))
        if sampler is not None:
            shown["sampler"] = plots.plot_data(sampler)
        slider = shown["slider"] if shown["range"] is None else shown["range"]  # a new range goes once
        shown["range"] = None
        views = (shown["tree"], slider, shown["info"], *shown["charts"],
                 gr.skip() if shown["sampler"] is None else shown["sampler"], shown["style"], shown["nodes"])
        return (text_html, stats, *views, self._json(run, ev, stopped, events if live else None))

    def token_click(self, session: Session, evt: gr.SelectData) -> tuple:
        """A click on a token (`evt.index` its round, `evt.value` its position): its round, and in the sampler
        view the law it was drawn from."""
        position = evt.value if isinstance(evt.value, int) and not isinstance(evt.value, bool) else -1
        return (*self.token_round(session, evt), self.token_law(session, position))

    def stop(self, session: Session) -> None:
        """Stop the session's running generations and races; each ends before its next round."""
        session.request_stop()

    def step(self, session: Session) -> None:
        """The step button: the tab's run, at the "step" pace, shows its next round."""
        session.step()

    def replace(self, session: Session) -> None:
        """A tab's Generate or Compare: the tab's unfinished run stops before the new one starts. Only the
        tab's own button sends it (a private event), so an API client's calls never stop each other."""
        session.replace()

    def clear(self, prompt, temperature, top_k, top_p, min_p, acceptance, chat, session: Session) -> tuple:
        """Forget the last run; the sampler view goes back to the position after the prompt."""
        session.clear()
        empty = tree_figure(None)
        try:
            sampler = self.sampler_view(prompt, temperature, top_k, top_p, min_p, acceptance, chat, session)
        except gr.Error:
            sampler = gr.skip()
        return ("", "", empty, round_slider(None, 0), "", plots.accepted_length_figure([]),
                plots.depth_acceptance_figure([]), plots.throughput_figure([]), sampler, "", node_table_html(None), None,
                COMPARE_HINT, "", "")
