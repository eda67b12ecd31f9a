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
    assert stop() and not run.replaced
    session.finish(run)
    newer = session.start_run("p", [1], Settings())
    assert session.run is newer and not session.should_stop(newer)()
    session.finish(newer)
    assert not session.running


def test_runs_of_one_session_run_side_by_side_until_its_tab_replaces_them():
    """An API client's calls share a session: a new run stops none, and each keeps its own seed and settings
    (the sliders move the newest only). A tab's own new run first replaces every unfinished one."""
    session = Session()
    a = session.start_run("p", [1], Settings(temperature=0.5, seed=1))
    b = session.start_run("q", [2], Settings(temperature=0.9, seed=2))
    assert not session.should_stop(a)() and not session.should_stop(b)()
    assert (session.live_params(a).temperature, session.live_params(a).seed) == (0.5, 1)
    assert (session.live_params(b).temperature, session.live_params(b).seed) == (0.9, 2)
    session.live = session.live.with_live(1.3, 5, 0.8, 0.0)
    assert session.live_params(b).temperature == 1.3 and session.live_params(a).temperature == 0.5
    session.finish(a)
    assert session.running and session.unfinished == [b] and session.active is b
    session.replace()
    assert b.stopped and b.replaced and session.should_stop(b)()
    c = session.start_run("r", [3], Settings())
    assert not session.should_stop(c)() and not c.replaced
    session.request_stop()  # Stop: every unfinished run of the session
    assert session.should_stop(c)() and not c.replaced
