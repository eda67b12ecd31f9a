"""Blocks of the page that are only layout: each builds its components inside the open `gr.Blocks`
and returns them by name, so app.py can wire events without building every widget itself."""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from . import plots
from .compare import COMPARE_HINT
from .node_table import node_table_html
from .pace import PACE_CHOICES
from .texts import HOW_TO_READ, HOW_TO_READ_JS, TOKENS_JS
from .tokens import legend_html
from .session import (ACCEPTANCE_CHOICES, LOOKUP_MAX, LOOKUP_MODE_CHOICES, MAX_NEW_TOKENS_MAX, SEED_MAX,
                      TEMPERATURE_MAX, TOP_K_MAX, Settings)


def header() -> None:
    """The title, one line on the idea, and the five-line "how to read this" panel."""
    gr.Markdown("# specdec: speculative decoding, round by round\n"
                "Cheap drafters guess several tokens; one forward of the model checks them all, and the text "
                "stays exactly the model's. Watch each round's guesses, which ones were kept, and why.",
                elem_id="title")
    gr.HTML(HOW_TO_READ, elem_id="how-to-read-box", js_on_load=HOW_TO_READ_JS)


def token_panel() -> tuple[gr.HTML, gr.HTML]:
    """The streamed tokens (a click shows a token's details and round), and the style that outlines a round."""
    tokens = gr.HTML("", label="Output", show_label=True, container=True, elem_id="tokens", autoscroll=True, js_on_load=TOKENS_JS)
    gr.HTML('<div class="sd-detail">Click or tap a token for its details.</div>', elem_id="token-detail")
    round_style = gr.HTML("", elem_id="round-style")  # outlines the shown round's tokens
    gr.HTML(legend_html(), elem_id="legend")
    return tokens, round_style


def compare_box() -> SimpleNamespace:
    """The race: its Markdown (table, ratio, why) and two lanes, hidden until Compare is pressed."""
    with gr.Column(elem_id="compare-box"):  # a Column: Gradio gives a Group's id to two nested elements
        md = gr.Markdown(COMPARE_HINT, label="comparison", elem_id="compare-md")
        with gr.Row(visible=False, elem_id="race") as row:
            with gr.Column(min_width=160):
                gr.Markdown("**speculative**", elem_classes=["sd-lane"])
                spec = gr.HTML("", label="speculative", elem_id="cmp-spec")
            with gr.Column(min_width=160):
                gr.Markdown("**plain decoding** (baseline)", elem_classes=["sd-lane"])
                base = gr.HTML("", label="baseline", elem_id="cmp-base")
    return SimpleNamespace(md=md, row=row, spec=spec, base=base)


def pace_controls() -> SimpleNamespace:
    """The pace a run's rounds are shown at, and the step button (one more round per click at "step")."""
    with gr.Row(elem_id="pace-row"):
        # No value in the page's config: an API call that sends no pace runs "fast"; the page sets its own on load.
        pace = gr.Dropdown(list(PACE_CHOICES), value=None, label="pace (rounds shown per second)",
                           info="slows what you see, not the model: the engine's timings stay its own",
                           elem_id="pace", min_width=160, scale=3)
        step = gr.Button("step ▸", elem_id="step-btn", size="sm", min_width=70, scale=1)
    return SimpleNamespace(pace=pace, step=step)


def round_controls() -> SimpleNamespace:
    """Buttons and slider that move through the last run's rounds, and the round's narration."""
    with gr.Row(elem_id="round-controls"):
        replay = gr.Button("▶ replay", elem_id="replay-btn", size="sm", min_width=70)
        replay_here = gr.Button("▶ from here", elem_id="replay-here-btn", size="sm", min_width=70)
        prev = gr.Button("◀ round", elem_id="prev-round-btn", size="sm", min_width=70)
        nxt = gr.Button("round ▶", elem_id="next-round-btn", size="sm", min_width=70)
        reject = gr.Button("next rejection", elem_id="next-rejection-btn", size="sm", min_width=90)
        longest = gr.Button("longest accept", elem_id="longest-accept-btn", size="sm", min_width=90)
    slider = gr.Slider(0, 1, 0, step=1, precision=0, label="round", info="every round of the last run, also after Stop",
                       elem_id="round-slider")
    info = gr.Markdown("", label="round info", elem_id="round-info")
    return SimpleNamespace(replay=replay, replay_here=replay_here, prev=prev, next=nxt, reject=reject, longest=longest, slider=slider,
                           info=info)


