"""Per-session state: the live settings a running generation reads, and the last run.

One `Session` lives in each user's `gr.State`. Gradio copies the default
once per session and then hands every event of that session the same
object, so a slider handler can update `Session.live` while a generator
of the same session reads it once per round (live tuning). Nothing here
is shared between users.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from specdec import GenerationRequest, RoundEvent, SamplingParams
from specdec.lookup import DEFAULT_LOOKUP, MAX_LOOKUP
from specdec.stats import SAMPLER_KEYS
from specdec.verifier import ACCEPTANCE_RULES, LOSSY_RULES

# UI ranges: the app's own limits, tighter than the engine's. Gradio's sliders reject values
# outside them, and `Settings.validate` checks them again for calls that bypass the sliders.
# Every other limit is the engine's, checked once by GenerationRequest and SamplingParams.
TEMPERATURE_MAX = 2.0
TOP_K_MAX = 200
MAX_NEW_TOKENS_MAX = 512
SEED_MAX = 2**31 - 1
LOOKUP_MAX = MAX_LOOKUP  # prompt-lookup tokens per round (the engine's own limit)

_RULE_WORDS = {"lossless": "lossless sampling (exact)", "greedy": "greedy (argmax match; ignores temperature)",
               "typical": "typical acceptance"}
ACCEPTANCE_CHOICES = tuple(  # (label, value) for the radio, in the UI's order; lossy rules say so
    (_RULE_WORDS.get(r, r) + (" (LOSSY)" if r in LOSSY_RULES else ""), r)
    for r in sorted(ACCEPTANCE_RULES, key=lambda r: (r in LOSSY_RULES, r != "lossless")))
LOOKUP_MODE_CHOICES = (
    ("first", "first"),  # a round whose context has an n-gram match drafts the lookup chain alone, else the heads
    ("merge", "merge"),  # every round: the heads' tree with the lookup chain merged into it
)
LIVE_KEYS = SAMPLER_KEYS  # what moving a slider changes mid-run


def _number(name: str, value, integer: bool = False, ui_range: tuple[float, float] | None = None):
    """A control's raw value as a number (a JSON 10.0 is the integer 10), within the slider's `ui_range`.

    Only the app's own bound is checked against `ui_range` (above it, the sliders stop); the engine's
    bounds are the request's to check, though the message states the whole slider range.
    """
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number, got {value!r}")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise ValueError(f"`{name}` must be finite, got {value!r}")
    if integer:
        if float(value) != int(value):
            raise ValueError(f"`{name}` must be an integer, got {value!r}")
        value = int(value)
    if ui_range is not None and value > ui_range[1]:
        raise ValueError(f"`{name}` must be in [{ui_range[0]}, {ui_range[1]}], got {value!r}")
    return value if integer else float(value)


@dataclass(frozen=True)
class Settings:
    """Everything the controls set. Validated by `Settings.validate`."""

    temperature: float = 0.7  # 0 = greedy
    top_k: int = 50  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.0  # 0 = off
    max_new_tokens: int = 64
    seed: int = 0  # -1 draws a fresh seed per run
    tree: str = "default"  # a draft_tree preset name, or "trained"
    acceptance: str = "lossless"  # one of ACCEPTANCE_RULES ("typical" is lossy)
    speculative: bool = True
    lookup: int = DEFAULT_LOOKUP  # prompt-lookup tokens drafted per round; 0 = off
    lookup_mode: str = "first"  # "first" or "merge" (see LOOKUP_MODE_CHOICES)
    drafter: str = "auto"  # the request's model drafter; the tree menu's "eagle3" picks EAGLE-3

    @classmethod
    def validate(cls, temperature, top_k, top_p, min_p, max_new_tokens=64, seed=0, tree="default",
                 acceptance="lossless", speculative=True, lookup=DEFAULT_LOOKUP, lookup_mode="first",
                 trees=None) -> "Settings":
        """Check raw control values (from the UI or the API); raise ValueError naming the bad one.

        Here: numbers from JSON, the app's ranges and tree choices. The request's own checks
        (sampling params, acceptance rule, lookup, max_new_tokens >= 1) run by building one.
        """
        if trees is not None and tree not in trees:
            raise ValueError(f"`tree` must be one of {list(trees)}, got {tree!r}")
        seed = -1 if seed is None else seed
        out = cls(
            temperature=_number("temperature", temperature, ui_range=(0.0, TEMPERATURE_MAX)),
            top_k=_number("top_k", top_k, integer=True, ui_range=(0, TOP_K_MAX)),
            top_p=_number("top_p", top_p),
            min_p=_number("min_p", min_p),
            max_new_tokens=_number("max_new_tokens", max_new_tokens, integer=True, ui_range=(1, MAX_NEW_TOKENS_MAX)),
            seed=_number("seed", seed, integer=True, ui_range=(-1, SEED_MAX)),
            tree=tree, acceptance=acceptance, speculative=speculative,
            lookup=_number("lookup", lookup, integer=True), lookup_mode=lookup_mode,
        )
        if out.max_new_tokens < 1:  # the engine would still make the first token: a typed 0 is refused
            raise ValueError(f"`max_new_tokens` must be in [1, {MAX_NEW_TOKENS_MAX}], got {out.max_new_tokens}")
        if out.seed < -1:  # the app's own meaning: -1 draws a fresh seed per run
            raise ValueError(f"`seed` must be in [-1, {SEED_MAX}], got {out.seed}")
        if out.acceptance == "auto":  # the engine's default; the app names the rule it runs
            raise ValueError(f"`acceptance` must be one of {list(ACCEPTANCE_RULES)}, got 'auto'")
        out.request([0])  # the engine's checks, stated once in GenerationRequest
        return out

    def request(self, prompt_ids: list[int], params=None, speculative: bool | None = None,
                max_new_tokens: int | None = None) -> GenerationRequest:
        """The engine request these settings make (plain decoding drafts nothing, so it gets lookup=0).

        Args:
            params: SamplingParams or a live source of them (default: `sampling_params()`).
            speculative, max_new_tokens: override the settings' own (a race runs both lanes, a warm-up is short).
        """
        spec = self.speculative if speculative is None else speculative
        tree, drafter = ("trained", "eagle3") if self.tree == "eagle3" else (self.tree, self.drafter)
        return GenerationRequest(prompt_ids, self.max_new_tokens if max_new_tokens is None else max_new_tokens,
                                 self.sampling_params() if params is None else params, tree, spec,
                                 self.acceptance, lookup=self.lookup if spec is True else 0,
                                 lookup_mode=self.lookup_mode, drafter=drafter)

    def sampling_params(self, seed: int | None = None) -> SamplingParams:
        """The engine's params. The greedy rule means argmax everywhere, so it forces temperature 0."""
        temperature = 0.0 if self.acceptance == "greedy" else self.temperature
        return SamplingParams(temperature=temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              seed=seed)

    def with_live(self, temperature, top_k, top_p, min_p) -> "Settings":
        """These settings with new slider values (validated)."""
        checked = Settings.validate(temperature, top_k, top_p, min_p)
        return replace(self, **{k: getattr(checked, k) for k in LIVE_KEYS})

    def resolved_seed(self) -> int:
        return random.SystemRandom().randrange(SEED_MAX) if self.seed < 0 else self.seed


