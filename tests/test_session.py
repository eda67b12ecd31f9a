"""components/session.py: settings from raw control values, and one user's session state."""
from __future__ import annotations

import pytest

from components.session import Session, Settings


def test_settings_validate_names_the_bad_value():
    ok = Settings.validate(0.5, 10.0, 0.9, 0.1, 32.0, 3.0, "small", "typical", True, trees=["small"])
    assert ok.top_k == 10 and isinstance(ok.top_k, int) and ok.max_new_tokens == 32 and ok.seed == 3
    bad = [dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=1.5), dict(top_k=-1), dict(top_p=0),
           dict(min_p=2), dict(max_new_tokens=0), dict(seed=-2), dict(acceptance="fast"), dict(tree="huge"),
           dict(temperature="hot"), dict(speculative="yes"), dict(lookup=-1), dict(lookup=65), dict(lookup=2.5),
           dict(lookup="ten"), dict(lookup=None), dict(lookup=True), dict(lookup_mode="both"), dict(lookup_mode=None)]
    base = dict(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, max_new_tokens=8, seed=0, tree="small",
                acceptance="lossless", speculative=True)
    for change in bad:
        with pytest.raises(ValueError, match=next(iter(change))):
            Settings.validate(**{**base, **change}, trees=["small"])


def test_greedy_rule_forces_temperature_zero():
    s = Settings(temperature=0.9, acceptance="greedy")
    assert s.sampling_params(5).greedy and s.sampling_params(5).seed == 5
    assert not Settings(temperature=0.9).sampling_params().greedy


def test_session_live_params_and_stop():
    session = Session()
    run = session.start_run("p", [1, 2], Settings(temperature=0.5, seed=7))
    stop = session.should_stop(run)
    assert session.live_params().temperature == 0.5 and session.live_params().seed == 7
    session.live = session.live.with_live(1.0, 5, 0.8, 0.1)
    assert session.live_params().temperature == 1.0 and session.live_params().top_k == 5
    assert not stop()
    session.request_stop()
    assert stop()
    newer = session.start_run("p", [1], Settings())
    assert session.run is newer and not session.should_stop(newer)()
    session.finish(newer)
    assert not session.running
