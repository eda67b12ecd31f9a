"""Small pieces every streaming handler shares: pacing, the prompt span, and user errors as toasts."""
from __future__ import annotations

import html
import time
from typing import Callable

import gradio as gr


class Throttle:
    """True at most once per `interval` x `scale()` seconds.

    `scale` shares the server's update budget among concurrent runs: with n runs streaming at once,
    each updates n times less often, so the server renders about as much as for one run. Without it
    the rendering (Plotly figures are pure Python, under the GIL) grows with every run the scheduler
    adds to a batch, and eats the time batching saves.

    The first call is True when `scale()` is 1, or always with `first=True`: the first token is
    worth its update at any load (time to first token), a figure is not.
    """

    def __init__(self, interval: float, scale: Callable[[], float] | None = None, first: bool = False) -> None:
        self.interval = interval
        self.scale = scale or (lambda: 1.0)
        self.last = float("-inf") if first or self.scale() <= 1 else time.monotonic()

    def __call__(self, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self.last >= self.interval * self.scale():
            self.last = now
            return True
        return False


def prompt_html(prompt: str) -> str:
    return f'<span class="sd-prompt" title="prompt">{html.escape(prompt, quote=False)}</span>'


def user_error(e: Exception) -> gr.Error:
    """A bad input as a toast that names it (no traceback in the log: it is the user's, not ours)."""
    return gr.Error(str(e), title="Invalid input", print_exception=False)
