"""Where the CPU work of torch runs: on as few threads as possible, because each one keeps its own
OpenMP thread pool.

GNU OpenMP (the libgomp that PyTorch's CPU wheels ship) gives every thread that runs a parallel
region its own pool of workers, kept until that thread exits. Once the pools together hold more
threads than the machine has CPUs, libgomp stops letting idle workers spin between regions: every
parallel op then wakes its workers from sleep. The scheduler runs every round on its own thread, so
a model loaded on the caller's thread would slow every round it serves (1.5-3x on a 2-CPU machine,
BENCHMARKS.md).

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


def serving_threads(loaded, requested: int | str) -> str:
    """Prepare a loaded model's process for serving; a line saying what was chosen and why ("" off a CPU).

    On a CPU, set torch's intra-op threads (`requested`: a count, or "auto": `cost.serving_threads`
    measures whether one thread runs the model's forwards within its margin of all of them). Call it
    before the scheduler's thread runs its first op, which keeps the count it starts with. On CUDA,
    switch cuDNN's attention off: it builds a plan for every new (query, cache) length (measured on an
    H200, a user's first 128-token run took 10.3 s instead of 4.0 s); the other SDPA kernels don't.
    """
    import torch

    from . import cost

    if loaded.device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if loaded.device.type != "cpu":
        return ""
    if requested == "auto":
        count, timed = on_fresh_thread(cost.serving_threads, loaded.engine.target)
        line = f"torch threads: {count}"
        if timed:  # nothing was timed where torch already had one thread
            ms, default = timed["ms"], timed["default"]
            line += " (measured forwards: " + ", ".join(
                f"{n} tokens {ms[1][n]:.1f} ms on one against {ms[default][n]:.1f} on {default}" for n in ms[1]) + ")"
    else:
        count, line = requested, f"torch threads: {requested} (--threads)"
    torch.set_num_threads(count)
    return line