@dataclass
class Run:
    """One generation: its id, prompt, settings at the start, and the events so far."""

    run_id: int
    prompt: str
    prompt_ids: list[int]
    settings: Settings
    seed: int
    events: list[RoundEvent] = field(default_factory=list)
    stopped: bool = False  # Stop was pressed (or the session went away, or its tab replaced it)
    replaced: bool = False  # its tab started a newer run, which now owns the views
    done: bool = False
    chat: bool = False  # the prompt was wrapped as a chat turn (the tokenizer's chat template)
    steps: int = 0  # clicks of the step button: at the "step" pace, each shows one more round

    def record(self, event: RoundEvent) -> None:
        """The engine's `on_round` callback: keep every event for the round slider and the charts."""
        self.events.append(event)

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for ev in self.events for t in ev.emitted]

    @property
    def text(self) -> str:
        return "".join(ev.text for ev in self.events)


@dataclass
class Session:
    """One user's state. Holds plain values only, so Gradio can deepcopy the default."""

    live: Settings = field(default_factory=Settings)  # read once per round by the running generation
    run: Run | None = None  # the last Generate run: the round slider and the charts read it
    unfinished: list[Run] = field(default_factory=list)  # runs going now (Generate or Compare); Stop stops them all
    runs_started: int = 0
    # ((token ids, params), the sampler view's rows): plain values. One tuple, so that the
    # generation thread and a slider event never see a key with another context's rows.
    sampler_cache: tuple | None = None

    def start_run(self, prompt: str, prompt_ids: list[int], settings: Settings, main: bool = True,
                  chat: bool = False) -> Run:
        """A new run, beside any unfinished one: an API client's calls share its session and each runs to its
        end. A tab's own new run replaces the tab's unfinished one (`replace`, which its buttons call first)."""
        self.runs_started += 1
        run = Run(self.runs_started, prompt, list(prompt_ids), settings, settings.resolved_seed(), chat=bool(chat))
        self.unfinished.append(run)
        if main:
            self.live = settings
            self.run = run
        return run

    def finish(self, run: Run) -> None:
        run.done = True
        if run in self.unfinished:
            self.unfinished.remove(run)

    @property
    def active(self) -> Run | None:
        """The newest unfinished run, or None."""
        return self.unfinished[-1] if self.unfinished else None

    @property
    def running(self) -> bool:
        return any(not r.done for r in self.unfinished)

    def live_params(self, run: Run | None = None) -> SamplingParams:
        """Read by the engine once per round. The newest Generate run follows the live sliders; an older run
        still going (an API client's earlier call) keeps the settings it started with, and its own seed."""
        run = self.run if run is None else run
        settings = self.live if run is None or run is self.run else run.settings
        return settings.sampling_params(None if run is None else run.seed)

    def should_stop(self, run: Run):
        """A callable for the engine: True once Stop was pressed (or the tab replaced this run)."""
        return lambda: run.stopped

    def step(self) -> None:
        """The step button: the tab's run shows one more round (at the "step" pace)."""
        if self.run is not None and not self.run.done:
            self.run.steps += 1

    def request_stop(self) -> None:
        """Stop every unfinished run of this session (Stop, Clear, a closed tab)."""
        for run in self.unfinished:
            run.stopped = True

    def replace(self) -> None:
        """A tab's new run is about to start: its unfinished runs stop and draw nothing more."""
        for run in self.unfinished:
            run.replaced = run.stopped = True

    def clear(self) -> None:
        self.request_stop()
        self.unfinished.clear()
        self.run = None
