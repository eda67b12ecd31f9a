"""Where torch's CPU work runs: on as few threads as possible, because each one keeps its own OpenMP pool.

Once libgomp's pools together hold more threads than the machine has CPUs, its idle workers sleep instead
of spinning, so one-off work (loading, probing) runs on a short-lived thread and the rounds on the
scheduler's alone.
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
    """Run fn on a fresh thread for a CPU `device`, else on the caller's, which holds its CUDA state."""
    if device.type == "cpu":
        return on_fresh_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


def serving_threads(loaded, requested: int | str) -> str:
    """Prepare a model's process for serving (before the scheduler's first op); a line saying what and why.

    Args:
        requested: torch's intra-op threads on a CPU: a count, or "auto" (`cost.serving_threads` measures).
    """
    import torch

    from . import cost

    if loaded.device.type == "cuda":  # cuDNN's attention builds a plan per new (query, cache) length
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
