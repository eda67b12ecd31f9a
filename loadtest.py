"""Load test for a running specdec app, through gradio_client, on loopback only.

    python app.py &                       # the app under test
    python loadtest.py --clients 8 --requests 4 --max-new-tokens 64
    python loadtest.py --clients 8 --disconnect 2   # 2 clients drop their stream midway
    python loadtest.py --shared-prefix system.txt   # every prompt starts with this text (prefix cache)

    python app.py --max-batch-size 1 --port 7861 &  # a chaos run: a one-at-a-time reference, then
    python app.py --chaos 0.25 --port 7862 &        # a batched server where about 25% of requests fail
    python loadtest.py --url http://127.0.0.1:7861/ --json ref.json
    python loadtest.py --url http://127.0.0.1:7862/ --reference ref.json   # others identical to ref.json?

    python loadtest.py --engine --max-new-tokens 64   # no app: the same requests, batch 1 vs 8 in-process

N concurrent clients each send up to --requests generations (bounded in
total time by --duration). For each request we record time to first
token (first streamed update carrying a token), time per output token
after the first, and end-to-end latency; the report gives completed,
failed and cancelled requests, requests/s, tokens/s, and p50/p90/p99.
With --reference (an earlier run's --json), every completed request's text
is compared with the reference text for the same prompt, seed and settings.
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from specdec.stats import percentiles, throughput

PROMPTS = [
    "def fibonacci(n):", "class Stack:", "import os\n\ndef list_files(path):", "def quicksort(items):",
    "class Config:\n    def __init__(self", "def read_json(path):", "for i in range(10):",
    "def is_prime(n):", "class Node:\n    def __init__(self, value):", "def main():\n    parser = argparse.",
]


@dataclass
class Result:
    client: int
    outcome: str  # ok / failed / cancelled
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    tokens: int = 0
    error: str = ""
    prompt: str = ""
    seed: int = 0
    text: str = ""


def one_request(client, cid: int, args, prompt: str, seed: int, disconnect: bool) -> Result:
    t0 = time.perf_counter()
    ttft, tokens, last = None, 0, None
    tree = {} if args.tree is None else {"tree": args.tree}  # omitted: the app's default (the trained tree)
    job = client.submit(prompt=prompt, temperature=args.temperature, top_k=0, top_p=1.0,
                        min_p=0.0, max_new_tokens=args.max_new_tokens, seed=seed, acceptance="lossless",
                        speculative=True, api_name="/generate", **tree)
    who = dict(prompt=prompt, seed=seed)
    try:
        for update in job:
            record = update[-1] if isinstance(update, (list, tuple)) else None
            n = int(record.get("new_tokens", 0)) if isinstance(record, dict) else 0
            if n > 0 and ttft is None:
                ttft = time.perf_counter() - t0
            tokens, last = max(tokens, n), record
            if disconnect and tokens >= max(2, args.max_new_tokens // 4):
                job.cancel()  # drop the stream midway: the server closes the generator, as for a closed tab
                return Result(cid, "cancelled", ttft, None, time.perf_counter() - t0, tokens, **who)
    except Exception as e:  # a failed request is data here, not a crash of the load test
        return Result(cid, "failed", ttft, None, time.perf_counter() - t0, tokens, repr(e)[:200], **who)
    e2e = time.perf_counter() - t0
    try:  # a request that fails mid-stream ends the iteration quietly too; the job keeps the error
        failure = job.exception(timeout=30)
    except Exception as e:  # noqa: BLE001 (reported, not raised)
        failure = e
    if failure is not None:
        return Result(cid, "failed", ttft, None, e2e, tokens, repr(failure)[:200], **who)
    if last is None or tokens == 0:
        try:  # an upstream error ends the iteration quietly; the job keeps it
            job.result()
            error = "no tokens streamed"
        except Exception as e:  # noqa: BLE001 (reported, not raised)
            error = repr(e)[:200]
        return Result(cid, "failed", ttft, None, e2e, tokens, error, **who)
    tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 and ttft is not None else None
    return Result(cid, "ok", ttft, tpot, e2e, tokens, **who, text=str(last.get("text", "")))


def run(args) -> dict:
    from gradio_client import Client

    host = urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"loadtest only targets loopback, got {args.url}")
    prefix = Path(args.shared_prefix).read_text() if args.shared_prefix else ""
    results: list[Result] = []
    lock = threading.Lock()
    # Every client connects (TLS context, the app's config and API info: ~0.2 s of CPU each) before
    # the clock starts, so the figures time the server's work, not the load generator's setup.
    clients = [None] * args.clients
    start = {}
    connected = threading.Barrier(args.clients + 1, action=lambda: start.update(t0=time.perf_counter(),
                                                                                 cpu0=time.process_time()))

    work = workload(args)

    def worker(cid: int) -> None:
        try:
            # Loopback over plain HTTP: no certificates to check. With verification on, every request
            # (httpx opens a client per submit and per stream) loads the CA bundle, ~30 ms of the load
            # generator's CPU taken from the server it shares the machine with.
            clients[cid] = Client(args.url, verbose=False, ssl_verify=False, analytics_enabled=False)
        finally:
            connected.wait()
        deadline = start["t0"] + args.duration
        for i in range(args.requests):
            if time.perf_counter() > deadline:
                break
            prompt, seed = work[cid * args.requests + i]
            r = one_request(clients[cid], cid, args, prefix + prompt, seed, disconnect=cid < args.disconnect and i == 0)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(args.clients)]
    [t.start() for t in threads]
    connected.wait()
    t0 = start["t0"]
    [t.join(args.duration + 120) for t in threads]
    wall = time.perf_counter() - t0
    cpu = time.process_time() - start["cpu0"]
    ok = [r for r in results if r.outcome == "ok"]
    report = {
        "clients": args.clients, "requests_per_client": args.requests, "max_new_tokens": args.max_new_tokens,
        "wall_seconds": wall,
        # This process's own CPU over the clock: on a machine the server shares, time taken from it.
        "load_generator_cpu_seconds": cpu,
        "completed": len(ok), "failed": sum(r.outcome == "failed" for r in results),
        "cancelled": sum(r.outcome == "cancelled" for r in results),
        "requests_per_second": throughput(len(ok), wall) or 0.0,
        "tokens_per_second": throughput(sum(r.tokens for r in ok), wall) or 0.0,
        "ttft_s": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": percentiles([r.tpot for r in ok if r.tpot is not None]),
        "e2e_s": percentiles([r.e2e for r in ok if r.e2e is not None]),
        "errors": [r.error for r in results if r.outcome == "failed"][:5],
        "results": [asdict(r) for r in results],
    }
    if args.reference:
        report["reference"] = compare_with(results, json.loads(Path(args.reference).read_text()), args)
    return report


def workload(args) -> list[tuple[str, int]]:
    """The (prompt, seed) pairs the clients send (before --shared-prefix), client by client: client c
    draws its requests from random.Random(seed + c), a prompt then a seed each."""
    out = []
    for cid in range(args.clients):
        rng = random.Random(args.seed + cid)
        for _ in range(args.requests):
            out.append((rng.choice(PROMPTS), rng.randrange(10**6)))
    return out


def engine_run(args) -> dict:
    """The load test's requests through the engine's scheduler in this process, without the app.

    Batch 1 and `--max-batch-size` alternate for `--repeats` passes over one loaded model (one
    cost model for both); each pass submits every request at once, as the clients do. Returns the
    median tokens/s of each size, their ratio, and whether every output matched between sizes.
    """
    import statistics

    import specdec
    from specdec.api import encode
    from specdec.lookup import DEFAULT_LOOKUP
    from specdec.scheduler import Scheduler

    loaded = specdec.load()
    work = workload(args)
    requests = [specdec.GenerationRequest(encode(loaded, prompt), args.max_new_tokens,
                                          specdec.SamplingParams(temperature=args.temperature, seed=seed),
                                          args.tree or "auto", True, "lossless", lookup=DEFAULT_LOOKUP)
                for prompt, seed in work]
    sizes = (1, args.max_batch_size)
    rates: dict[int, list[float]] = {b: [] for b in sizes}
    outputs: dict[int, list] = {}
    for rep in range(args.repeats + 1):  # pass 0 warms up (the cost model is measured on first use)
        for b in sizes:
            with Scheduler(loaded.engine, max_batch_size=b) as sched:
                t0 = time.perf_counter()
                tickets = [sched.submit(r) for r in requests]
                events = [t.result() for t in tickets]
                seconds = time.perf_counter() - t0
            tokens = [[tok.token_id for ev in evs for tok in ev.emitted] for evs in events]
            assert outputs.setdefault(b, tokens) == tokens, "a size's output changed between passes"
            if rep:
                rates[b].append(sum(map(len, tokens)) / seconds)
    med = {b: statistics.median(r) for b, r in rates.items()}
    return {"requests": len(requests), "max_new_tokens": args.max_new_tokens, "passes": args.repeats,
            "tokens_per_second": {str(b): rates[b] for b in sizes}, "median": {str(b): med[b] for b in sizes},
            "ratio": med[sizes[1]] / med[1], "identical": outputs[1] == outputs[sizes[1]]}


def compare_with(results: list[Result], reference: dict, args) -> dict:
    """How many completed requests produced exactly the reference run's text for the same request.

    Greedy text depends only on the prompt; sampled text also on the seed (and the same settings).
    """
    key = (lambda r: r["prompt"]) if args.temperature == 0 else (lambda r: (r["prompt"], r["seed"]))
    ref = {key(r): r["text"] for r in reference["results"] if r["outcome"] == "ok"}
    ok = [asdict(r) for r in results if r.outcome == "ok"]
    compared = [r for r in ok if key(r) in ref]
    same = [r for r in compared if r["text"] == ref[key(r)]]
    return {"compared": len(compared), "identical": len(same), "missing": len(ok) - len(compared),
            "different": [r["prompt"][:40] for r in compared if r["text"] != ref[key(r)]][:5]}


def markdown(rep: dict) -> str:
    f = lambda x: "-" if x is None else f"{x * 1000:.0f} ms"  # noqa: E731
    lines = [
        f"clients {rep['clients']}, {rep['requests_per_client']} requests each, {rep['max_new_tokens']} new tokens, "
        f"wall {rep['wall_seconds']:.1f} s",
        "",
        "| completed | failed | cancelled | requests/s | tokens/s |",
        "| --- | --- | --- | --- | --- |",
        f"| {rep['completed']} | {rep['failed']} | {rep['cancelled']} | {rep['requests_per_second']:.2f} | "
        f"{rep['tokens_per_second']:.1f} |",
        "",
        "| latency | p50 | p90 | p99 |",
        "| --- | --- | --- | --- |",
    ]
    for key, name in (("ttft_s", "time to first token"), ("tpot_s", "time per output token"),
                      ("e2e_s", "end-to-end")):
        p = rep[key]
        lines.append(f"| {name} | {f(p['p50'])} | {f(p['p90'])} | {f(p['p99'])} |")
    ref = rep.get("reference")
    if ref is not None:
        lines += ["", f"identical to the reference run: {ref['identical']} of {ref['compared']} completed requests"
                      + (f" ({ref['missing']} without a reference)" if ref["missing"] else "")]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:7860/")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--duration", type=float, default=300.0, help="stop sending new requests after this many seconds")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tree", default=None, help="draft tree name (default: the app's default tree)")
    ap.add_argument("--disconnect", type=int, default=0, help="this many clients drop their first stream midway")
    ap.add_argument("--shared-prefix", default=None, help="a text file put before every prompt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the full report here")
    ap.add_argument("--reference", default=None,
                    help="an earlier run's --json: compare each completed request's text with it")
    ap.add_argument("--allow-failures", action="store_true",
                    help="exit 0 even when requests failed (a chaos run against `app.py --chaos`)")
    ap.add_argument("--engine", action="store_true",
                    help="no app: the same requests through the scheduler in this process, batch 1 against "
                         "--max-batch-size, alternately for --repeats passes")
    ap.add_argument("--max-batch-size", type=int, default=8, help="with --engine: the batched size")
    ap.add_argument("--repeats", type=int, default=5, help="with --engine: timed passes per size")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.requests < 1:
        ap.error("--clients and --requests must be >= 1")
    if args.max_batch_size < 1 or args.repeats < 1:
        ap.error("--max-batch-size and --repeats must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.engine:
        rep = engine_run(args)
        print(json.dumps(rep, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(rep, indent=2))
        return 0 if rep["identical"] else 1
    rep = run(args)
    print(markdown(rep))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rep, fh, indent=2)
    ref = rep.get("reference")
    differs = ref is not None and ref["identical"] != ref["compared"]
    return 1 if (rep["failed"] and not args.allow_failures) or differs else 0


if __name__ == "__main__":
    raise SystemExit(main())
