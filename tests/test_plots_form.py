"""components/plots.py builds figures from dicts without Plotly's validation: validating them changes nothing.

Plotly's validation coerces what it is given (a title string becomes {"text": ...}, `marker_color`
becomes {"marker": {"color": ...}}) and refuses what it does not know. A figure whose dicts are
already in that form reads the same to plotly.js; these tests rebuild every figure with validation
on and compare, on synthetic events and on a real run of the embedded model (dynamic tree, prompt
lookup, a sampled run, a mid-run settings change, the replayed round shaded).
"""
from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
import torch

import specdec
from components import plots
from components.draft_tree_figure import tree_figure
from conftest import P0, lookup_event, plain_event, prefill_event, run_events, tree_event
from specdec import SamplingParams
from specdec.sampler import filter_stages


def validated(fig: go.Figure) -> dict:
    """The figure as Plotly's validation makes it (it raises on an unknown property)."""
    return json.loads(go.Figure(fig.to_dict()).to_json())


def plain(fig: go.Figure) -> dict:
    return json.loads(fig.to_json())


def figures(events: list, rows: list[dict], params: dict) -> list[go.Figure]:
    out = [tree_figure(None), plots.accepted_length_figure([]), plots.depth_acceptance_figure([]),
           plots.throughput_figure([]), plots.sampler_figure([], str, {})]
    out += [tree_figure(ev) for ev in events]
    for k in (1, 2, len(events)):
        out += [plots.accepted_length_figure(events[:k]), plots.depth_acceptance_figure(events[:k]),
                plots.throughput_figure(events[:k])]
    out.append(plots.accepted_length_figure(events, current=len(events) // 2))
    out += [plots.sampler_figure(rows, str, params), plots.sampler_figure(rows, str, params, "note <b>",
                                                                              rows[1]["token_id"], 0.25),
            plots.sampler_figure(rows, str, params, "", -5, None)]
    return out


def test_synthetic_figures_are_already_in_validated_form():
    events = run_events() + [lookup_event(), plain_event(5)]
    rows = filter_stages(torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0]), SamplingParams(**P0), 5)
    for fig in figures(events, rows, P0):
        assert plain(fig) == validated(fig)


@pytest.fixture(scope="module")
def real_runs():
    loaded = specdec.load(device="cpu")
    greedy = specdec.generate(loaded, "def fibonacci(n):", max_new_tokens=40).rounds  # the dynamic tree
    sampled = specdec.generate(loaded, "class Stack:", max_new_tokens=32, temperature=0.8, seed=3,
                               tree="trained", lookup_mode="merge").rounds
    ids = loaded.tokenizer("def f(x):")["input_ids"]
    rows = loaded.engine.sampler_rows(ids, SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=1), 12)
    changed = [prefill_event()] + [ev for ev in greedy[1:6]] + [tree_event(6, dict(P0, temperature=1.2))]
    return [greedy, sampled, changed], rows


def test_real_run_figures_are_already_in_validated_form(real_runs):
    runs, rows = real_runs
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=1).to_dict()
    for events in runs:
        for fig in figures(events, rows, params):
            assert plain(fig) == validated(fig)


def test_the_check_catches_a_figure_not_in_validated_form():
    """Negative control: a dict Plotly would coerce (a bare title string) or refuse is caught."""
    coerced = plots.figure([dict(type="bar", x=[1], y=[2])], dict(title="a bare string"))
    assert plain(coerced) != validated(coerced)
    unknown = plots.figure([dict(type="bar", x=[1], y=[2], colour="red")], {})
    with pytest.raises(ValueError):
        validated(unknown)
