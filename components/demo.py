"""specdec demo: watch speculative decoding round by round (`specdec app` or `python app.py`, then open
http://127.0.0.1:7860).

Only wiring lives here: load the model once (with a prefix KV cache; on a
CPU in its own process, `specdec.engine_process`, so Gradio's Python does not
share a GIL with the rounds), lay out the controls, and connect events to
`components.Handlers`. Runs and races go through one queue
(`concurrency_id="model"`); the sampler view, the round views and Stop never
wait in it (the sampler view's forward runs on the scheduler's thread between
two rounds). The same server answers `/metrics`
(Prometheus text format) for the app's one `Metrics`.
"""
from __future__ import annotations

import json
from typing import Callable, Iterable

import gradio as gr

import specdec
from . import Handlers, Session, layout, serving
from .app_args import parse_args, prefix_cache_bytes
from .draft_tree_figure import tree_figure
from .pace import UI_PACE
from .texts import API, CLEAR_DETAIL_JS, SCROLL_TO_RACE_JS
from specdec.failure import FaultHook
from specdec import engine_process
from specdec.metrics import Metrics

STATIC = specdec.api.ASSETS / "static"  # assets/static in a checkout, specdec/assets/static in a wheel


def gpu(fn: Callable) -> Callable:
    """`spaces.GPU` on Hugging Face ZeroGPU Spaces; the function itself everywhere else."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=120)(fn)


def examples() -> list[str]:
    return json.loads((STATIC / "examples.json").read_text())


def launch_kwargs(metrics: Metrics | None = None) -> dict:
    """Theme and CSS (Gradio 6 takes them in `launch()`, not `Blocks()`), and with `metrics`, the
    `/metrics` route and request arrival stamps on the same server."""
    kwargs = {"css_paths": [STATIC / "app.css"], "theme": gr.themes.Soft(primary_hue="green")}
    if metrics is not None:
        kwargs["app_kwargs"] = serving.app_kwargs(metrics)
    return kwargs


def build_demo(loaded: specdec.Loaded, *, max_prompt_tokens: int = 512, queue_size: int = 16,
               figure_interval: float = 1.0, text_interval: float = 0.1,
               on_round: Iterable[Callable[[specdec.RoundEvent], None]] = (),
               metrics: Metrics | None = None, replay_interval: float = 0.8,
               fault_hook: FaultHook | None = None) -> gr.Blocks:
    """The whole app over one loaded model.

    Args:
        loaded: from `specdec.load`.
        max_prompt_tokens: longer prompts are refused with an error.
        queue_size: bound of the queue (`demo.queue(max_size=...)`).
        figure_interval: minimum seconds between two tree updates while streaming (charts: 4x that).
        text_interval: minimum seconds between two streamed updates; faster rounds are batched.
        on_round: extra callbacks that receive every RoundEvent of every Generate run.
        metrics: the app's Prometheus metrics, fed by Generate requests and their rounds; serve them
            with `demo.launch(**launch_kwargs(metrics))`. None: no metrics.
        replay_interval: seconds per round when ▶ replays a run.
        fault_hook: testing only: handed to the scheduler (see bench/chaos.py).

    Every model call goes through `loaded.scheduler`, started here with `metrics` (batch sizes, the
    wait for a batch slot, failures by cause) unless it is already running.
    """
    if not loaded.serving:
        loaded.serve(metrics=metrics, fault_hook=fault_hook)
    h = Handlers(loaded, max_prompt_tokens=max_prompt_tokens, figure_interval=figure_interval,
                 text_interval=text_interval, on_round=on_round, metrics=metrics, replay_interval=replay_interval)
    # Without heads, speculation still runs on prompt lookup alone (Settings' default lookup is DEFAULT_LOOKUP).
    d = h.page_defaults()
    prompts = examples()
    with gr.Blocks(title="specdec: speculative decoding, visible") as demo:
        session = gr.State(Session(live=d), delete_callback=lambda s: s.clear())
        layout.header()
        # A wide screen shows the output beside the round it is watching (narration, tree, nodes) above the fold.
        # On a phone the columns stack: the prompt, buttons and tokens come first, then the round, then settings.
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=5, min_width=360, elem_id="output-col"):
                prompt = gr.Textbox(prompts[0], lines=3, label="Prompt", elem_id="prompt")
                with gr.Row(elem_id="buttons"):
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", min_width=80)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60)
                    cmp_btn = gr.Button("Compare", elem_id="compare-btn", min_width=80)
                    clear_btn = gr.Button("Clear", elem_id="clear-btn", min_width=60)
                chat = gr.Checkbox(h.has_chat_template, interactive=h.has_chat_template, elem_id="chat",
                                   label="chat: wrap the prompt as a user turn (the model's chat template)"
                                   if h.has_chat_template else "chat (this model has no chat template)")
                pacing = layout.pace_controls()
                tokens, round_style = layout.token_panel()
                stats = gr.Markdown("", label="stats", elem_id="stats")
                live = layout.live_panel(d)
                race = layout.compare_box()  # below the run's views: the output is not Compare's
            with gr.Column(scale=4, min_width=320, elem_id="side-col"):
                rounds = layout.round_controls()
                tree_plot = gr.Plot(tree_figure(None), label="Draft tree of the round", elem_id="tree-plot")
                nodes = layout.node_table()
                sampler_plot = gr.Plot(label="Sampler view", elem_id="sampler-plot")
                c = layout.settings_panel(d, h.tree_choices, live)
                gr.Examples([[p] for p in prompts], inputs=[prompt], cache_examples=False, label="Examples")
                gr.Markdown(h.model_line, elem_id="model-line")
        len_plot, depth_plot, tps_plot = layout.charts_row()
        with gr.Accordion("Round event (JSON)", open=False):
            event_json = gr.JSON(label="latest round", elem_id="event-json")

        # New controls go at the end: the /generate API keeps its old positional order.
        controls = [prompt, c.temperature, c.top_k, c.top_p, c.min_p, c.max_new, c.seed, c.tree, c.acceptance,
                    c.speculative, c.lookup, c.lookup_mode, chat]
        cmp_controls = [x for x in controls if x is not c.speculative]  # a race always runs both
        gen_outputs = [tokens, stats, tree_plot, rounds.slider, rounds.info, len_plot, depth_plot, tps_plot,
                       sampler_plot, round_style, nodes, event_json]
        round_outputs = [tree_plot, rounds.info, event_json, rounds.slider, round_style, nodes]
        # Runs wait in Gradio's queue for one of the scheduler's batch slots; the scheduler decodes
        # up to `max_batch_size` of them together (1: one run at a time).
        model_queue = dict(concurrency_id="model", concurrency_limit=loaded.max_batch_size)
        # Views never wait for the model queue. They are queued on their own (errors come back as
        # toasts, not HTTP 500s) and take raw values (preprocess=False): our own checks name the
        # allowed range, and a round past the slider's current maximum is clamped, not refused.
        view_queue = dict(concurrency_id="views", concurrency_limit=None, preprocess=False)
        # The progress timer goes on the stats line only: one timer per streamed output costs the
        # browser a re-layout on every tick.
        # A tab's Generate or Compare replaces the tab's unfinished run: the button's first event (private,
        # so no API call sends it) stops that run, and the new run starts after it. Calls through the API
        # never stop one another: each runs to its end, its client's Stop, or its client's disconnect.
        # `trigger_mode="multiple"`: the chained run starts while the replaced one is still winding down.
        new_run = dict(queue=False, api_visibility="private", show_progress="hidden")
        # The page's Generate sends its pace; the API's /generate keeps its inputs (a raw call with them all is
        # served) and streams at the engine's speed.
        run_kw = dict(show_progress="minimal", show_progress_on=[stats], preprocess=False, **model_queue)
        gen = gen_btn.click(h.replace, [session], None, **new_run).then(
            gpu(h.generate_paced), controls + [pacing.pace, session], gen_outputs, api_visibility="private",
            trigger_mode="multiple", **run_kw)
        api_gen = gr.Button(visible=False, elem_id="generate-api").click(
            gpu(h.generate), controls + [session], gen_outputs, api_name="generate", api_description=API["generate"],
            **run_kw)
        fresh = [race.md, race.spec, race.base, rounds.info, rounds.slider]
        for btn in (gen_btn, cmp_btn, clear_btn):
            btn.click(lambda: tuple(gr.skip() for _ in fresh), None, fresh, queue=False, api_visibility="private",
                      show_progress="hidden", js=CLEAR_DETAIL_JS)
        pacing.step.click(h.step, [session], None, queue=False, api_visibility="private")
        demo.load(None, None, pacing.pace, js=f"() => {UI_PACE!r}")  # the page's pace; the API's stays "fast"
        cmp_btn.click(lambda: gr.Row(visible=True), None, race.row, queue=False, api_visibility="private",
                      js=SCROLL_TO_RACE_JS)
        cmp = cmp_btn.click(h.replace, [session], None, **new_run).then(
            gpu(h.compare), cmp_controls + [c.versus, session], [race.md, race.spec, race.base], api_name="compare",
            api_description=API["compare"], show_progress="minimal", preprocess=False, trigger_mode="multiple",
            **model_queue)
        replays = [btn.click(fn, [rounds.slider, session], round_outputs + [len_plot], api_visibility="private",
                             show_progress="hidden", **view_queue)
                   for btn, fn in ((rounds.replay, h.replay), (rounds.replay_here, h.replay_from_here))]
        for btn in (gen_btn, cmp_btn, clear_btn):  # a new run or Clear ends a replay
            btn.click(None, None, None, cancels=replays, queue=False, api_visibility="private")
        # Stop does not cancel the events: the run ends at its next round and sends a final update
        # with every round (a cancelled event would leave the views at the last throttled update).
        stop_btn.click(h.stop, [session], None, api_name="stop", api_description=API["stop"], queue=False,
                       cancels=replays)
        sliders = [prompt, c.temperature, c.top_k, c.top_p, c.min_p, c.acceptance, chat, session]
        clear_btn.click(h.clear, sliders, gen_outputs + [race.md, race.spec, race.base], api_name="clear",
                        api_description=API["clear"], queue=False, cancels=[gen, api_gen, cmp], preprocess=False)
        clear_btn.click(lambda: gr.Row(visible=False), None, race.row, queue=False, api_visibility="private")
        # Live settings + sampler view: a forward between two rounds of a running generation, cached per session.
        live = [c.temperature.change, c.top_k.change, c.top_p.change, c.min_p.change, c.acceptance.change,
                prompt.change, chat.change]
        live_sliders = [c.temperature, c.top_k, c.top_p, c.min_p]
        gr.on(live, h.sampler_view, sliders, sampler_plot, api_name="set_sampling",
              api_description=API["set_sampling"], trigger_mode="always_last", show_progress="hidden",
              **view_queue).failure(  # a refused value (a toast): each box shows the value in use again
            h.live_values, [session], live_sliders, api_visibility="private", show_progress="hidden", queue=False)
        c.max_new.change(h.check_max_new, c.max_new, c.max_new, api_visibility="private", show_progress="hidden",
                         **view_queue)
        c.acceptance.change(h.temperature_control, c.acceptance, c.temperature, queue=False, api_visibility="private")
        hidden = dict(api_visibility="private", show_progress="hidden", **view_queue)  # the UI's own view events
        demo.load(h.sampler_view, sliders, sampler_plot, **hidden)
        at = [rounds.slider, session]
        rounds.slider.input(h.show_round_api, at, round_outputs[:-1], api_name="round", api_description=API["round"],
                            trigger_mode="always_last", show_progress="hidden", **view_queue).then(
            h.round_nodes, at, nodes, **hidden)
        rounds.prev.click(lambda i, s: h.step_round(i, s, -1), at, round_outputs, **hidden)
        rounds.next.click(lambda i, s: h.step_round(i, s, 1), at, round_outputs, **hidden)
        rounds.reject.click(h.jump_rejection, at, round_outputs, **hidden)
        rounds.longest.click(h.jump_longest, [session], round_outputs, **hidden)
        tokens.select(h.token_click, [session], round_outputs + [sampler_plot], **hidden)
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    return demo


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        loaded, remote, line = engine_process.serving_model(
            args.engine_process, args.threads, prefix_cache_bytes(args), model=args.model, heads=args.heads,
            device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size)
    except ValueError as e:  # a model or heads specdec refuses, with the reason: a message, not a traceback
        raise SystemExit(f"error: {e}") from None
    print(f"engine: {'its own process' if remote else 'in the server process'}" + (f"; {line}" if line else ""),
          flush=True)
    metrics = Metrics()  # one registry per app; served at /metrics
    demo = build_demo(loaded, max_prompt_tokens=args.max_prompt_tokens, queue_size=args.queue_size, metrics=metrics,
                      fault_hook=_chaos(args.chaos))
    if not remote:  # (the engine's process measures it as its scheduler starts)
        # The dynamic tree's cost model is measured on first use (about a second on a CPU): measure it now, on
        # the scheduler's thread, while the server starts, not in the first visitor's first request.
        loaded.scheduler.call_soon(loaded.engine.cost_model)
    demo.launch(server_name=args.host, server_port=args.port, **launch_kwargs(metrics))


def _chaos(fraction: float):
    """The `--chaos` fault hook (testing only: bench/chaos.py, in a checkout), or None."""
    if not fraction:
        return None
    from bench.chaos import chaos

    return chaos(fraction)
