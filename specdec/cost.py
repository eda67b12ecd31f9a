"""The measured cost of a round on this machine: what the dynamic tree trades acceptance against.

T(N) = forward(N) + heads·[the heads ran] + overhead (+ verify per extra node visited, when sampling), each
term timed by `measure` on the loaded model in a couple of seconds. forward(N) grows with N on a CPU and is
nearly flat up to tens of nodes on a GPU, so the same policy drafts small trees on one and big on the other.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import kv_cache
from .draft_tree import PRESETS, build_tree
from .sampler import SamplingParams, sample, target_probs

if TYPE_CHECKING:
    from .engine import Engine
    from .events import RoundEvent
    from .target import TargetModel

NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # where forward(N) is timed
CONTEXT = 128  # committed tokens during measurement: a typical prompt plus some output


@dataclass(frozen=True)
class CostModel:
    """Seconds per round as a function of tree size, for one model on one device and dtype."""

    nodes: tuple[int, ...]  # measured node counts, ascending, nodes[0] == 1
    forward_s: tuple[float, ...]  # target forward (+ vocabulary rows) at each count, nondecreasing
    heads_s: float  # one heads forward and its top-k
    overhead_s: float  # everything else in a round, per round
    key: str = ""  # what it was measured for (model, device, dtype, threads)
    verify_s: float = 0.0  # sampled verification, per visited node after the root
    drafted_s: float = 0.0  # host work a drafted round adds to a plain one (tree buffers, walk, nodes)

    def __post_init__(self) -> None:
        if not self.nodes or self.nodes[0] != 1 or len(self.nodes) != len(self.forward_s):
            raise ValueError("a CostModel needs forward times at ascending node counts starting at 1")

    @property
    def max_nodes(self) -> int:
        return self.nodes[-1]

    def forward(self, n: int) -> float:
        """forward(n) in seconds: linear between measured counts, the last slope beyond them."""
        xs, ys = self.nodes, self.forward_s
        if n <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if n <= xs[i]:
                w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
        return ys[-1] + slope * (n - xs[-1])

    def round_time(self, n: int, heads: float, visited: float = 1.0, sampled: bool = False) -> float:
        """T(n): one round drafting an n-node tree (n = 1 is a plain round).

        Args:
            heads: the share of the heads that ran: 1, 1/K for a probe of the first, or 0.
            visited: nodes verification visits, root included (sampled verification pays per node).
        """
        extra = self.verify_s * max(visited - 1.0, 0.0) if sampled else 0.0
        drafted = self.drafted_s if n > 1 else 0.0
        return self.forward(n) + self.heads_s * float(heads) + self.overhead_s + drafted + extra

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CostModel":
        d = json.loads(text)
        return cls(tuple(d["nodes"]), tuple(d["forward_s"]), d["heads_s"], d["overhead_s"], d.get("key", ""),
                   d.get("verify_s", 0.0), d.get("drafted_s", 0.0))


def model_key(engine: "Engine") -> str:
    """What a cost depends on: the model's shape, the device, the dtype, threads, and the software."""
    target = engine.target
    cfg = target.model.config.to_json_string(use_diff=False)
    device = target.device
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    heads = (engine.heads.config, engine.heads.projection_dtype) if engine.heads is not None else None
    attention = getattr(target.model.config, "_attn_implementation", None)  # not in the config's JSON
    raw = "|".join(map(str, (cfg, heads, device.type, where, target.dtype, torch.get_num_threads(),
                             torch.__version__, os.cpu_count(), attention, target.packed_rows is not None)))
    if target.graphs is not None:  # replayed graphs cost far less than eager forwards: a separate model
        raw += "|graphs"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


_MEASURED: dict[str, CostModel] = {}  # this process's measurements by `model_key`: a second load reuses one
_MEASURING = threading.Lock()  # one measurement at a time: two at once would share the cores and both read slow


def load_or_measure(engine: "Engine", cache_dir: str | Path | None, budget_s: float = 2.0) -> CostModel:
    """The cached cost model for this model + device + dtype, else this process's, else a fresh measurement."""
    key = model_key(engine)
    path = cache_file(cache_dir, key) if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            model = CostModel.from_json(path.read_text())
            if model.key == key:
                return model
        except (ValueError, KeyError, TypeError):
            pass  # a stale or damaged file is measured again and overwritten
    with _MEASURING:
        model = _MEASURED.get(key) or measure(engine, budget_s)
        _MEASURED[key] = model
    if path is not None:
        save(model, path)
    return model


def cache_file(cache_dir: str | Path, key: str) -> Path:
    """Where the cost model of `key` (see `model_key`) is kept in a cache folder."""
    return Path(cache_dir) / f"cost-{key}.json"


