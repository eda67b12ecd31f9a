"""specdec.run_state: where a round's tokens stop, their text, and the tree as event nodes."""
from __future__ import annotations

import specdec
from conftest import ByteTokenizer
from specdec.detok import IncrementalDecoder
from specdec.draft_tree import build_tree
from specdec.events import EmittedToken
from specdec.request import GenerationRequest
from specdec.run_state import cut, tree_nodes, with_text
from specdec.verifier import Verdict


def toks(*ids: int) -> tuple[EmittedToken, ...]:
    return tuple(EmittedToken(i, "", "accepted", None, None) for i in ids)


def plan(loaded, max_new: int, eos=None):
    return GenerationRequest([1, 2, 3], max_new, eos_token_id=eos).plan(loaded.engine)


def test_cut_stops_at_the_first_eos_the_length_and_the_context(loaded_llama):
    p = plan(loaded_llama, 10, eos=[7])
    assert cut(toks(4, 7, 5), 0, p, 5, 100) == (toks(4, 7), "eos")
    assert cut(toks(4, 5, 6), 8, p, 5, 100) == (toks(4, 5), "length")  # 2 of 10 left
    assert cut(toks(4, 5), 0, p, 100, 100) == (toks(4, 5), "context")  # no slot left for the pending token
    assert cut(toks(4, 5), 0, p, 5, 100) == (toks(4, 5), None)


def test_with_text_decodes_incrementally_and_flushes_at_the_end():
    tok = ByteTokenizer()
    euro = list("€".encode())  # three byte tokens, one character
    detok = IncrementalDecoder(tok)
    first = with_text(toks(*euro[:2]), detok, None)
    assert [t.text for t in first] == ["", ""]  # an incomplete character waits
    last = with_text(toks(euro[2]), detok, "length")
    assert "".join(t.text for t in first + last) == "€"


def test_tree_nodes_mark_what_verification_did():
    tree = build_tree(((0,), (1,), (0, 0)))  # nodes: 0 root, 1 (0,), 2 (1,), 3 (0, 0)
    verdict = Verdict((0, 1), 9, "correction", 0.5, {1: 0.6, 2: 0.1, 3: 0.2}, (3,))
    nodes = tree_nodes(tree, [5, 6, 7, 8], [None, 0.5, 0.3, 0.4], verdict, lambda t: f"<{t}>")
    assert [n.status for n in nodes] == ["root", "accepted", "not_reached", "rejected"]
    assert [n.text for n in nodes] == ["<5>", "<6>", "<7>", "<8>"]
    assert [n.parent for n in nodes] == [-1, 0, 0, 1] and [n.depth for n in nodes] == [0, 1, 1, 2]
    assert nodes[1].target_prob == 0.6 and nodes[0].source == "root" and nodes[3].source == "heads"
