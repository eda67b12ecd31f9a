"""Soak test: the Gradio app and `specdec serve`, started here on loopback, under random load with faults.

    python -m bench.soak --seconds 300 --concurrency 8 --out soak.json      # the long run
    python -m bench.soak --seconds 25 --requests 150 --concurrency 4        # about what CI runs

Both servers start as subprocesses on free 127.0.0.1 ports with `--max-batch-size 4` (the embedded model,
an engine process on a CPU); the app also with `--chaos`, which fails about that fraction of requests in
their round 3, alternately with a simulated CUDA out-of-memory in the shared forward and an error in
their verify. Client threads (one gradio `Client` and one `openai` client each) then send requests with
exponential gaps: prompts from assets/static/examples.json cut or repeated, greedy or sampled (T in
[0.3, 1.2] with top-p, top-k, min-p and a seed), streamed or not, some cancelled mid-stream (gradio
`job.cancel()`; openai: the stream closed) and some dropped (a raw SSE request closed after its first
chunk). Once during the run each server's engine process is SIGKILLed.

Every request ends as finished, cancelled, failed-injected (the chaos hook, or in flight at a kill) or
failed-other, or it is lost: not ended within `--deadline` seconds. Exit status 1 unless nothing is lost,
nothing failed otherwise, every finished greedy request equals the same request run alone before the
soak on the same server, each killed server served a request after its kill, both schedulers are idle
at the end, and neither the server's nor the engine's RSS grew past the bound from warm-up to the end.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import httpx
from openai import APITimeoutError, OpenAI

from loadtest import one_request

from specdec.supervisor import ENGINE_GONE

from .soak_plan import GREEDY, Call, greedy_menu, plan
from .soak_servers import RSS_BOUND, Server, grew, kill_engines, sample_rss, start_servers, stop_servers, wait_idle

CHAOS = "injected by the chaos hook"
FAULTS = ("chaos_oom", "chaos_error", "engine_killed")


# -- the clients -------------------------------------------------------------------------------------------

class _Filters:
    """A gradio Client whose /generate calls carry a request's own top-k, top-p and min-p (loadtest's
    `one_request` sends its defaults), keeping the job so that its last record can be read."""

    def __init__(self, client, **filters) -> None:
        self.client, self.filters, self.job = client, filters, None

    def submit(self, **kw):
        self.job = self.client.submit(**{**kw, **self.filters})
        return self.job


class Clients:
    """One thread's clients: a gradio Client for the app, an openai client and an httpx client for serve."""

    def __init__(self, servers: dict[str, Server], deadline: float) -> None:
        from gradio_client import Client

        self.gradio = Client(servers["app"].url, verbose=False, ssl_verify=False, analytics_enabled=False)
        self.serve_url, self.model = servers["serve"].url, servers["serve"].model
        # No retries: a retried request would hide a failure; the timeout is the request's deadline.
        self.openai = OpenAI(base_url=self.serve_url + "v1", api_key="none", max_retries=0, timeout=deadline)
        self.http = httpx.Client(timeout=deadline)

    def close(self) -> None:
        self.openai.close()
        self.http.close()
        self.gradio.close()

    def send(self, call: Call) -> None:
        """Send `call` and fill in how it ended (its outcome stays "" if the client gave up)."""
        call.start = time.monotonic()
        try:
            (self._app if call.server == "app" else self._serve)(call)
        except (APITimeoutError, httpx.TimeoutException) as e:  # no end within the deadline: lost
            call.error = f"{type(e).__name__}: {e}"[:300]
            return
        except Exception as e:  # noqa: BLE001 (a failed request is data here)
            call.outcome, call.error = "failed", f"{type(e).__name__}: {e}"[:300]
        call.end = time.monotonic()

    def _app(self, call: Call) -> None:
        s = call.sampling
        client = _Filters(self.gradio, top_k=s["top_k"], top_p=s["top_p"], min_p=s["min_p"])
        how = SimpleNamespace(temperature=s["temperature"], tree=None, max_new_tokens=call.max_new_tokens)
        r = one_request(client, call.id, how, call.prompt, s["seed"], disconnect=call.how == "cancel")
        call.text, call.error = r.text, r.error
        call.outcome = {"ok": "finished", "cancelled": "cancelled"}.get(r.outcome, "failed")
        if call.outcome == "finished":  # a run the server stopped though its client did not cut it short
            finished = client.job.outputs()[-1][-1].get("finished")
            if finished not in ("length", "eos", "context", "stop"):
                call.outcome, call.error = "failed", f"ended as {finished!r} with no cancel"

    def _serve(self, call: Call) -> None:
        s = call.sampling
        body = dict(model=self.model, prompt=call.prompt, max_tokens=call.max_new_tokens,
                    temperature=s["temperature"], top_p=s["top_p"], seed=s["seed"])
        extra = {"top_k": s["top_k"], "min_p": s["min_p"]}
        if call.how == "drop":  # a raw SSE request, closed after its first chunk: the client went away
            with self.http.stream("POST", self.serve_url + "v1/completions",
                                  json={**body, **extra, "stream": True}) as r:
                r.raise_for_status()
                next(r.iter_lines())
            call.outcome = "cancelled"
            return
        if call.how == "whole":
            out = self.openai.completions.create(**body, extra_body=extra)
            call.text, call.outcome = out.choices[0].text, "finished"
            return
        stream = self.openai.completions.create(**body, extra_body=extra, stream=True)
        pieces = []
        try:
            for i, chunk in enumerate(stream):
                pieces.append(chunk.choices[0].text if chunk.choices else "")
                if call.how == "cancel" and i >= 1:  # a client that stops reading mid-stream
                    call.outcome = "cancelled"
                    return
        finally:
            stream.close()
        call.text, call.outcome = "".join(pieces), "finished"


