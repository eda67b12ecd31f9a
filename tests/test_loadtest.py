"""loadtest.py without a server: the workload the clients send, its arguments, and --engine mode."""
from __future__ import annotations

import random

import pytest

import loadtest


def test_workload_is_what_each_client_draws():
    args = loadtest.parse_args(["--clients", "3", "--requests", "2", "--seed", "5"])
    work = loadtest.workload(args)
    assert len(work) == 6
    rng = random.Random(5 + 1)  # client 1, as its worker draws: a prompt, then a seed, per request
    first = (rng.choice(loadtest.PROMPTS), rng.randrange(10**6))
    assert work[2] == first


@pytest.mark.parametrize("flag", ["--max-batch-size", "--repeats", "--clients"])
def test_bad_counts_are_refused(flag):
    with pytest.raises(SystemExit):
        loadtest.parse_args([flag, "0"])


@pytest.mark.bench
def test_engine_mode_runs_both_sizes_with_identical_outputs():
    args = loadtest.parse_args(["--engine", "--clients", "3", "--requests", "1", "--max-new-tokens", "6",
                                "--max-batch-size", "3", "--repeats", "1"])
    rep = loadtest.engine_run(args)
    assert rep["identical"] and rep["requests"] == 3
    assert set(rep["median"]) == {"1", "3"} and rep["ratio"] > 0
