"""Round views: show, step through, jump to and replay the rounds of a session's last run.

Pure functions of the session's events (no model work), so they never wait for the model queue.
`RoundViews` is a part of `Handlers`; it needs only `replay_interval`.
"""
from __future__ import annotations

import time

import gradio as gr

from . import plots
from .replay import highlight_css, longest_accept, next_rejection, round_markdown
from .session import Run, Session


def round_slider(run: Run | None, value: int) -> gr.Slider:
    top = max(1, len(run.events) - 1) if run is not None else 1
    return gr.Slider(minimum=0, maximum=top, value=value, step=1)


def round_index(value) -> int:
    """A round number from the UI or the API; out-of-range values are clamped by the caller."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise gr.Error(f"`round` must be an integer, got {value!r}", title="Invalid input", print_exception=False)
    return int(value)


def round_view(run: Run, i: int) -> tuple:
    """Round i: its tree, narration, full event, the slider, and its tokens outlined."""
    ev = run.events[i]
    return plots.tree_figure(ev), round_markdown(ev), ev.to_dict(), round_slider(run, i), highlight_css(i)


class RoundViews:
    replay_interval: float  # seconds per round when ▶ replays a run

    def show_round(self, index, session: Session) -> tuple:
        """Round `index` of the last run: its tree, narration, full event, the slider, and its tokens outlined.

        Any integer is accepted: past the last round (a run still streaming) it shows the last one."""
        run = session.run
        i = round_index(index)
        if run is None or not run.events:
            return plots.tree_figure(None), "", None, round_slider(None, 0), ""
        return round_view(run, max(0, min(i, len(run.events) - 1)))

    def step_round(self, index, session: Session, step: int) -> tuple:
        return self.show_round(round_index(index) + step, session)

    def jump_rejection(self, index, session: Session) -> tuple:
        """The next round (after the shown one, wrapping) in which the target rejected a draft."""
        run = session.run
        if run is None or not run.events:
            return self.show_round(0, session)
        return self.show_round(next_rejection(list(run.events), round_index(index)), session)

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
        start = max(0, min(round_index(index), len(events) - 1))
        start = 0 if start >= len(events) - 1 else start
        for i in range(start, len(events)):
            yield (*round_view(run, i), plots.accepted_length_figure(events, current=i))
            time.sleep(self.replay_interval)
