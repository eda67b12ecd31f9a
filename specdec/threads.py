"""Where the CPU work of torch runs: on as few threads as possible, because each one keeps its own
OpenMP thread pool.

GNU OpenMP (the libgomp that PyTorch's CPU wheels ship) gives every thread that runs a parallel
region its own pool of workers, kept until that thread exits. Once the pools together hold more
threads than the machine has CPUs, libgomp stops letting idle workers spin between regions: every
parallel op then wakes its workers from sleep. Measured on a 2-CPU machine (`scripts/thread_pools.py`):
a [64, 256] x [256, 256] product took 47 µs on the main thread, and 111-210 µs on a second thread once
the main thread had run one parallel op; the embedded model's 16-node tree forward 1.3 ms against
4.1-6.2 ms. The scheduler runs every round on its own thread, so a model loaded on the caller's thread
slowed every round the app served by 1.5-3x.

So work that only has to happen once (loading, probing) runs on a short-lived thread, whose pool
goes when it ends, and the rounds run on the scheduler's thread alone.
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_fresh_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread that ends with it (its OpenMP pool too); its result or exception."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller)
            out["error"] = e

    thread = threading.Thread(target=run, name="specdec-once", daemon=True)  # Ctrl-C while it runs still exits
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def off_the_callers_thread(device, fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) where its torch work leaves the caller's thread without an OpenMP pool: on a
    fresh thread for a CPU `device`. Elsewhere on the caller's thread, which keeps its own CUDA state
    (current device, streams)."""
    if device.type == "cpu":
        return on_fresh_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)