def save(model: CostModel, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(model.to_json())
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # a read-only home only costs a re-measurement next load


@torch.inference_mode()
def measure(engine: "Engine", budget_s: float = 2.0, max_nodes: int = 64, reps: int = 12) -> CostModel:
    """Time forward(N), the heads and the overhead in about `budget_s`; counts past it are extrapolated."""
    target = engine.target
    deadline = time.perf_counter() + budget_s
    ctx = max(1, min(CONTEXT, (target.max_length or 1 << 30) - max_nodes - 2))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.vocab_size, (ctx + max_nodes,), generator=gen)
    # The request path's own kind of buffer: with CUDA graphs, the pooled one their replays write.
    cache = target.new_cache(ctx + 2 * max_nodes + 1 if target.slots else None)
    try:
        return _measure(engine, cache, ids, ctx, deadline, budget_s, max_nodes, reps)
    finally:
        target.release(cache)


def _measure(engine: "Engine", cache, ids: torch.Tensor, ctx: int, deadline: float, budget_s: float,
             max_nodes: int, reps: int) -> CostModel:
    target = engine.target
    target.forward(ids[:ctx], cache)
    shape = PRESETS["default"]  # the node layout does not change the cost; its size does

    def forward(n: int) -> None:
        toks = ids[ctx : ctx + n]
        if n == 1:
            hidden = target.forward(toks, cache)
        else:
            tree = build_tree(shape[: n - 1])
            hidden = target.forward(toks, cache, tree.ancestor_mask, tree.depth_t)
        # every row's argmax and one host sync, as greedy verify; one row packed, as a speculative round reads it
        target.logits(hidden, pack_one=True).argmax(-1).tolist()
        kv_cache.keep_path(cache, ctx, [])

    # Median ratios to a paired one-node forward, times the fastest: busy cores slow calls, never speed them.
    counts = [n for n in NODE_COUNTS if n <= max_nodes]
    ones: list[float] = []
    ratios: dict[int, list[float]] = {1: [1.0]}
    for rep in range(reps + 1):  # the first pass is the warm-up
        for n in counts[1:]:
            if rep > 1 and time.perf_counter() > deadline - 0.2 * budget_s:
                break  # leave time for the heads, verification and the overhead
            t1, tn = _timed(lambda: forward(1)), _timed(lambda: forward(n))
            if rep:
                ones.append(t1)
                ratios.setdefault(n, []).append(tn / t1)
    nodes = [n for n in counts if n in ratios]
    # Timing noise must not make a bigger tree look cheaper: the nondecreasing curve nearest the medians.
    times = _nondecreasing([min(ones) * statistics.median(ratios[n]) for n in nodes])
    if nodes[-1] < max_nodes and len(nodes) > 1:  # extrapolate what the budget did not reach
        slope = (times[-1] - times[-2]) / (nodes[-1] - nodes[-2])
        nodes.append(max_nodes)
        times.append(times[-1] + slope * (max_nodes - nodes[-2]))
    heads_s = 0.0
    if engine.heads is not None:
        # Heads + forward against a forward alone, as on a CPU the heads also slow the next forward (cache).
        h = target.forward(ids[ctx : ctx + 1], cache)[-1]
        kv_cache.keep_path(cache, ctx, [])

        def heads() -> None:
            torch.topk(engine.head_logits(h).float().softmax(-1), 10, -1)[0].tolist()

        def heads_then_forward() -> None:
            heads()
            forward(1)

        added = []
        for rep in range(2 * reps + 1):
            t1, th = _timed(lambda: forward(1)), _timed(heads_then_forward)
            if rep:
                added.append((th - t1) / t1)
        # In the forward curve's scale so a busy moment moves both alike, and never below the heads alone.
        heads_s = max(statistics.median(added) * min(ones), _time(heads, reps))
    row = target.logits(target.forward(ids[ctx : ctx + 1], cache)[-1], pack_one=True)  # [V]
    kv_cache.keep_path(cache, ctx, [])
    target.release(cache)  # the requests below may want the pooled buffer
    law = SamplingParams(temperature=0.7, top_p=0.9)  # the app's default law: filters that cut
    draws = torch.Generator(device=row.device).manual_seed(0)
    verify_s = _time(lambda: sample(target_probs(row, law), draws), reps)
    # On CUDA a round's forward lap times only the launch, so the measured curve stands in for it.
    curve = CostModel(tuple(nodes), tuple(times), heads_s, 0.0).forward if target.device.type == "cuda" else None
    # The median of paired turns, as a busy moment can fall on the plain or the drafted run.
    plain, drafted = [], []
    for _ in range(3):
        plain.append(_overhead(engine, ids[:16].tolist(), curve))
        drafted.append(_drafted_overhead(engine, ids[:3].tolist() * 6, plain[-1], curve))
    overhead_s, drafted_s = statistics.median(plain), statistics.median(drafted)
    return CostModel(tuple(nodes), tuple(times), heads_s, overhead_s, model_key(engine), verify_s, drafted_s)


