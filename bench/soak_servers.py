"""The soak test's servers: the Gradio app and `specdec serve` as subprocesses on loopback, their metrics,
memory, file descriptors and threads, and the SIGKILL of their engine processes (`bench.soak` drives them)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
RSS_BOUND = (0.15, 100.0)  # growth allowed from warm-up to the end: within 15% or within 100 MB


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
