"""UI pieces for the specdec Gradio app: pure plot builders, token rendering, session state, handlers.

Everything here reaches the model through the engine's narrow face (`Engine.info()`,
`Engine.sampler_rows()`, `Engine.stream()`, wrapped by gate.ModelGate, or gate.RemoteGate for a model
served by its own process) and reads plain values only.
"""
from .handlers import Handlers
from .draft_tree_figure import tree_figure
from .plots import accepted_length_figure, depth_acceptance_figure, empty_figure, sampler_figure, throughput_figure
from .session import Session, Settings
from .tokens import legend_html, render_round, render_tokens

__all__ = ["Handlers", "Session", "Settings", "tree_figure", "accepted_length_figure", "depth_acceptance_figure",
           "throughput_figure", "sampler_figure", "empty_figure", "render_round", "render_tokens", "legend_html"]
