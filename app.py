"""specdec demo: watch speculative decoding round by round (`python app.py`, then open http://127.0.0.1:7860).

Only wiring lives here: load the model once (with a prefix KV cache), lay
out the controls, and connect events to `components.Handlers`. Runs and
races go through one queue (`concurrency_id="model"`); the sampler view,
the round views and Stop never wait in it (the sampler view's forward
takes the handlers' model lock between two rounds). The same server answers `/metrics`
(Prometheus text format) for the app's one `Metrics`.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable, Iterable

import gradio as gr
import torch

import specdec
from components import Handlers, Session, Settings, legend_html, plots, serving
from components.handlers import COMPARE_HINT
from components.session import (ACCEPTANCE_CHOICES, LOOKUP_MAX, LOOKUP_MODE_CHOICES, MAX_NEW_TOKENS_MAX, SEED_MAX,
                                TEMPERATURE_MAX, TOP_K_MAX)
from specdec.metrics import Metrics
from specdec.prefix_cache import PrefixCache

STATIC = Path(__file__).resolve().parent / "assets" / "static"


def gpu(fn: Callable) -> Callable:
    """`spaces.GPU` on Hugging Face ZeroGPU Spaces; the function itself everywhere else."""
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(duration=120)(fn)


def resolve_heads(heads: str | None) -> str | None:
    """A heads folder, 'random', None, or a Hugging Face repo id ("owner/name"), downloaded on first use."""
    if heads is None or heads == "random" or os.path.isdir(heads) or heads.count("/") != 1 or heads.startswith("."):
        return heads
    return specdec.api.heads_folder(heads)  # the heads' own files only, never a bundled base model


def examples() -> list[str]:
    return json.loads((STATIC / "examples.json").read_text())


def launch_kwargs(metrics: Metrics | None = None) -> dict:
    """Theme and CSS (Gradio 6 takes them in `launch()`, not `Blocks()`), and with `metrics`, the
    `/metrics` route and request arrival stamps on the same server."""
    kwargs = {"css_paths": [STATIC / "app.css"], "theme": gr.themes.Soft(primary_hue="green")}
    if metrics is not None:
        kwargs["app_kwargs"] = serving.app_kwargs(metrics)
    return kwargs


def _model_line(loaded: specdec.Loaded) -> str:
    model = loaded.model
    params = sum(p.numel() for p in model.parameters()) / 1e6
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    heads = f"{loaded.heads.config.num_heads} Medusa heads" if loaded.heads is not None else "no draft heads"
    name = loaded.name or type(model).__name__
    cache = loaded.engine.prefix_cache
    cache = f" · prefix cache {cache.max_bytes / 2**20:.0f} MiB" if cache is not None else ""
    return f"model **{name}** ({params:.1f}M params, {dtype}, {loaded.device}) · {heads}{cache}"


HOW_TO_READ = """<details id="how-to-read" open><summary><b>How to read this</b> (five lines)</summary>
<ol class="sd-howto">
<li><b>The idea.</b> A big model writes one token per forward pass. Speculative decoding lets cheap drafters guess
several tokens ahead, then checks every guess in <i>one</i> forward of the big (target) model.</li>
<li><b>Drafters.</b> Medusa <b>heads</b> are small layers on the target's last hidden state: head <i>k</i> guesses
the token <i>k</i>+1 places ahead. <b>Prompt lookup</b> copies what followed the same words earlier in the text.</li>
<li><b>The tree.</b> The guesses form a tree (columns = how far ahead); tree attention lets one target forward score
every node at once.</li>
<li><b>Verification.</b> From the root, the target accepts a guess <i>x</i> with probability p(<i>x</i>) (the guess
is a point mass, so this keeps the output exactly the target's law); at the first rejection it samples a
<b>correction</b>, after a fully accepted path it adds a <b>bonus</b> token.</li>
<li><b>Colours.</b> Tree: green accepted, red rejected, grey not reached. Text: green tokens were drafted and accepted,
orange corrections and blue bonus tokens came from the target. Click a token to see its round.</li>
</ol></details>"""
# Fold the panel on later visits, and from the start on a phone (output first), with the settings.
HOW_TO_READ_JS = """const d = element.querySelector('details');
let seen = false;
try {  // storage can be blocked (a sandboxed iframe): then the panel simply starts open
  seen = !!localStorage.getItem('specdec-how-to-read-seen');
  localStorage.setItem('specdec-how-to-read-seen', '1');
} catch (e) {}
if (d && (seen || window.innerWidth < 700)) d.open = false;
if (window.innerWidth < 700) {  // a phone: the settings start folded, below the output
  let tries = 0;
  const fold = setInterval(() => {
    const open = document.querySelector('#settings > button.label-wrap.open');
    if (open) open.click();
    if (open || ++tries > 50) clearInterval(fold);
  }, 100);
}"""
# A click (or tap) on a token: show its details below the stream, and jump to its round.
TOKENS_JS = """element.addEventListener('click', (e) => {
  const t = e.target.closest('[data-round]');
  if (!t) return;
  const box = document.querySelector('#token-detail .sd-detail');
  if (box) box.textContent = (t.classList.contains('sd-tok') ? '“' + t.textContent + '” · ' : '') + (t.title || '');
  trigger('select', {index: Number(t.dataset.round), value: t.title || ''});
});"""
SCROLL_TO_RACE_JS = """(...args) => {
  setTimeout(() => document.getElementById('compare-box')?.scrollIntoView({block: 'start', behavior: 'smooth'}), 150);
  return args;
}"""

API = {
    "generate": "Generate text with speculative decoding and stream one update per round. Inputs: prompt (text); "
                "temperature 0-2 (0 = greedy); top_k 0-200 (0 = off); top_p (0, 1] (1 = off); min_p 0-1 (0 = off); "
                "max_new_tokens 1-512; seed (-1 = random); tree (a draft tree name); acceptance 'lossless', "
                "'greedy' or 'typical' (lossy); speculative (false = plain decoding); lookup 0-64 prompt-lookup "
                "tokens per round; lookup_mode 'first' or 'merge'; chat (wrap the prompt with the model's chat "
                "template). The last output is a JSON record of the round.",
    "compare": "Race speculative against plain decoding on the same prompt, settings and seed. Same inputs as "
               "/generate, less `speculative`. Returns the race table with the measured ratio and its "
               "explanation, then both texts as HTML.",
    "stop": "Stop this client's running generation or race within one round.",
    "set_sampling": "Retune temperature, top_k, top_p and min_p live (a running generation applies them from its "
                    "next round) and return the sampler view at the current position.",
    "round": "Show round `round` of the last run: its draft tree, narration and full event (clamped to the run).",
    "clear": "Forget the last run and clear the outputs.",
}


def build_demo(loaded: specdec.Loaded, *, max_prompt_tokens: int = 512, queue_size: int = 16,
               figure_interval: float = 1.0, text_interval: float = 0.1,
               on_round: Iterable[Callable[[specdec.RoundEvent], None]] = (),
               metrics: Metrics | None = None, replay_interval: float = 0.8) -> gr.Blocks:
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
    """
    h = Handlers(loaded, max_prompt_tokens=max_prompt_tokens, figure_interval=figure_interval,
                 text_interval=text_interval, on_round=on_round, metrics=metrics, replay_interval=replay_interval)
    # Without heads, speculation still runs on prompt lookup alone (Settings' default lookup is DEFAULT_LOOKUP).
    d = Settings(tree=h.default_tree)
    prompts = examples()
    with gr.Blocks(title="specdec: speculative decoding, visible") as demo:
        session = gr.State(Session(live=d), delete_callback=lambda s: s.clear())
        gr.Markdown("# specdec: speculative decoding, round by round\n"
                    "Cheap drafters guess several tokens; one forward of the model checks them all, and the text "
                    "stays exactly the model's. Watch each round's guesses, which ones were kept, and why.",
                    elem_id="title")
        gr.HTML(HOW_TO_READ, elem_id="how-to-read-box", js_on_load=HOW_TO_READ_JS)
        # Output first: on a phone the columns stack, and the prompt, buttons and tokens come before settings.
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=3, min_width=360, elem_id="output-col"):
                prompt = gr.Textbox(prompts[0], lines=3, label="Prompt", elem_id="prompt")
                with gr.Row(elem_id="buttons"):
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", min_width=80)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=60)
                    cmp_btn = gr.Button("Compare", elem_id="compare-btn", min_width=80)
                    clear_btn = gr.Button("Clear", elem_id="clear-btn", min_width=60)
                chat = gr.Checkbox(h.has_chat_template, interactive=h.has_chat_template, elem_id="chat",
                                   label="chat: wrap the prompt as a user turn (the model's chat template)"
                                   if h.has_chat_template else "chat (this model has no chat template)")
                with gr.Group(elem_id="compare-box"):
                    cmp_md = gr.Markdown(COMPARE_HINT, label="comparison", elem_id="compare-md")
                    with gr.Row(visible=False, elem_id="race") as race_row:
                        with gr.Column(min_width=160):
                            gr.Markdown("**speculative**", elem_classes=["sd-lane"])
                            cmp_spec = gr.HTML("", label="speculative", elem_id="cmp-spec")
                        with gr.Column(min_width=160):
                            gr.Markdown("**plain decoding** (baseline)", elem_classes=["sd-lane"])
                            cmp_base = gr.HTML("", label="baseline", elem_id="cmp-base")
                tokens = gr.HTML("", label="tokens", elem_id="tokens", autoscroll=True, js_on_load=TOKENS_JS)
                gr.HTML('<div class="sd-detail">Click or tap a token for its details.</div>', elem_id="token-detail")
                round_style = gr.HTML("", elem_id="round-style")  # outlines the shown round's tokens
                gr.HTML(legend_html(), elem_id="legend")
                stats = gr.Markdown("", label="stats", elem_id="stats")
                with gr.Row(elem_id="round-controls"):
                    replay_btn = gr.Button("▶ replay", elem_id="replay-btn", size="sm", min_width=70)
                    prev_btn = gr.Button("◀ round", elem_id="prev-round-btn", size="sm", min_width=70)
                    next_btn = gr.Button("round ▶", elem_id="next-round-btn", size="sm", min_width=70)
                    reject_btn = gr.Button("next rejection", elem_id="next-rejection-btn", size="sm", min_width=90)
                    longest_btn = gr.Button("longest accept", elem_id="longest-accept-btn", size="sm",
                                            min_width=90)
                round_slider = gr.Slider(0, 1, 0, step=1, precision=0, label="round",
                                         info="every round of the last run, also after Stop",
                                         elem_id="round-slider")
                round_info = gr.Markdown("", label="round info", elem_id="round-info")
                tree_plot = gr.Plot(plots.tree_figure(None), label="Draft tree of the round", elem_id="tree-plot")
            with gr.Column(scale=2, min_width=320, elem_id="side-col"):
                sampler_plot = gr.Plot(label="Sampler view", elem_id="sampler-plot")
                with gr.Accordion("Settings", open=True, elem_id="settings"):
                    with gr.Group():
                        temperature = gr.Slider(0, TEMPERATURE_MAX, d.temperature, step=0.05, label="temperature",
                                                info="0 = greedy; live: applies from the next round",
                                                elem_id="temperature")
                        top_k = gr.Slider(0, TOP_K_MAX, d.top_k, step=1, precision=0, label="top-k",
                                          info="0 = off", elem_id="top-k")
                        top_p = gr.Slider(0.01, 1.0, d.top_p, step=0.01, label="top-p", info="1 = off",
                                          elem_id="top-p")
                        min_p = gr.Slider(0.0, 1.0, d.min_p, step=0.01, label="min-p", info="0 = off",
                                          elem_id="min-p")
                        max_new = gr.Slider(1, MAX_NEW_TOKENS_MAX, d.max_new_tokens, step=1, precision=0,
                                            label="max new tokens", elem_id="max-new")
                        seed = gr.Number(d.seed, precision=0, minimum=-1, maximum=SEED_MAX,
                                         label="seed (-1 = random)", elem_id="seed")
                    with gr.Group():
                        speculative = gr.Checkbox(d.speculative, label="speculation (off = plain decoding baseline)",
                                                  elem_id="speculative")
                        tree = gr.Dropdown(h.tree_choices, value=d.tree, label="draft tree", elem_id="tree")
                        lookup = gr.Slider(0, LOOKUP_MAX, d.lookup, step=1, precision=0,
                                           label="prompt lookup tokens",
                                           info="drafted per round by copying what followed the last occurrence "
                                                "of the context's final n-gram; 0 = off", elem_id="lookup")
                        lookup_mode = gr.Radio(list(LOOKUP_MODE_CHOICES), value=d.lookup_mode,
                                               label="prompt lookup mode",
                                               info="first: when the context repeats, the lookup chain alone "
                                                    "drafts (the heads skip that round); merge: the chain joins "
                                                    "the heads' tree", elem_id="lookup-mode")
                        acceptance = gr.Radio(list(ACCEPTANCE_CHOICES), value=d.acceptance, label="acceptance rule",
                                              info="typical is lossy: its output no longer follows the target "
                                                   "model", elem_id="acceptance")
                gr.Examples([[p] for p in prompts], inputs=[prompt], cache_examples=False, label="Examples")
                gr.Markdown(_model_line(loaded), elem_id="model-line")
        with gr.Row():
            len_plot = gr.Plot(plots.accepted_length_figure([]), label="Accepted length", elem_id="len-plot")
            depth_plot = gr.Plot(plots.depth_acceptance_figure([]), label="Acceptance per depth",
                                 elem_id="depth-plot")
            tps_plot = gr.Plot(plots.throughput_figure([]), label="Throughput", elem_id="tps-plot")
        with gr.Accordion("Round event (JSON)", open=False):
            event_json = gr.JSON(label="latest round", elem_id="event-json")

        # New controls go at the end: the /generate API keeps its old positional order.
        controls = [prompt, temperature, top_k, top_p, min_p, max_new, seed, tree, acceptance, speculative, lookup,
                    lookup_mode, chat]
        cmp_controls = [c for c in controls if c is not speculative]  # a race always runs both
        gen_outputs = [tokens, stats, tree_plot, round_slider, round_info, len_plot, depth_plot, tps_plot,
                       sampler_plot, round_style, event_json]
        round_outputs = [tree_plot, round_info, event_json, round_slider, round_style]
        model_queue = dict(concurrency_id="model", concurrency_limit=1)
        # Views never wait for the model queue. They are queued on their own (errors come back as
        # toasts, not HTTP 500s) and take raw values (preprocess=False): our own checks name the
        # allowed range, and a round past the slider's current maximum is clamped, not refused.
        view_queue = dict(concurrency_id="views", concurrency_limit=None, preprocess=False)
        # The progress timer goes on the stats line only: one timer per streamed output costs the
        # browser a re-layout on every tick.
        gen = gen_btn.click(gpu(h.generate), controls + [session], gen_outputs, api_name="generate",
                            api_description=API["generate"], show_progress="minimal", show_progress_on=[stats],
                            preprocess=False, **model_queue)
        cmp_btn.click(lambda: gr.Row(visible=True), None, race_row, queue=False, api_visibility="private",
                      js=SCROLL_TO_RACE_JS)
        cmp = cmp_btn.click(gpu(h.compare), cmp_controls + [session], [cmp_md, cmp_spec, cmp_base],
                            api_name="compare", api_description=API["compare"], show_progress="minimal",
                            preprocess=False, **model_queue)
        replay = replay_btn.click(h.replay, [round_slider, session], round_outputs + [len_plot],
                                  api_visibility="private", show_progress="hidden", **view_queue)
        for btn in (gen_btn, cmp_btn, clear_btn):  # a new run or Clear ends a replay
            btn.click(None, None, None, cancels=[replay], queue=False, api_visibility="private")
        # Stop does not cancel the events: the run ends at its next round and sends a final update
        # with every round (a cancelled event would leave the views at the last throttled update).
        stop_btn.click(h.stop, [session], None, api_name="stop", api_description=API["stop"], queue=False,
                       cancels=[replay])
        sliders = [prompt, temperature, top_k, top_p, min_p, acceptance, chat, session]
        clear_btn.click(h.clear, sliders, gen_outputs + [cmp_md, cmp_spec, cmp_base], api_name="clear",
                        api_description=API["clear"], queue=False, cancels=[gen, cmp], preprocess=False)
        clear_btn.click(lambda: gr.Row(visible=False), None, race_row, queue=False, api_visibility="private")
        # Live settings + sampler view: a forward between two rounds of a running generation, cached per session.
        live = [temperature.change, top_k.change, top_p.change, min_p.change, acceptance.change, prompt.change,
                chat.change]
        gr.on(live, h.sampler_view, sliders, sampler_plot, api_name="set_sampling",
              api_description=API["set_sampling"], trigger_mode="always_last", show_progress="hidden",
              **view_queue)
        acceptance.change(h.temperature_control, acceptance, temperature, queue=False, api_visibility="private")
        demo.load(h.sampler_view, sliders, sampler_plot, api_visibility="private", show_progress="hidden",
                  **view_queue)
        round_slider.input(h.show_round, [round_slider, session], round_outputs, api_name="round",
                           api_description=API["round"], trigger_mode="always_last", show_progress="hidden",
                           **view_queue)
        prev_btn.click(lambda i, s: h.step_round(i, s, -1), [round_slider, session], round_outputs,
                       api_visibility="private", show_progress="hidden", **view_queue)
        next_btn.click(lambda i, s: h.step_round(i, s, 1), [round_slider, session], round_outputs,
                       api_visibility="private", show_progress="hidden", **view_queue)
        reject_btn.click(h.jump_rejection, [round_slider, session], round_outputs, api_visibility="private",
                         show_progress="hidden", **view_queue)
        longest_btn.click(h.jump_longest, [session], round_outputs, api_visibility="private",
                          show_progress="hidden", **view_queue)
        tokens.select(h.token_round, [session], round_outputs, api_visibility="private", show_progress="hidden",
                      **view_queue)
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    return demo


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.environ.get("SPECDEC_MODEL"),
                   help="hub id or local path (default: $SPECDEC_MODEL, else the embedded model)")
    p.add_argument("--heads", default=os.environ.get("SPECDEC_HEADS"),
                   help="heads folder, hub repo id or 'random' (default: $SPECDEC_HEADS, else the embedded heads)")
    # Spaces set GRADIO_SERVER_NAME/PORT; locally we serve on 127.0.0.1:7860.
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--queue-size", type=int, default=16)
    p.add_argument("--prefix-cache-mb", type=float, default=256.0,
                   help="memory budget of the prefix KV cache (LRU), in MiB (default: 256)")
    p.add_argument("--no-prefix-cache", action="store_true", help="prefill every prompt from scratch")
    args = p.parse_args(argv)
    if args.max_prompt_tokens < 1:
        p.error(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    if args.queue_size < 1:
        p.error(f"--queue-size must be >= 1, got {args.queue_size}")
    if args.prefix_cache_mb <= 0:
        p.error(f"--prefix-cache-mb must be > 0, got {args.prefix_cache_mb} (use --no-prefix-cache to switch it off)")
    return args


def prefix_cache(args: argparse.Namespace) -> PrefixCache | None:
    return None if args.no_prefix_cache else PrefixCache(max_bytes=int(args.prefix_cache_mb * 2**20))


def main(argv=None) -> None:
    args = parse_args(argv)
    loaded = specdec.load(args.model, heads=resolve_heads(args.heads), device=args.device, dtype=args.dtype,
                          prefix_cache=prefix_cache(args))
    if loaded.device.type == "cuda":
        # cuDNN attention builds a plan for every new (query, cache) length: measured on an H200,
        # it made a user's first 128-token run 10.3 s instead of 4.0 s. The other SDPA kernels don't.
        torch.backends.cuda.enable_cudnn_sdp(False)
    metrics = Metrics()  # one registry per app; served at /metrics
    demo = build_demo(loaded, max_prompt_tokens=args.max_prompt_tokens, queue_size=args.queue_size, metrics=metrics)
    demo.launch(server_name=args.host, server_port=args.port, **launch_kwargs(metrics))


if __name__ == "__main__":
    main()
