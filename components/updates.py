"""Small pieces every streaming handler shares: pacing, the prompt span, and user errors as toasts."""
from __future__ import annotations

import html
import time

import gradio as gr


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


def user_error(e: Exception) -> gr.Error:
    """A bad input as a toast that names it (no traceback in the log: it is the user's, not ours)."""
    return gr.Error(str(e), title="Invalid input", print_exception=False)
