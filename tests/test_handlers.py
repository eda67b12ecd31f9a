"""components/handlers.py: Generate, Stop and Clear on the embedded model (no server)."""
from __future__ import annotations

import gradio as gr
import plotly.graph_objects as go
import pytest

import specdec
from components.handlers import Handlers
from components.session import Session
from components.replay import round_markdown
from conftest import CONTROLS, chat_loaded, figure, race_controls, wait_until


def test_handler_generate_matches_the_library(handlers):
    session = Session()
    updates = list(handlers.generate("def fibonacci(n):", *CONTROLS.values(), session))
    ref = specdec.generate(handlers.loaded, "def fibonacci(n):", max_new_tokens=10, tree="chain")
    final = updates[-1][-1]
    assert final["text"] == ref.text and final["finished"] == "length"
    assert [u[-1]["round"] for u in updates[:-1]] == list(range(len(ref.rounds)))
    assert "Round" in figure(updates[-1][2]).layout.title.text  # the tree
    assert figure(updates[-1][8]).layout.title.text.startswith("The filters keep ")  # the sampler view
    assert session.run.done and len(session.run.events) == len(ref.rounds)
    fig, info, event, _, style, nodes = handlers.show_round(1, session)
    assert 'data-round="1"' in style and "<th>verdict</th>" in nodes and "Round 1" in nodes
    assert event["index"] == 1 and "Round 1" in info and "Round 1" in fig.layout.title.text
    assert handlers.show_round(999, session)[2]["index"] == len(ref.rounds) - 1


def test_handler_stop_and_live_tuning(handlers):
    """The scheduler decodes while the handler renders: a slider change reaches every round after it,
    and Stop ends the run within one round."""
    session = Session()
    gen = handlers.generate("class Stack:", *{**CONTROLS, "max_new_tokens": 400}.values(), session)
    first = next(gen)
    assert first[-1]["round"] == 0
    before = len(session.run.events)
    handlers.sampler_view("class Stack:", 1.5, 7, 0.9, 0.05, "lossless", False, session)  # between two rounds
    handlers.stop(session)
    stopped_at = len(session.run.events)
    rest = list(gen)
    assert rest[-1][-1]["finished"] == "stopped"
    temps = [ev.params["temperature"] for ev in session.run.events]
    k = temps.index(1.5)  # the first round that read the new settings; every later one reads them too
    assert before <= k <= stopped_at and set(temps[:k]) == {0.0} and set(temps[k:]) == {1.5}
    assert len(temps) <= stopped_at + 1  # Stop: at most the round already running
    assert "settings changed" in rest[-1][1]


def test_handler_bad_inputs_raise_gr_error(handlers):
    session = Session()
    for prompt, change in (("", {}), ("   ", {}), ("x " * 200, {}), ("ok", {"top_p": 0.0}),
                           ("ok", {"max_new_tokens": 10_000}), ("ok", {"tree": "nope"})):
        with pytest.raises(gr.Error):
            next(handlers.generate(prompt, *{**CONTROLS, **change}.values(), session))
    assert session.run is None


def test_fast_rounds_are_batched_into_fewer_updates(handlers):
    batched = Handlers(handlers.loaded, figure_interval=60.0, text_interval=60.0)
    updates = list(batched.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 12}.values(), Session()))
    assert len(updates) == 2  # the first round, then the final update with everything
    assert updates[-1][-1]["new_tokens"] == 12 and updates[-1][0].count("sd-tok") == 12
    assert figure(updates[0][2]).layout.title.text.startswith("Round ")  # figures come with the first update too


def test_handler_lookup_settings_and_errors(handlers):
    prompt = "def fibonacci(n):"
    session = Session()
    lookup_only = {**CONTROLS, "tree": "none", "lookup": 8, "lookup_mode": "merge", "max_new_tokens": 24}
    final = list(handlers.generate(prompt, *lookup_only.values(), session))[-1]
    ref = specdec.generate(handlers.loaded, prompt, max_new_tokens=24, tree="none", lookup=8, lookup_mode="merge")
    assert final[-1]["text"] == ref.text
    assert session.run.settings.lookup == 8 and session.run.settings.lookup_mode == "merge"
    assert all(n.source != "heads" for ev in session.run.events for n in ev.nodes)  # tree "none": lookup only
    assert "by prompt lookup" in final[1]
    # plain decoding ignores prompt lookup
    plain = list(handlers.generate(prompt, *{**lookup_only, "speculative": False, "lookup": 64}.values(),
                                   session))[-1]
    assert plain[-1]["text"] == ref.text and not any(ev.nodes for ev in session.run.events)
    assert {k for ev in session.run.events for k in (t.kind for t in ev.emitted)} == {"baseline"}
    for change, words in (({"lookup": 65}, "`lookup` must be an integer in [0, 64]"), ({"lookup": 1.5}, "must be an integer"),
                          ({"lookup": "many"}, "`lookup` must be a number"),
                          ({"lookup_mode": "both"}, "`lookup_mode` must be one of ('first', 'merge')"),
                          ({"tree": "none", "lookup": 0}, "drafts nothing")):
        with pytest.raises(gr.Error, match="lookup|drafts nothing") as err:
            next(handlers.generate(prompt, *{**CONTROLS, **change}.values(), session))
        assert words in err.value.message, (change, err.value.message)
        with pytest.raises(gr.Error):
            next(handlers.compare(prompt, *race_controls(**change), session))
    # the tree "none" with speculation off needs no lookup
    out = list(handlers.generate(prompt, *{**CONTROLS, "tree": "none", "lookup": 0, "speculative": False}.values(),
                                 session))[-1]
    assert out[-1]["new_tokens"] == 10
    assert ("none (root only: prompt lookup drafts everything)", "none") in handlers.tree_choices


