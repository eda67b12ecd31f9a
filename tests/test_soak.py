"""bench/soak.py, short: both servers started by the script, random load, chaos faults and one engine kill each."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import soak

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def test_plan_is_the_same_whichever_thread_draws_it():
    args = soak.parse_args(["--seed", "3"])
    menu = soak.greedy_menu(3, 6)
    calls = [soak.plan(i, args, menu) for i in range(200)]
    assert calls == [soak.plan(i, args, menu) for i in range(200)]
    greedy = [c for c in calls if c.greedy]
    assert greedy and all((c.prompt, c.max_new_tokens) in menu for c in greedy)  # each has a solo reference
    assert {c.how for c in calls} == {"whole", "stream", "cancel", "drop"}
    assert all(c.server == "serve" for c in calls if c.how in ("stream", "drop"))
    assert all(0.3 <= c.sampling["temperature"] <= 1.2 for c in calls if not c.greedy)


def test_a_short_soak_loses_nothing_and_greedy_outputs_equal_solo(tmp_path):
    # A chaos fraction of 0.25 so that a run this short surely has chaos failures; the kills come early
    # so that both engines are back while requests still arrive.
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "bench.soak", "--seconds", "20", "--requests", "150", "--concurrency", "4",
           "--greedy-prompts", "6", "--deadline", "60", "--chaos", "0.25", "--kill-at", "0.1",
           "--kill-serve-at", "0.15", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    rep = json.loads(out.read_text())
    failing = {k: v for k, v in rep["checks"].items() if not v}
    assert done.returncode == 0 and not failing, (failing, rep["lost_requests"], rep["failed_other_requests"],
                                                  rep["greedy_differences"])
    assert rep["lost"] == 0 and rep["failed_other"] == 0
    assert rep["greedy_compared"] > 0 and rep["greedy_equal_fraction"] == 1.0
    assert rep["faults"]["chaos_oom"] + rep["faults"]["chaos_error"] > 0  # counted as injected, not as lost
    for name, s in rep["servers"].items():
        assert s["killed_engine"] and s["idle_at_end"]["restarts_counted"], name
        assert s["first_success_after_kill_s"] is not None, name
    assert rep["sent"] == rep["finished"] + rep["cancelled"] + rep["failed_injected"] + rep["failed_other"]