def classify(call: Call, servers: dict[str, Server]) -> None:
    """A failure is injected when the chaos hook raised it, or the request was in flight at its engine's kill."""
    if call.outcome != "failed":
        return
    kills = servers[call.server].kills
    if CHAOS in call.error:
        call.outcome, call.fault = "failed_injected", "chaos_oom" if "out of memory" in call.error else "chaos_error"
    elif ENGINE_GONE in call.error and any(call.start <= k <= call.end for k in kills):
        call.outcome, call.fault = "failed_injected", "engine_killed"
    else:
        call.outcome = "failed_other"


# -- the run -----------------------------------------------------------------------------------------------

def solo_texts(servers: dict[str, Server], menu, deadline: float) -> dict:
    """Each greedy (prompt, max_new_tokens) run alone on each server, one after another, before the soak.
    A solo run the chaos hook fails is run again (the hook picks requests by their id)."""
    clients = Clients(servers, deadline)
    solo = {}
    try:
        for server in ("app", "serve"):
            for j, (prompt, n) in enumerate(menu):
                for _ in range(4):
                    call = Call(-1 - j, server, "whole", prompt, n, dict(GREEDY))
                    clients.send(call)
                    if call.outcome == "finished":
                        solo[server, prompt, n] = call.text
                        break
                    if CHAOS not in call.error:
                        raise RuntimeError(f"a solo run on {server} failed: {call.error}")
                else:
                    raise RuntimeError(f"a solo run on {server} failed 4 times: {call.error}")
    finally:
        clients.close()
    return solo


def soak(args) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="specdec-soak-"))
    t_boot = time.monotonic()
    servers = start_servers(args, logs)
    try:
        report = {"startup_s": round(time.monotonic() - t_boot, 1), "logs": str(logs)}
        report.update(drive(args, servers))
    finally:
        stop_servers(servers)
    report["server_tracebacks"] = {s.name: s.log.read_text(errors="replace").count("Traceback (most recent")
                                   for s in servers.values()}
    return report


