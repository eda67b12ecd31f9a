"""specdec demo: watch speculative decoding round by round (`python app.py`, then open http://127.0.0.1:7860).

Only wiring lives here: load the model once (with a prefix KV cache), lay
out the controls, and connect events to `components.Handlers`. Model work
runs in one queue (`concurrency_id="model"`); the sampler view, the round
slider and Stop never wait in it. The same server answers `/metrics`
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
    from huggingface_hub import snapshot_download  # only needed on a Space pointing at hub heads

    return snapshot_download(repo_id=heads)


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


def build_demo(loaded: specdec.Loaded, *, max_prompt_tokens: int = 512, queue_size: int = 16,
               figure_interval: float = 1.0, text_interval: float = 0.1,
               on_round: Iterable[Callable[[specdec.RoundEvent], None]] = (),
               metrics: Metrics | None = None) -> gr.Blocks:
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
    """
    h = Handlers(loaded, max_prompt_tokens=max_prompt_tokens, figure_interval=figure_interval,
                 text_interval=text_interval, on_round=on_round, metrics=metrics)
    # Without heads, speculation still runs on prompt lookup alone (Settings' default lookup is DEFAULT_LOOKUP).
    d = Settings(tree=h.default_tree)
    prompts = examples()
    with gr.Blocks(title="specdec: speculative decoding, visible") as demo:
        session = gr.State(Session(live=d), delete_callback=lambda s: s.clear())
        gr.Markdown("# specdec: speculative decoding, round by round\n"
                    "Medusa heads and prompt lookup draft a tree of guesses; one target forward verifies it. "
                    + _model_line(loaded), elem_id="title")
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                prompt = gr.Textbox(prompts[0], lines=4, label="Prompt", elem_id="prompt")
                gr.Examples([[p] for p in prompts], inputs=[prompt], cache_examples=False, label="Examples")
                with gr.Row():
                    gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    cmp_btn = gr.Button("Compare", elem_id="compare-btn")
                    clear_btn = gr.Button("Clear", elem_id="clear-btn")
                with gr.Group():
                    temperature = gr.Slider(0, TEMPERATURE_MAX, d.temperature, step=0.05, label="temperature",
                                            info="0 = greedy; live: applies from the next round",
                                            elem_id="temperature")
                    top_k = gr.Slider(0, TOP_K_MAX, d.top_k, step=1, label="top-k", info="0 = off", elem_id="top-k")
                    top_p = gr.Slider(0.01, 1.0, d.top_p, step=0.01, label="top-p", info="1 = off", elem_id="top-p")
                    min_p = gr.Slider(0.0, 1.0, d.min_p, step=0.01, label="min-p", info="0 = off", elem_id="min-p")
                    max_new = gr.Slider(1, MAX_NEW_TOKENS_MAX, d.max_new_tokens, step=1, label="max new tokens",
                                        elem_id="max-new")
                    seed = gr.Number(d.seed, precision=0, minimum=-1, maximum=SEED_MAX, label="seed (-1 = random)",
                                     elem_id="seed")
                with gr.Group():
                    speculative = gr.Checkbox(d.speculative, label="speculation (off = plain decoding baseline)",
                                              elem_id="speculative")
                    tree = gr.Dropdown(h.tree_choices, value=d.tree, label="draft tree", elem_id="tree")
                    lookup = gr.Slider(0, LOOKUP_MAX, d.lookup, step=1, label="prompt lookup tokens",
                                       info="drafted per round by copying what followed the last occurrence of "
                                            "the context's final n-gram; 0 = off", elem_id="lookup")
                    lookup_mode = gr.Radio(list(LOOKUP_MODE_CHOICES), value=d.lookup_mode, label="prompt lookup mode",
                                           info="first: when the context repeats, the lookup chain alone drafts "
                                                "(the heads skip that round); merge: the chain joins the heads' tree",
                                           elem_id="lookup-mode")
                    acceptance = gr.Radio(list(ACCEPTANCE_CHOICES), value=d.acceptance, label="acceptance rule",
                                          info="typical is lossy: its output no longer follows the target model",
                                          elem_id="acceptance")
                sampler_plot = gr.Plot(label="Sampler view", elem_id="sampler-plot")
            with gr.Column(scale=3, min_width=420):
                gr.HTML(legend_html(), elem_id="legend")
                tokens = gr.HTML("", label="tokens", elem_id="tokens", autoscroll=True, max_height=380)
                stats = gr.Markdown("", label="stats", elem_id="stats")
                tree_plot = gr.Plot(plots.tree_figure(None), label="Draft tree of the round", elem_id="tree-plot")
                round_slider = gr.Slider(0, 1, 0, step=1, label="round", info="step back through the last run",
                                         elem_id="round-slider")
                round_info = gr.Markdown("", label="round info", elem_id="round-info")
        with gr.Row():
            len_plot = gr.Plot(plots.accepted_length_figure([]), label="Accepted length", elem_id="len-plot")
            depth_plot = gr.Plot(plots.depth_acceptance_figure([]), label="Acceptance per depth",
                                 elem_id="depth-plot")
            tps_plot = gr.Plot(plots.throughput_figure([]), label="Throughput", elem_id="tps-plot")
        with gr.Accordion("Compare with plain decoding", open=False, elem_id="compare-box"):
            cmp_md = gr.Markdown("Press **Compare** to run the same prompt and settings with and without "
                                 "speculation.", label="comparison", elem_id="compare-md")
            with gr.Row():
                with gr.Column():
                    gr.Markdown("**speculative**")
                    cmp_spec = gr.HTML("", label="speculative", elem_id="cmp-spec")
                with gr.Column():
                    gr.Markdown("**baseline** (plain decoding)")
                    cmp_base = gr.HTML("", label="baseline", elem_id="cmp-base")
        with gr.Accordion("Round event (JSON)", open=False):
            event_json = gr.JSON(label="latest round", elem_id="event-json")

        # New controls go at the end: the /generate and /compare API keep their old positional order.
        controls = [prompt, temperature, top_k, top_p, min_p, max_new, seed, tree, acceptance, speculative, lookup,
                    lookup_mode]
        gen_outputs = [tokens, stats, tree_plot, round_slider, round_info, len_plot, depth_plot, tps_plot,
                       sampler_plot, event_json]
        model_queue = dict(concurrency_id="model", concurrency_limit=1)
        # The progress timer goes on the stats line only: one timer per streamed output costs the
        # browser a re-layout on every tick.
        gen = gen_btn.click(gpu(h.generate), controls + [session], gen_outputs, api_name="generate",
                            show_progress="minimal", show_progress_on=[stats], **model_queue)
        cmp = cmp_btn.click(gpu(h.compare), controls + [session], [cmp_md, cmp_spec, cmp_base],
                            api_name="compare", show_progress="minimal", **model_queue)
        stop_btn.click(h.stop, [session], None, api_name="stop", queue=False, cancels=[gen, cmp])
        clear_btn.click(h.clear, [session], gen_outputs + [cmp_md, cmp_spec, cmp_base], api_name="clear",
                        queue=False, cancels=[gen, cmp])
        # Live settings + sampler view: no model queue (a tiny forward under a lock, cached per session).
        live = [temperature.change, top_k.change, top_p.change, min_p.change, acceptance.change, prompt.change]
        gr.on(live, h.sampler_view, [prompt, temperature, top_k, top_p, min_p, acceptance, session],
              sampler_plot, api_name="set_sampling", queue=False, trigger_mode="always_last",
              show_progress="hidden")
        demo.load(h.sampler_view, [prompt, temperature, top_k, top_p, min_p, acceptance, session], sampler_plot,
                  api_visibility="private", queue=False, show_progress="hidden")
        round_slider.input(h.show_round, [round_slider, session], [tree_plot, round_info, event_json],
                           api_name="round", queue=False, trigger_mode="always_last", show_progress="hidden")
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