def live_panel(d: Settings) -> SimpleNamespace:
    """The sampler sliders, live: a running generation reads them each round. Under the output on a wide screen;
    on a phone they float at the foot of the screen (app.css), within reach of the output while a run streams."""
    with gr.Accordion("Sampler sliders (live)", open=True, elem_id="live-panel"):
        with gr.Group():
            temperature = gr.Slider(0, TEMPERATURE_MAX, d.temperature, step=0.05, label="temperature",
                                    info="0 = greedy; live: applies from the next round", elem_id="temperature")
            top_k = gr.Slider(0, TOP_K_MAX, d.top_k, step=1, precision=0, label="top-k", info="0 = off",
                              elem_id="top-k")
            top_p = gr.Slider(0.01, 1.0, d.top_p, step=0.01, label="top-p", info="1 = off", elem_id="top-p")
            min_p = gr.Slider(0.0, 1.0, d.min_p, step=0.01, label="min-p", info="0 = off", elem_id="min-p")
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def settings_panel(d: Settings, tree_choices: list[tuple[str, str]], live: SimpleNamespace | None = None
                   ) -> SimpleNamespace:
    """The settings accordion: how long, which seed, how to draft and verify (per run); returned with the live
    sliders (`live`, or a `live_panel` built here first)."""
    live = live_panel(d) if live is None else live
    with gr.Accordion("Settings", open=True, elem_id="settings"):
        with gr.Group():
            max_new = gr.Slider(1, MAX_NEW_TOKENS_MAX, d.max_new_tokens, step=1, precision=0, label="max new tokens",
                                elem_id="max-new")
            seed = gr.Number(d.seed, precision=0, minimum=-1, maximum=SEED_MAX, label="seed (-1 = random)",
                             elem_id="seed")
        with gr.Group():
            speculative = gr.Checkbox(d.speculative, label="speculation (off = plain decoding baseline)",
                                      elem_id="speculative")
            tree = gr.Dropdown(tree_choices, value=d.tree, label="drafter and tree", elem_id="tree")
            versus = gr.Dropdown([("plain decoding (the baseline)", "plain")] + tree_choices, value="plain",
                                 label="Compare races against", elem_id="versus",
                                 info="plain decoding, or another drafter and tree (same prompt, settings and seed)")
            lookup = gr.Slider(0, LOOKUP_MAX, d.lookup, step=1, precision=0, label="prompt lookup tokens",
                               info="drafted per round by copying what followed the last occurrence "
                                    "of the context's final n-gram; 0 = off", elem_id="lookup")
            lookup_mode = gr.Radio(list(LOOKUP_MODE_CHOICES), value=d.lookup_mode, label="prompt lookup mode",
                                   info="first: when the context repeats, the lookup chain alone drafts (the heads "
                                        "skip that round); merge: the chain joins the heads' tree",
                                   elem_id="lookup-mode")
            acceptance = gr.Radio(list(ACCEPTANCE_CHOICES), value=d.acceptance, label="acceptance rule",
                                  info="typical is lossy: its output no longer follows the target model",
                                  elem_id="acceptance")
    return SimpleNamespace(**vars(live), max_new=max_new, seed=seed, speculative=speculative, tree=tree, lookup=lookup, lookup_mode=lookup_mode,
                           acceptance=acceptance, versus=versus)


def node_table() -> gr.HTML:
    """The shown round's nodes with q, p and the verdict (no hover needed: a phone has none)."""
    return gr.HTML(node_table_html(None), label="nodes of the round", elem_id="round-nodes")


def charts_row() -> tuple[gr.Plot, gr.Plot, gr.Plot]:
    """Accepted length, acceptance per depth and throughput, over the run."""
    with gr.Row():
        return (gr.Plot(plots.accepted_length_figure([]), label="Accepted length", elem_id="len-plot"),
                gr.Plot(plots.depth_acceptance_figure([]), label="Acceptance per depth", elem_id="depth-plot"),
                gr.Plot(plots.throughput_figure([]), label="Throughput", elem_id="tps-plot"))