def drive(args, servers: dict[str, Server]) -> dict:
    menu = greedy_menu(args.seed, args.greedy_prompts)
    t0 = time.monotonic()
    solo = solo_texts(servers, menu, args.deadline)
    solo_s = time.monotonic() - t0
    warm = [plan(-1000 - i, args, menu) for i in range(2 * args.concurrency)]  # batches of every shape
    _in_parallel(servers, args, lambda c, k: c.send(warm[k]) if k < len(warm) else None, len(warm))
    before = {s.name: s.usage() for s in servers.values()}

    calls: list[Call] = []
    lock = threading.Lock()
    counter = iter(range(args.requests))
    start = time.monotonic()
    stop_at = start + args.seconds

    def worker(clients: Clients, k: int) -> None:
        rng = random.Random(args.seed + 7919 * k)
        while True:
            time.sleep(rng.expovariate(1 / args.mean_gap))
            with lock:
                i = next(counter, None)
                if i is None or time.monotonic() > stop_at:
                    return
                call = plan(i, args, menu)
                calls.append(call)
            clients.send(call)

    killer = threading.Thread(target=kill_engines, args=(servers, args, start), daemon=True)
    killer.start()
    samples: list = []  # (seconds, server MB, engine MB) per server, to tell a plateau from a trend
    sampler = threading.Thread(target=sample_rss, args=(servers, samples, start, stop_at), daemon=True)
    sampler.start()
    threads = _in_parallel(servers, args, worker, None, wait=False)
    # Bounded: a request gets `deadline` seconds; one still running then is lost, and its thread is left behind.
    give_up = stop_at + args.deadline
    for t in threads:
        t.join(max(0.0, give_up - time.monotonic()))
    killer.join(max(0.0, give_up - time.monotonic()))
    wall = time.monotonic() - start
    with lock:
        calls = list(calls)
    for c in calls:
        if c.end is not None and c.end - c.start > args.deadline:
            c.outcome, c.error = "", f"ended after {c.end - c.start:.0f} s, past the deadline"
        classify(c, servers)
    idle = {s.name: wait_idle(s, args.deadline) for s in servers.values()}
    # One more greedy request on each server, so that a server killed late in the run shows it serves again.
    probes = [Call(args.requests + k, name, "whole", *menu[k % len(menu)], dict(GREEDY))
              for k, name in enumerate(servers)]
    _in_parallel(servers, args, lambda cl, k: cl.send(probes[k]) if k < len(probes) else None, len(probes))
    for c in probes:
        classify(c, servers)
    calls += probes
    after = {s.name: s.usage() for s in servers.values()}
    sampler.join(10)
    report = summarize(calls, servers, solo, before, after, idle, wall, solo_s, args)
    for name in servers:
        report["servers"][name]["rss_mb_over_time"] = [x[1:] for x in samples if x[0] == name]
    return report


