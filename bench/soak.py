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
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
from openai import APITimeoutError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from loadtest import one_request

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = json.loads((ROOT / "assets" / "static" / "examples.json").read_text())
RSS_BOUND = (0.15, 100.0)  # growth allowed from warm-up to the end: within 15% or within 100 MB
NEW_TOKENS = (8, 16, 32, 64, 96)
LONG_TOKENS = 200  # cancelled and dropped requests ask for this many, so they are still running when cut
ENGINE_GONE = "the engine's process ended"  # specdec.supervisor's words for a request in flight at a death
CHAOS = "injected by the chaos hook"
FAULTS = ("chaos_oom", "chaos_error", "engine_killed")
GREEDY = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)


@dataclass
class Call:
    """One request: what is sent, how the client behaves, and how it ended."""

    id: int
    server: str  # app / serve
    how: str  # whole / stream / cancel / drop
    prompt: str
    max_new_tokens: int
    sampling: dict  # temperature, top_k, top_p, min_p, seed
    start: float = 0.0
    end: float | None = None
    outcome: str = ""  # finished / cancelled / failed_injected / failed_other (lost: end stays None)
    fault: str = ""  # for failed_injected: chaos_oom / chaos_error / engine_killed
    error: str = ""
    text: str = ""

    @property
    def greedy(self) -> bool:
        return self.sampling["temperature"] == 0


def prompt_variant(rng: random.Random) -> str:
    """An example prompt cut to a prefix, kept whole, or repeated up to 6 times: 1 to ~150 tokens."""
    text = rng.choice(EXAMPLES)
    shape = rng.random()
    if shape < 0.3:
        return text[: rng.randint(4, max(4, len(text)))]
    return text if shape < 0.6 else "\n".join([text] * rng.randint(2, 6))


def greedy_menu(seed: int, size: int) -> list[tuple[str, int]]:
    """The (prompt, max_new_tokens) pairs greedy requests draw from: each is run alone once per server first."""
    rng = random.Random(seed)
    menu = dict.fromkeys((prompt_variant(rng), rng.choice(NEW_TOKENS)) for _ in range(size * 4))
    return list(menu)[:size]


def plan(i: int, args, menu: list[tuple[str, int]]) -> Call:
    """Request i of the soak, drawn from its own seeded generator (the same whichever thread sends it)."""
    rng = random.Random(args.seed * 1_000_003 + i)
    server = rng.choice(("app", "serve"))
    r = rng.random()
    how = "cancel" if r < 0.12 else "drop" if r < 0.2 and server == "serve" else "whole"
    if how == "whole" and server == "serve" and rng.random() < 0.5:
        how = "stream"
    if how in ("cancel", "drop"):
        prompt, n = prompt_variant(rng), LONG_TOKENS
    elif rng.random() < 0.5:
        return Call(i, server, how, *rng.choice(menu), dict(GREEDY))
    else:
        prompt, n = prompt_variant(rng), rng.choice(NEW_TOKENS)
    sampling = dict(temperature=round(rng.uniform(0.3, 1.2), 3), top_k=rng.choice((0, 20, 50)),
                    top_p=rng.choice((1.0, 0.95, 0.9)), min_p=rng.choice((0.0, 0.05)), seed=rng.randrange(10**6))
    return Call(i, server, how, prompt, n, sampling)


# -- the servers -------------------------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str
    log: Path
    ready: str  # the path that answers 200 once the server serves
    kills: list = field(default_factory=list)  # times its engine process was killed
    model: str = ""  # the model's name in the OpenAI API (serve)

    def engine(self) -> psutil.Process | None:
        """The engine process: the multiprocessing child of this server (not its resource tracker)."""
        for child in psutil.Process(self.proc.pid).children():
            try:
                if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def usage(self) -> dict:
        """RSS (MB), open descriptors and threads of the server's process and of its engine's."""
        out = {"server": proc_usage(self.proc.pid)}
        eng = self.engine()
        out["engine"] = proc_usage(eng.pid) if eng is not None else None
        return out

    def metrics(self) -> dict:
        text = httpx.get(self.url + "metrics", timeout=10).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if fam.name in ("specdec_requests", "specdec_request_failures", "specdec_engine_restarts",
                                "specdec_requests_in_flight") and not s.name.endswith("_created"):
                    label = ",".join(f"{v}" for v in s.labels.values())
                    out[s.name + (f"{{{label}}}" if label else "")] = s.value
        return out


def proc_usage(pid: int) -> dict:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"pid": pid, "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": int(status["Threads"])}