def test_chat_checkbox_follows_the_template_and_wraps_the_prompt(handlers):
    """#10: on by default with a chat template, greyed out without; its value reaches encode."""
    from app import build_demo

    def checkbox(loaded):
        demo = build_demo(loaded)
        return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "chat")

    plain = checkbox(handlers.loaded)  # the embedded model has no chat template
    assert plain.value is False and plain.interactive is False
    loaded = chat_loaded(handlers)
    box = checkbox(loaded)
    assert box.value is True and box.interactive is not False
    h = Handlers(loaded, figure_interval=0.0, text_interval=0.0)
    prompt = "write a loop"
    wrapped = specdec.api.encode(loaded, prompt, chat=True)
    assert wrapped != specdec.api.encode(loaded, prompt) and len(wrapped) > len(h.encode(prompt))
    controls = {**CONTROLS, "tree": "none", "lookup": 4, "max_new_tokens": 4}
    for chat, ids in ((True, wrapped), (False, h.encode(prompt))):
        session = Session()
        final = list(h.generate(prompt, *{**controls, "chat": chat}.values(), session))[-1]
        assert session.run.prompt_ids == ids and final[-1]["new_tokens"] == 4
    # Compare and the sampler view take it too
    session = Session()
    list(h.compare(prompt, *race_controls(tree="none", lookup=4, max_new_tokens=3, chat=True), session))
    assert session.active is None
    fig = h.sampler_view(prompt, 0.8, 5, 1.0, 0.0, "lossless", True, session)
    assert f"after the {len(wrapped)}-token prompt" in fig.layout.title.text
    with pytest.raises(gr.Error, match="chat template"):
        next(handlers.generate(prompt, *{**CONTROLS, "chat": True}.values(), Session()))


def test_final_update_shows_the_most_instructive_round_and_the_sampler_follows(handlers):
    from components.replay import instructive_round
    session = Session()
    updates = list(handlers.generate("def fibonacci(n):", *{**CONTROLS, "max_new_tokens": 24,
                                                             "tree": "default"}.values(), session))
    final = updates[-1]
    best = instructive_round(session.run.events)
    assert figure(final[2]).layout.title.text.startswith(f"Round {best}:") and f"**Round {best}**" in final[4]
    assert f'data-round="{best}"' in final[9]
    # the sampler view sits at the run's last token, starred
    ids = session.run.token_ids
    assert f"last token ({len(ids)}) was drawn" in figure(final[8]).layout.title.text
    assert any(t.startswith("★") for t in figure(final[8]).layout.yaxis.ticktext)
    # after Clear it is back after the prompt
    cleared = handlers.clear("def fibonacci(n):", 0.0, 0, 1.0, 0.0, "lossless", False, session)
    assert "the next token after the 9-token prompt" in cleared[8].layout.title.text
    assert "generated text" not in cleared[8].layout.title.text
    # the greedy rule greys out the temperature slider
    assert Handlers.temperature_control("greedy").interactive is False
    assert Handlers.temperature_control("lossless").interactive is True


def test_model_line_says_what_runs(loaded_llama):
    from components.handlers import model_line

    info = loaded_llama.engine.info()
    line = model_line(info, "tiny")
    assert "**tiny**" in line and "float32" in line and "cpu" in line and "Medusa heads" in line
    assert "CUDA graphs" not in line
    assert "· CUDA graphs ·" in model_line({**info, "cuda_graphs": {"mode": "cuda"}}, "tiny")
    assert info["heads_dtype"] == str(loaded_llama.heads.projection_dtype).replace("torch.", "")
    half = model_line({**info, "heads_dtype": "float16"}, "tiny")
    assert "Medusa heads (float16 projections)" in half  # the app says when the heads run narrower
    assert "projections" not in model_line({**info, "heads_dtype": info["dtype"]}, "tiny")