def _in_parallel(servers, args, fn, count: int | None, wait: bool = True) -> list[threading.Thread]:
    """`args.concurrency` threads, each with its own clients, calling fn(clients, thread index) (with
    `count`: fn(clients, k) for k = index, index + concurrency, ... below count)."""
    def body(k: int) -> None:
        clients = Clients(servers, args.deadline)
        try:
            if count is None:
                fn(clients, k)
            else:
                for j in range(k, count, args.concurrency):
                    fn(clients, j)
        finally:
            clients.close()

    threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(args.concurrency)]
    for t in threads:
        t.start()
    if wait:
        for t in threads:
            t.join(args.deadline * (1 + (count or 0) // args.concurrency))
    return threads


def summarize(calls, servers, solo, before, after, idle, wall, solo_s, args) -> dict:
    kinds = ("finished", "cancelled", "failed_injected", "failed_other")
    lost = [c for c in calls if c.end is None or not c.outcome]
    greedy = [c for c in calls if c.greedy and c.outcome == "finished"
              and (c.server, c.prompt, c.max_new_tokens) in solo]
    differ = [c for c in greedy if c.text != solo[c.server, c.prompt, c.max_new_tokens]]
    per_server = {}
    for name, s in servers.items():
        mine = [c for c in calls if c.server == name]
        recovered = [c.end - s.kills[0] for c in mine if s.kills and c.start > s.kills[0] and c.outcome == "finished"]
        per_server[name] = {
            "sent": len(mine), **{k: sum(c.outcome == k for c in mine) for k in kinds},
            "faults": {f: sum(c.fault == f for c in mine) for f in FAULTS},
            "greedy_compared": sum(c.server == name for c in greedy),
            "greedy_equal_solo": sum(c.server == name for c in greedy) - sum(c.server == name for c in differ),
            "by_how": {h: sum(c.how == h for c in mine) for h in ("whole", "stream", "cancel", "drop")},
            "killed_engine": bool(s.kills),
            "first_success_after_kill_s": round(min(recovered), 1) if recovered else None,
            "usage_after_warmup": before[name], "usage_end": after[name],
            "rss_growth": {"server": grew(before[name]["server"], after[name]["server"]),
                           "engine": grew(before[name]["engine"], after[name]["engine"])},
            "idle_at_end": {k: v for k, v in idle[name].items() if k != "metrics"},
            "server_metrics": idle[name]["metrics"],
        }
    faults = {f: sum(c.fault == f for c in calls) for f in FAULTS}
    checks = {
        "no_lost": not lost,
        "no_failed_other": not any(c.outcome == "failed_other" for c in calls),
        "greedy_equal_solo": not differ,
        "rss_within_bound": all(g is None or g["within_bound"]
                                for p in per_server.values() for g in p["rss_growth"].values()),
        "served_after_kill": all(p["first_success_after_kill_s"] is not None for p in per_server.values()
                                 if p["killed_engine"]),
        "idle_at_end": all(p["idle_at_end"]["idle"] for p in per_server.values()),
        "restarts_counted": all(p["idle_at_end"]["restarts_counted"] for p in per_server.values()),
    }
    return {
        "seconds": args.seconds, "wall_s": round(wall, 1), "solo_runs_s": round(solo_s, 1),
        "concurrency": args.concurrency, "seed": args.seed, "chaos": args.chaos,
        "sent": len(calls), **{k: sum(c.outcome == k for c in calls) for k in kinds}, "lost": len(lost),
        "faults": faults,
        "greedy_compared": len(greedy), "greedy_equal_solo": len(greedy) - len(differ),
        "greedy_equal_fraction": (len(greedy) - len(differ)) / len(greedy) if greedy else None,
        "rss_bound": f"growth < {RSS_BOUND[0]:.0%} or < {RSS_BOUND[1]:.0f} MB, per process",
        "servers": per_server, "checks": checks, "ok": all(checks.values()),
        "lost_requests": [_brief(c) for c in lost][:10],
        "failed_other_requests": [_brief(c) for c in calls if c.outcome == "failed_other"][:10],
        "greedy_differences": [{**_brief(c), "solo": solo[c.server, c.prompt, c.max_new_tokens][:120]}
                               for c in differ][:10],
    }


def _brief(c: Call) -> dict:
    d = asdict(c)
    d["prompt"], d["text"] = d["prompt"][:60], d["text"][:120]
    return d


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300.0, help="send new requests for this long")
    ap.add_argument("--requests", type=int, default=100_000, help="send at most this many requests")
    ap.add_argument("--concurrency", type=int, default=8, help="client threads, each with its own clients")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mean-gap", type=float, default=0.3, help="mean seconds a client waits between requests")
    ap.add_argument("--chaos", type=float, default=0.05, help="the app's --chaos fraction (0: no chaos hook)")
    ap.add_argument("--kill-at", type=float, default=0.3,
                    help="SIGKILL the app's engine process at this fraction of the run (0: never)")
    ap.add_argument("--kill-serve-at", type=float, default=0.5,
                    help="SIGKILL serve's engine process at this fraction of the run (0: never)")
    ap.add_argument("--greedy-prompts", type=int, default=12,
                    help="greedy (prompt, length) pairs, each run alone on each server first")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds a request may take before it counts as lost")
    ap.add_argument("--startup-timeout", type=float, default=240.0)
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.requests < 1 or args.concurrency < 1 or args.mean_gap <= 0:
        ap.error("--seconds, --requests, --concurrency and --mean-gap must be positive")
    if not 0 <= args.chaos <= 1 or not 0 <= args.kill_at < 1 or not 0 <= args.kill_serve_at < 1:
        ap.error("--chaos must be in [0, 1], --kill-at and --kill-serve-at in [0, 1)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = soak(args)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
