"""`specdec.load` and the scheduler's probe leave no OpenMP pool on the caller's thread (`specdec.threads`).

A second pool makes every parallel op of the scheduler's thread wake its workers from sleep (libgomp
stops their spinning once the pools hold more threads than there are CPUs). Each check runs in a fresh
interpreter and lists the process's OS threads: a product on the caller's thread starts new ones (that
thread's pool workers) only if it had no pool yet. The control loads on the caller's thread and shows that the
count then sees the pool load made.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from specdec.threads import off_the_callers_thread, on_fresh_thread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import os, sys, torch
import specdec, specdec.api as api
threads = lambda: set(os.listdir("/proc/self/task"))  # thread ids: the load's pool may still be ending
if sys.argv[1] == "load":
    loaded = specdec.load(max_batch_size=2)
    loaded.scheduler  # its probe of the batched path runs forwards too
else:  # the control: the same loading, on this thread
    api._load(None, None, torch.device("cpu"), None, None, None, None, 1, None, None, None)
before = threads()
torch.randn(512, 512) @ torch.randn(512, 512)  # a parallel product on this thread
print(len(threads() - before))  # threads this product started
"""

needs_cores = pytest.mark.skipif(not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
                                 reason="counts OpenMP worker threads in /proc (Linux, 2+ CPUs)")


def _added_by_a_product(mode: str) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


@needs_cores
@pytest.mark.process
def test_load_leaves_the_callers_thread_without_a_pool():
    assert _added_by_a_product("load") > 0  # the caller's first parallel op had to start its pool


@needs_cores
@pytest.mark.process
def test_control_loading_on_the_callers_thread_leaves_its_pool():
    assert _added_by_a_product("control") == 0


def test_on_fresh_thread_returns_and_raises_from_another_thread():
    caller = threading.get_ident()
    assert on_fresh_thread(lambda x, y=0: (x + y, threading.get_ident() != caller), 2, y=3) == (5, True)

    def fails():
        raise ValueError("`x` must be positive")

    with pytest.raises(ValueError, match="`x` must be positive"):
        on_fresh_thread(fails)


def test_only_cpu_work_leaves_the_callers_thread():
    """A CUDA (here: meta) device keeps the caller's thread and its per-thread CUDA state."""
    caller = threading.get_ident()
    assert off_the_callers_thread(torch.device("cpu"), threading.get_ident) != caller
    assert off_the_callers_thread(torch.device("meta"), threading.get_ident) == caller
