"""specdec/events.py: round events are frozen plain values that survive JSON."""
from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import tree_event
from specdec.events import TOKEN_KINDS


def test_event_is_frozen_plain_and_json_ready():
    ev = tree_event(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.index = 3
    d = ev.to_dict()
    back = json.loads(json.dumps(d))  # tuples come back as lists; nothing else changes
    assert back["accepted_path"] == list(d["accepted_path"]) and back["params"] == d["params"]
    assert back["nodes"] == [dict(n) for n in d["nodes"]]
    assert d["nodes"][1]["text"] == " fib" and d["emitted"][-1]["kind"] == "correction"


def test_accepted_length_and_text_come_from_the_emitted_tokens():
    ev = tree_event(1)
    assert ev.accepted_length == 3 == len(ev.emitted)
    assert ev.text == " fib(n\n"
    assert {t.kind for t in ev.emitted} <= set(TOKEN_KINDS)
