"""How much a busy Python thread in the same process slows the scheduler's rounds (the GIL).

The app's web server (Gradio's event loop and handler threads) runs Python in the process whose
scheduler thread decodes. A round is mostly Python between short torch ops, and every op hands the
GIL back and takes it again, so any other Python work competes with decoding even on a free core.
This script measures that in isolation: the load test's requests through a `Scheduler` with and
without a background thread that spins pure Python for `--duty` of the time, alternating, for two
GIL switch intervals (Python's 5 ms default and 0.5 ms), and with the same work in another process
(the same CPU demand without the GIL: what an engine in its own process would see).

    python scripts/gil_contention.py                     # batch 8, a 30%-busy thread
    python scripts/gil_contention.py --batch 1 --duty 0.5

Prints the median tokens/s of each case (embedded model, greedy, 64 new tokens per request).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import loadtest  # noqa: E402  (the load test's prompts)
import specdec  # noqa: E402
from specdec.api import encode  # noqa: E402
from specdec.lookup import DEFAULT_LOOKUP  # noqa: E402
from specdec.scheduler import Scheduler  # noqa: E402


def _bursts(stop, busy_s: float, idle_s: float) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < busy_s:
            sum(range(200))
        time.sleep(idle_s)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8, help="the scheduler's max batch size")
    ap.add_argument("--duty", type=float, default=0.3, help="share of the time the other thread runs Python")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    if not 0 < a.duty < 1:
        ap.error(f"--duty must be in (0, 1), got {a.duty}")
    loaded = specdec.load()
    work = loadtest.workload(loadtest.parse_args(["--engine", "--max-new-tokens", str(a.max_new_tokens)]))
    requests = [specdec.GenerationRequest(encode(loaded, p), a.max_new_tokens, specdec.SamplingParams(seed=s),
                                          "auto", True, "lossless", lookup=DEFAULT_LOOKUP) for p, s in work]
    stop = threading.Event()
    busy_s, idle_s = 0.002 * a.duty / (1 - a.duty), 0.002

    def other_python() -> None:  # like an event loop's bursts: busy, then waiting on I/O
        _bursts(stop, busy_s, idle_s)

    def one_pass() -> float:
        with Scheduler(loaded.engine, max_batch_size=a.batch) as s:
            t0 = time.perf_counter()
            events = [t.result() for t in [s.submit(r) for r in requests]]
            return sum(len(e.emitted) for evs in events for e in evs) / (time.perf_counter() - t0)

    one_pass()  # warm-up: the cost model is measured on first use
    rates: dict[tuple[float, str], list[float]] = {}
    default_switch = sys.getswitchinterval()
    try:
        for _ in range(a.repeats):
            for switch in (0.005, 0.0005):
                sys.setswitchinterval(switch)
                rates.setdefault((switch, "alone"), []).append(one_pass())
                stop.clear()
                th = threading.Thread(target=other_python, daemon=True)
                th.start()
                rates.setdefault((switch, "busy"), []).append(one_pass())
                stop.set()
                th.join()
            if switch == 0.0005:  # once per repeat: the same bursts in another process
                sys.setswitchinterval(default_switch)
                ctx = multiprocessing.get_context("spawn")
                halt = ctx.Event()
                proc = ctx.Process(target=_bursts, args=(halt, busy_s, idle_s), daemon=True)
                proc.start()
                time.sleep(0.5)  # past its start-up
                rates.setdefault((default_switch, "busy process"), []).append(one_pass())
                halt.set()
                proc.join()
    finally:
        sys.setswitchinterval(default_switch)
    out = {f"switch {sw * 1e3:.1f} ms, {case}": statistics.median(r) for (sw, case), r in rates.items()}
    for k, v in out.items():
        print(f"batch {a.batch}, {k}: {v:.0f} tokens/s")
    return out


if __name__ == "__main__":
    main()
