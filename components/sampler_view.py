"""The sampler view: the target's next-token law at a position, and what each filter keeps of it.

`SamplerView` is a part of `Handlers`: it reads `gate` (the engine's narrow face), `sampler_top`
and `encode`. The rows come from `Engine.sampler_rows` as plain values, computed on demand for the
position shown; a session keeps the last rows it drew, so a redraw at the same position and settings
costs no forward.
"""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from specdec import SamplingParams
from specdec.stats import SAMPLER_KEYS  # the params that shape a law (the seed only draws from it)
from specdec.verifier import ACCEPTANCE_RULES

from . import plots
from .gate import ModelGate
from .session import MAX_NEW_TOKENS_MAX, Run, Session, Settings
from .updates import user_error


def prompt_note(ids: list[int]) -> str:
    return f"the next token after the {len(ids)}-token prompt"


class SamplerView:
    gate: ModelGate
    sampler_top: int

    @staticmethod
    def temperature_control(acceptance) -> gr.Slider:
        """The greedy rule ignores temperature, so its slider is greyed out."""
        return gr.Slider(interactive=acceptance != "greedy",
                         info="ignored: the greedy rule always takes the argmax" if acceptance == "greedy"
                         else "0 = greedy; live: applies from the next round")

    @staticmethod
    def live_values(session: Session) -> tuple:
        """The four sliders as the session uses them: after a refused value, each box shows the one in use."""
        live = session.live
        return live.temperature, live.top_k, live.top_p, live.min_p

    @staticmethod
    def check_max_new(value):
        """A typed max new tokens outside [1, MAX_NEW_TOKENS_MAX]: a toast, and the box set to the nearest allowed
        value, the one the next run uses."""
        try:
            Settings.validate(0.0, 0, 1.0, 0.0, value)
        except ValueError as e:
            number = value if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else 1
            used = int(min(max(round(number), 1), MAX_NEW_TOKENS_MAX))
            gr.Warning(f"{e}; max new tokens is set to {used}", title="Invalid input")
            return used
        return gr.skip()

    def sampler_view(self, prompt, temperature, top_k, top_p, min_p, acceptance, chat, session: Session):
        """Update the live settings and redraw the sampler view. A running generation picks up the
        new values at its next round; the rule only changes between runs."""
        try:
            live = session.live.with_live(temperature, top_k, top_p, min_p)
            if not session.running:
                live = Settings.validate(live.temperature, live.top_k, live.top_p, live.min_p,
                                         live.max_new_tokens, live.seed, live.tree, acceptance, live.speculative,
                                         live.lookup, live.lookup_mode)
        except ValueError as e:
            raise user_error(e) from None
        session.live = live
        view = replace(live, acceptance=acceptance if acceptance in ACCEPTANCE_RULES else live.acceptance)
        run = session.run
        if run is not None and run.events and run.prompt == prompt and run.chat == bool(chat):
            return self._run_sampler(session, run, view)
        try:
            ids = self.encode(prompt, bool(chat))
        except ValueError as e:
            return plots.empty_figure(f"Sampler view: {e}", 320)
        return self._sampler_figure(session, ids, view.sampling_params(), prompt_note(ids))

    def _sampler_figure(self, session: Session, ids: list[int], params: SamplingParams, note: str,
                        emitted: int | None = None, emitted_prob: float | None = None):
        """The law after `ids` under `params`: one forward through the engine's narrow face, cached per session."""
        params = replace(params, seed=None)  # the seed changes no law
        key = (tuple(ids), tuple(sorted(params.to_dict().items())))
        cache = session.sampler_cache
        if cache is None or cache[0] != key:
            cache = session.sampler_cache = (key, self.gate.sampler_rows(ids, params, self.sampler_top))
        return plots.sampler_figure(cache[1], self.gate.token_text, params.to_dict(), note, emitted, emitted_prob)

    def _run_sampler(self, session: Session, run: Run, settings: Settings):
        """The sampler view at the run's newest token: the law it was drawn from, that token starred."""
        last = next((t for ev in reversed(run.events) for t in reversed(ev.emitted)), None)
        if last is None:
            return self._sampler_figure(session, run.prompt_ids, settings.sampling_params(),
                                        prompt_note(run.prompt_ids))
        ids = run.prompt_ids + run.token_ids[:-1]
        note = (f"where the run's token {len(run.token_ids)} was drawn; the sliders filter the next rounds"
                if not run.done else f"where the run's last token ({len(run.token_ids)}) was drawn")
        return self._sampler_figure(session, ids, settings.sampling_params(), note, last.token_id, last.target_prob)

    def token_law(self, session: Session, position: int):
        """The sampler view where the run's token `position` (0-based) was drawn: its round's settings, it starred."""
        run = session.run
        where = [(ev, t) for ev in run.events for t in ev.emitted] if run is not None else []
        if not 0 <= position < len(where):
            return gr.skip()
        ev, tok = where[position]
        params = SamplingParams(**{k: v for k, v in ev.params.items() if k in SAMPLER_KEYS})
        note = f"where token {position + 1} was drawn (round {ev.index}, with that round's settings)"
        return self._sampler_figure(session, run.prompt_ids + run.token_ids[:position], params, note, tok.token_id,
                                    tok.target_prob)
