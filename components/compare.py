"""Compare: race speculative against plain decoding on one engine clock, and say why one won.

`RaceView` is a part of `Handlers`: it reads `gate` (the engine's narrow face) and `validate`.
The race's numbers and words are pure functions in race.py.
"""
from __future__ import annotations

from .gate import ModelGate
from .race import race_markdown
from .session import Session
from .tokens import render_round
from .updates import Throttle, prompt_html, user_error

RACE_PAIRS = 3  # the shown race, then repeats with the lanes' order swapped in turn: one pair's ratio is noisy
COMPARE_HINT = ("**Compare**: race speculative against plain decoding (or against another drafter), side by side, "
                "and see why one wins.")


def lane_name(tree: str, heads: bool) -> str:
    """A lane's drafter and tree in words, from the drafter-and-tree menu's value."""
    if tree == "eagle3":
        return "EAGLE-3"
    if tree == "none" or not heads:
        return "prompt lookup alone" if tree == "none" else f"prompt lookup ({tree} tree)"
    return "heads, dynamic tree" if tree == "auto" else f"heads, {tree} tree"


class RaceView:
    gate: ModelGate

    def compare(self, prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree, acceptance, lookup,
                lookup_mode, chat, versus, session: Session):
        """Race speculative decoding against plain decoding, or against another drafter and tree (`versus`, a
        value of the drafter-and-tree menu), with identical settings and seed; explain the ratio.

        Both lanes advance on one engine clock: the lane that has used less engine time runs the
        next round, so the two panes grow as fast as each decoder really is. Then the race is timed again
        (`RACE_PAIRS` pairs in all, the lanes' order swapped in turn) and the median ratio is the verdict."""
        values = [v for _, v in self.tree_choices]
        if versus != "plain" and versus not in values:
            raise user_error(ValueError(f"`versus` must be 'plain' or one of {values}, got {versus!r}"))
        settings, ids = self.validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, tree,
                                      acceptance, True, lookup, lookup_mode, chat)
        other = None
        if versus != "plain":
            other, _ = self.validate(prompt, temperature, top_k, top_p, min_p, max_new_tokens, seed, versus,
                                     acceptance, True, lookup, lookup_mode, chat)
        run = session.start_run(prompt, ids, settings, main=False, chat=chat)
        params = settings.sampling_params(run.seed)
        stop = session.should_stop(run)
        lanes = {spec: {"events": [], "seconds": 0.0, "html": prompt_html(prompt), "prev": None, "done": False}
                 for spec in (True, False)}
        how = f" (prompt lookup {settings.lookup}, {settings.lookup_mode})" if settings.lookup else ""
        heads = bool(self.gate.info["heads"])
        names = (("speculative" + how, "plain decoding") if other is None
                 else (lane_name(settings.tree, heads) + how, lane_name(other.tree, heads) + how))

        def request(lane: bool, n: int | None = None):
            if lane or other is None:
                return settings.request(ids, params, lane, n)
            return other.request(ids, params, True, n)

        pairs: list[tuple[float, float]] = []  # each pair's engine seconds (first lane, second lane)

        def view(done: bool) -> tuple:
            s, b = lanes[True], lanes[False]
            md = race_markdown(s["events"], b["events"], pairs or [(s["seconds"], b["seconds"])], done=done,
                               max_new_tokens=settings.max_new_tokens, greedy=params.greedy,
                               acceptance=settings.acceptance, device=self.gate.device_name,
                               temperature=params.temperature, names=names, drafters=other is not None)
            return md, s["html"], b["html"]

        streams = {}
        try:
            # Untimed warm-up of both paths: first calls pay for kernel selection and allocator
            # growth. On CUDA that cost recurs for every new (query, cache) length, and can exceed
            # a whole run, so there the warm-up is the same run (same seed, so the same shapes).
            cuda = self.gate.info["device_type"] == "cuda"
            warm = settings.max_new_tokens if cuda else min(4, settings.max_new_tokens)
            yield "Warming up both decoders…", "", ""
            for spec in (True, False):
                s = self.gate.stream(request(spec, warm), solo=True, should_stop=stop)
                while self.gate.step(s)[0] is not None:
                    pass
            for spec in (True, False):
                streams[spec] = self.gate.stream(request(spec), solo=True, should_stop=stop)
            tick = Throttle(0.3)
            while not all(lane["done"] for lane in lanes.values()) and not run.stopped:
                spec = min((k for k in lanes if not lanes[k]["done"]), key=lambda k: lanes[k]["seconds"])
                lane = lanes[spec]
                ev, secs = self.gate.step(streams[spec])
                lane["seconds"] += secs
                if ev is None:
                    lane["done"] = True
                    continue
                lane["events"].append(ev)
                lane["html"] += render_round(ev, lane["prev"])
                lane["prev"] = ev.params
                if tick():
                    yield view(False)
            pairs.append((lanes[True]["seconds"], lanes[False]["seconds"]))
            for i in range(1, RACE_PAIRS):
                if run.stopped:
                    break
                md, a, b = view(False)
                yield (f"**Timing the race again: pair {i + 1} of {RACE_PAIRS}** (same tokens, lanes in turn)\n\n"
                       + md.split("\n\n", 1)[1]), a, b
                seconds = {}
                for spec in ((False, True) if i % 2 else (True, False)):
                    self.gate.close(streams[spec])
                    streams[spec] = self.gate.stream(request(spec), solo=True, should_stop=stop)
                    seconds[spec] = 0.0
                    while (step := self.gate.step(streams[spec]))[0] is not None:
                        seconds[spec] += step[1]
                pairs.append((seconds[True], seconds[False]))
        finally:
            for s in streams.values():
                self.gate.close(s)
            session.finish(run)
        if run.stopped:
            md, a, b = view(False)
            yield "**Race stopped.**\n\n" + md.split("\n\n", 1)[1], a, b
            return
        yield view(True)
