"""Round views: show, step through, jump to and replay the rounds of a session's last run.

Pure functions of the session's events (no model work), so they never wait for the model queue.
`RoundViews` is a part of `Handlers`; it needs only `replay_interval`.
"""
from __future__ import annotations

import time

import gradio as gr

from . import plots
from .draft_tree_figure import tree_figure
from .node_table import node_table_html
from .replay import highlight_css, longest_accept, next_rejection, round_markdown
from .session import Run, Session


def round_slider(run: Run | None, value: int, count: int | None = None) -> gr.Slider:
    """The round slider over the run's rounds (or its first `count`: those a paced run has shown)."""
    count = (len(run.events) if run is not None else 0) if count is None else count
    top = max(1, count - 1)
    return gr.Slider(minimum=0, maximum=top, value=value, step=1)


def round_index(value) -> int:
    """A round number from the UI or the API; out-of-range values are clamped by the caller."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise gr.Error(f"`round` must be an integer, got {value!r}", title="Invalid input", print_exception=False)
    return int(value)


def round_view(run: Run, i: int) -> tuple:
    """Round i: its tree, narration, full event, the slider, its tokens outlined, and its nodes' table."""
    ev = run.events[i]
    return (tree_figure(ev), round_markdown(ev), ev.to_dict(), round_slider(run, i), highlight_css(i),
            node_table_html(ev))


class RoundViews:
    replay_interval: float  # seconds per round when ▶ replays a run

    def show_round(self, index, session: Session) -> tuple:
        """Round `index` of the last run: its tree, narration, full event, the slider, and its tokens outlined.

        Any integer is accepted: past the last round (a run still streaming) it shows the last one."""
        run = session.run
        i = round_index(index)
        if run is None or not run.events:
            return tree_figure(None), "", None, round_slider(None, 0), "", node_table_html(None)
        return round_view(run, max(0, min(i, len(run.events) - 1)))

    def show_round_api(self, index, session: Session) -> tuple:
        """`show_round` less the nodes' table (the /round API's outputs: tree, narration, event, slider, style)."""
        return self.show_round(index, session)[:-1]

    def round_nodes(self, index, session: Session) -> str:
        """The nodes' table of the round `show_round` shows."""
        return self.show_round(index, session)[-1]

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

    def replay(self, index, session: Session, from_here: bool = False):
        """▶: step through the run's rounds at a readable pace, tree, narration, tokens and chart in sync.

        From round 0, or (`from_here`) from the shown round."""
        run = session.run
        if run is None or not run.events:
            yield (*self.show_round(0, session), gr.skip())
            return
        events = list(run.events)
        start = max(0, min(round_index(index), len(events) - 1)) if from_here else 0
        for i in range(start, len(events)):
            yield (*round_view(run, i), plots.accepted_length_figure(events, current=i))
            time.sleep(self.replay_interval)

    def replay_from_here(self, index, session: Session):
        yield from self.replay(index, session, from_here=True)