@torch.inference_mode()
def packed_rows_pay(target: "TargetModel", rows: int = 8, reps: int = 12, margin: float = 0.9,
                    budget_s: float = 0.5) -> bool:
    """Do `rows` vocabulary rows take under `margin` of the lm_head's time through `packed`'s oneDNN product?

    Args:
        target: its lm_head is timed right after a forward, as verification runs it; False unmeasured
            where oneDNN cannot run it or it has under 256K weights (a few µs either way).
    """
    from . import packed

    if not packed.available(target.lm_head) or target.lm_head.weight.numel() < 1 << 18:
        return False
    ids = torch.arange(rows, device=target.device) % target.vocab_size
    candidate = packed.PackedProjection(target.lm_head)

    def trial(project) -> float:  # right after a forward, as verification runs (the warm-up packs the weight)
        hidden = target.forward(ids, kv_cache.new_cache(target.model))  # [rows, H]
        return _timed(lambda: project(hidden).argmax(-1).tolist())

    try:
        times = _interleaved({"own": lambda: trial(target.lm_head), "packed": lambda: trial(candidate)}, reps,
                             budget_s)
    except RuntimeError:  # this build's oneDNN refuses the product: keep the model's own
        return False
    return times["packed"] < margin * times["own"]


@torch.inference_mode()
def serving_threads(target: "TargetModel", tokens: tuple[int, ...] = (16, 64), reps: int = 12, margin: float = 1.25,
                    budget_s: float = 1.0) -> tuple[int, dict]:
    """Intra-op threads for serving on a CPU; run on a thread that then ends, before the scheduler's first op.

    Returns:
        (1 if one thread runs `tokens`-token forwards within `margin` of the default count's time, else the
        default; what was timed: median ms per count and size).
    """
    # Between ops a spare OpenMP thread spins on a core the web server needs: a slower forward can serve more.
    default = torch.get_num_threads()
    if target.device.type != "cpu" or default <= 1:
        return default, {}
    def trial(count: int, n: int) -> float:
        torch.set_num_threads(count)
        ids = torch.arange(n, device=target.device) % target.vocab_size
        return _timed(lambda: target.forward(ids, kv_cache.new_cache(target.model)))

    try:
        times = _interleaved({(c, n): (lambda c=c, n=n: trial(c, n)) for c in (default, 1) for n in tokens},
                             reps, budget_s)
    finally:
        torch.set_num_threads(default)
    ms = {count: {n: round(times[count, n] * 1e3, 3) for n in tokens} for count in (default, 1)}
    slowest = max(ms[1][n] / ms[default][n] for n in tokens)  # one thread's worst size, as a share of the default's
    return (1 if slowest <= margin else default), {"default": default, "ms": ms}


def _interleaved(trials: dict, reps: int, budget_s: float) -> dict:
    """Median seconds of each trial (a callable returning seconds), run in turns so a busy moment hits all.

    Args:
        reps: passes after one warm-up pass, stopping after `budget_s` once two have run.
    """
    times: dict = {key: [] for key in trials}
    deadline = time.perf_counter() + budget_s
    for rep in range(reps + 1):
        for key, trial in trials.items():
            t = trial()
            if rep:  # the first pass warms up
                times[key].append(t)
        if rep >= 2 and time.perf_counter() > deadline:
            break
    return {key: statistics.median(ts) for key, ts in times.items()}


def _nondecreasing(ys: list[float]) -> list[float]:
    """The least-squares nondecreasing fit of ys (pool adjacent violators: each run that falls is averaged)."""
    blocks: list[list[float]] = []  # [sum, count] per pooled run
    for y in ys:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def _overhead(engine: "Engine", prompt: list[int], forward_s=None) -> float:
    """The host time of a plain round outside its forward and its row: the engine's own loop, measured."""
    from .request import GenerationRequest  # the request module imports the engine's tree types

    events = list(engine.stream(GenerationRequest(prompt, 12, speculative=False, eos_token_id=None)))
    rest = sorted(_outside(e, forward_s) for e in events[2:])
    return rest[len(rest) // 4] if rest else 0.0  # a low quantile, for the same reason as `measure`


def _drafted_overhead(engine: "Engine", prompt: list[int], plain: float, forward_s=None) -> float:
    """Host time a drafted round adds to a plain one: lookup rounds on a repeating prompt, less `plain`."""
    from .request import GenerationRequest

    events = list(engine.stream(GenerationRequest(prompt, 24, tree="none", lookup=4, eos_token_id=None)))
    rest = sorted(_outside(e, forward_s) for e in events[1:] if len(e.nodes) > 1)
    return max(rest[len(rest) // 4] - plain, 0.0) if rest else 0.0


def _outside(ev: "RoundEvent", forward_s=None) -> float:
    """A round's seconds outside its forward and its vocabulary rows, which forward(N) already times.

    Args:
        forward_s: forward(N) in seconds, subtracted instead of the round's laps (on CUDA they time only
            the launches); None: the laps.
    """
    t = ev.timings
    if forward_s is not None:
        return max(t["total"] / 1e3 - forward_s(max(len(ev.nodes), 1)), 0.0)
    return (t["total"] - t["forward"] - t.get("rows", 0.0)) / 1e3


def _timed(fn) -> float:
    start = _now()
    fn()
    return _now() - start


def _now() -> float:
    """The host clock, after the device has finished what was queued."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _time(fn, reps: int) -> float:
    """The fastest of `reps` calls after one warm-up (see `measure` for why the minimum)."""
    fn()
    out = []
    for _ in range(reps):
        start = _now()
        fn()
        out.append(_now() - start)
    return min(out)