def start_servers(args, logs: Path) -> dict[str, Server]:
    """Start both servers at once (they load in parallel) and wait until each answers."""
    chaos = ["--chaos", str(args.chaos)] if args.chaos else []
    cmds = {"app": [sys.executable, "app.py", "--max-batch-size", "4", *chaos],
            "serve": [sys.executable, "-m", "specdec", "serve", "--max-batch-size", "4"]}
    servers = {}
    for name, cmd in cmds.items():
        port, log = free_port(), logs / f"{name}.log"
        proc = subprocess.Popen(cmd + ["--port", str(port)], cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=log.open("w"), stderr=subprocess.STDOUT)
        servers[name] = Server(name, proc, f"http://127.0.0.1:{port}/", log, "" if name == "app" else "health")
    deadline = time.monotonic() + args.startup_timeout
    for s in servers.values():
        while True:
            if s.proc.poll() is not None:
                raise RuntimeError(f"{s.name} exited with {s.proc.returncode} while starting:\n{tail(s.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{s.name} did not answer within {args.startup_timeout} s:\n{tail(s.log)}")
            try:
                if httpx.get(s.url + s.ready, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
    servers["serve"].model = httpx.get(servers["serve"].url + "v1/models", timeout=10).json()["data"][0]["id"]
    return servers


def stop_servers(servers: dict[str, Server]) -> None:
    """SIGTERM each server, then SIGKILL whatever of it (engine included) is still there after 15 s."""
    for s in servers.values():
        kids = psutil.Process(s.proc.pid).children(recursive=True) if s.proc.poll() is None else []
        s.proc.terminate()
        try:
            s.proc.wait(15)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(5)
        for kid in kids:
            if kid.is_running():
                kid.kill()


def tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


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


def sample_rss(servers: dict[str, Server], samples: list, start: float, stop_at: float, every: float = 15.0) -> None:
    """[server, seconds into the run, server MB, engine MB] every `every` seconds while requests are sent."""
    while time.monotonic() < stop_at:
        for s in servers.values():
            try:
                u = s.usage()
            except (OSError, KeyError, psutil.Error):  # its engine died between the listing and the reading
                continue
            samples.append((s.name, round(time.monotonic() - start), u["server"]["rss_mb"],
                            u["engine"]["rss_mb"] if u["engine"] else None))
        time.sleep(min(every, max(0.0, stop_at - time.monotonic())))


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


def kill_engines(servers: dict[str, Server], args, start: float) -> None:
    """SIGKILL the app's engine process at --kill-at of the run, and serve's at --kill-serve-at."""
    for name, at in sorted((("app", args.kill_at), ("serve", args.kill_serve_at)), key=lambda x: x[1]):
        if at <= 0:
            continue
        time.sleep(max(0.0, start + at * args.seconds - time.monotonic()))
        s = servers[name]
        busy_by = time.monotonic() + 5.0  # a kill with requests in flight, so that their failure is seen
        while s.metrics().get("specdec_requests_in_flight", 0.0) < 1 and time.monotonic() < busy_by:
            time.sleep(0.02)
        eng = s.engine()
        if eng is None:
            continue
        s.kills.append(time.monotonic())
        os.kill(eng.pid, signal.SIGKILL)


def wait_idle(s: Server, timeout: float) -> dict:
    """Poll until the server has no request in flight (serve: its scheduler tracks none) and has counted a
    restart for each kill of its engine, up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        m = s.metrics()
        state = {"in_flight": m.get("specdec_requests_in_flight", 0.0),
                 "restarts": m.get("specdec_engine_restarts_total", 0.0)}
        if s.name == "serve":
            health = httpx.get(s.url + "health", timeout=10)
            sched = health.json().get("scheduler", {}) if health.status_code == 200 else {"tracked": "no engine"}
            state.update({k: sched.get(k) for k in ("waiting", "prefilling", "decoding", "tracked", "lost")})
        busy = state["in_flight"] or any(state.get(k) for k in ("waiting", "prefilling", "decoding", "tracked"))
        restarted = state["restarts"] >= len(s.kills)
        if (not busy and restarted) or time.monotonic() > deadline:
            return {**state, "idle": not busy, "restarts_counted": restarted, "metrics": m}
        time.sleep(0.2)


def grew(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    mb = after["rss_mb"] - before["rss_mb"]
    frac = mb / before["rss_mb"]
    return {"mb": round(mb, 1), "fraction": round(frac, 3), "within_bound": frac < RSS_BOUND[0] or mb < RSS_BOUND[1]}


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