def test_streamed_updates_resend_the_views_they_do_not_redraw(handlers):
    """Between two draws an update re-sends each view's last value, the same object (an empty diff for
    Gradio), never gr.skip(), which costs Gradio a component rebuild per output and update; the slider's
    range goes once per draw, then its value alone."""
    h = Handlers(handlers.loaded, figure_interval=60.0, text_interval=0.0)
    session = Session()
    updates = list(h.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 12}.values(), session))
    assert len(updates) >= 4
    streamed = updates[:-1]
    skip = gr.skip()
    assert not any(v == skip for u in streamed for v in u)
    first, rest = streamed[0], streamed[1:]
    assert isinstance(first[3], gr.Slider)  # drawn at once for a lone run: the range, then the value
    for u in rest:
        assert all(u[i] is first[i] for i in (2, 5, 6, 7, 8))  # tree, three charts, sampler: not rebuilt
        assert u[3] == first[3].constructor_args["value"] and u[4] is first[4] and u[9] is first[9]
    # a run that has drawn nothing yet shows blank views, not the previous run's
    busy = Handlers(handlers.loaded, figure_interval=60.0, chart_interval=60.0, text_interval=0.0)
    busy.streaming = 3  # other runs stream: the views wait for their share of the budget
    gen = busy.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 12}.values(), Session())
    u = next(gen)
    assert "several runs share the server" in figure(u[2]).layout.annotations[0].text
    assert u[8] == skip  # the sampler view is not the run's own until it draws it
    gen.close()


def test_a_paced_run_shows_every_round_in_turn_and_stop_ends_it_at_the_shown_one(handlers):
    session = Session()
    gen = handlers.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 24}.values(), session, pace="8")
    seen = [next(gen)[-1]["round"] for _ in range(3)]
    assert seen == [0, 1, 2]  # one update per round, each round in turn
    session.request_stop()
    rest = list(gen)
    assert rest[-1][-1]["round"] == 2 and rest[-1][-1]["finished"] == "stopped"
    assert len(session.run.events) == 3  # the run ends at the round shown, whatever the engine had made
    with pytest.raises(gr.Error, match="pace"):
        next(handlers.generate("def f(x):", *CONTROLS.values(), Session(), pace="slow"))


def test_out_of_range_typed_values_and_an_empty_prompt_are_refused(handlers):
    for change in ({"max_new_tokens": 0}, {"temperature": -1.0}, {"seed": -2}):
        with pytest.raises(gr.Error, match=next(iter(change))):
            next(handlers.generate("def f(x):", *{**CONTROLS, **change}.values(), Session()))
    for empty in ("", "  \n "):
        with pytest.raises(gr.Error, match="Type a prompt"):
            next(handlers.generate(empty, *CONTROLS.values(), Session()))


def test_a_slider_moved_during_a_paced_run_acts_on_the_next_round_shown(handlers):
    """The engine decodes ahead of the view; a live change drops the rounds it made under the old settings and
    the run resumes from the shown round with the new ones: every round shown after the change reads them."""
    session = Session()
    gen = handlers.generate("def f(x):", *{**CONTROLS, "max_new_tokens": 40, "tree": "default"}.values(), session,
                            pace="step")
    shown = [next(gen)[-1]]
    for _ in range(2):
        handlers.step(session)
        shown.append(next(gen)[-1])
    wait_until(lambda: session.run.events[-1].finished, 60, "the engine's last round")  # far ahead of the view
    handlers.sampler_view("def f(x):", 1.2, 9, 1.0, 0.0, "lossless", False, session)  # while round 3 waits
    rest = []
    while not rest or not rest[-1]["finished"]:
        handlers.step(session)
        rest.append(next(gen)[-1])
    rest += [u[-1] for u in gen]
    rounds = [r["round"] for r in shown + rest[:-1]]
    assert rounds == list(range(len(rounds)))  # one update per round, in turn, none skipped or repeated
    events = session.run.events
    assert [ev.index for ev in events] == list(range(len(events)))
    assert {ev.params["temperature"] for ev in events[:3]} == {0.0}
    assert {(ev.params["temperature"], ev.params["top_k"]) for ev in events[3:]} == {(1.2, 9)}
    assert events[3].extra.get("resumed") and "settings changed" in round_markdown(events[3])
    assert events[-1].total_tokens == sum(len(ev.emitted) for ev in events) == 40
    assert rest[-1]["finished"] == "length" and rest[-1]["text"] == session.run.text
