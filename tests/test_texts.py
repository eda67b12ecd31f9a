"""components/texts.py: the API descriptions state the app's real ranges and choices."""
from __future__ import annotations

from components.session import MAX_NEW_TOKENS_MAX, TEMPERATURE_MAX, TOP_K_MAX
from components.texts import API, HOW_TO_READ
from specdec.lookup import MAX_LOOKUP
from specdec.request import LOOKUP_MODES
from specdec.verifier import ACCEPTANCE_RULES, LOSSY_RULES


def test_generate_description_matches_the_limits():
    text = API["generate"]
    assert f"temperature 0-{TEMPERATURE_MAX:g}" in text and f"top_k 0-{TOP_K_MAX}" in text
    assert f"max_new_tokens 1-{MAX_NEW_TOKENS_MAX}" in text and f"lookup 0-{MAX_LOOKUP}" in text
    assert all(f"'{rule}'" in text for rule in ACCEPTANCE_RULES)
    assert all(f"'{rule}' (lossy)" in text for rule in LOSSY_RULES)
    assert all(f"'{mode}'" in text for mode in LOOKUP_MODES)
    assert set(API) == {"generate", "compare", "stop", "set_sampling", "round", "clear"}


def test_how_to_read_has_five_points():
    assert HOW_TO_READ.count("<li>") == 5
