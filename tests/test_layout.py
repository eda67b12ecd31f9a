"""components/layout.py: each block builds its components, with the element ids the page and tests rely on."""
from __future__ import annotations

import gradio as gr

from components import layout
from components.session import ACCEPTANCE_CHOICES, Settings


def ids(demo: gr.Blocks) -> set[str]:
    return {b.elem_id for b in demo.blocks.values() if getattr(b, "elem_id", None)}


def test_blocks_build_inside_a_page():
    with gr.Blocks() as demo:
        layout.header()
        tokens, style = layout.token_panel()
        race = layout.compare_box()
        rounds = layout.round_controls()
        c = layout.settings_panel(Settings(tree="small"), [("small (16 nodes, preset)", "small")])
        charts = layout.charts_row()
    assert {"title", "how-to-read-box", "tokens", "legend", "compare-md", "race", "round-slider", "settings", "live-panel",
            "temperature", "tree", "acceptance", "len-plot", "depth-plot", "tps-plot"} <= ids(demo)
    assert race.row.visible is False and rounds.slider.maximum == 1 and len(charts) == 3
    assert c.tree.value == "small" and c.acceptance.choices == [(label, v) for label, v in ACCEPTANCE_CHOICES]
    assert tokens.elem_id == "tokens" and style.elem_id == "round-style"
