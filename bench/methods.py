"""The methods a benchmark can run, as data: each one a name and its settings, nothing else.

An engine method is the settings of one `GenerationRequest` (tree preset or policy, prompt
lookup, acceptance rule); an HF method is one `model.generate` configuration. A new tree policy
is one more row of `METHODS`, with its `tree` set to the policy's name.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    id: str
    label: str
    backend: str  # "hf" or "engine"
    sampling: bool  # False: greedy
    tree: str | None = None  # engine: GenerationRequest.tree (a preset or policy name); None: speculative=False
    prompt_lookup: bool = False  # hf: assisted generation with the n-gram drafter
    lookup: bool = False  # engine: draft with prompt lookup (`--lookup` tokens, as HF's prompt lookup gets)
    lookup_mode: str = "first"
    acceptance: str = "auto"  # engine: GenerationRequest.acceptance
    temperature: float | None = None  # sampling methods: overrides the run's --temperature
    top_p: float | None = None  # ... and its --top-p
    hf_cache: str | None = None  # hf: GenerationConfig.cache_implementation ("static"); None: HF's dynamic cache
    hf_compile: bool = False  # hf: let generate torch.compile the decode step (static cache, CUDA only)
    opt_in: bool = False  # runs only when named in --methods (slow or device-specific)
    drafter: str = "auto"  # engine: GenerationRequest.drafter ("auto": the loaded model's default)

    def sampling_params(self, temperature: float, top_p: float) -> tuple[float, float]:
        """(temperature, top_p) of a sampling method: its own where set, else the run's."""
        return (temperature if self.temperature is None else self.temperature,
                top_p if self.top_p is None else self.top_p)

    @property
    def needs_heads(self) -> bool:
        return self.backend == "engine" and self.tree not in (None, "none") and self.drafter == "medusa"

    @property
    def needs_eagle(self) -> bool:
        return self.backend == "engine" and self.drafter == "eagle3"


T1 = dict(temperature=1.0, top_p=1.0)  # the flattest law measured: no filters at all

METHODS = (
    Method("hf_greedy", "HF generate greedy", "hf", False),
    Method("hf_sample", "HF generate sampling", "hf", True),
    Method("hf_sample_t1", "HF generate sampling, T=1.0, no filters", "hf", True, **T1),
    Method("hf_prompt_lookup", "HF prompt lookup (greedy)", "hf", False, prompt_lookup=True),
    Method("hf_static_greedy", "HF generate greedy, static cache, not compiled", "hf", False, hf_cache="static",
           opt_in=True),
    # torch.compile(mode="reduce-overhead") of the decode step: minutes to compile, and it can crash
    # through generate on some GPU images, so the GPU script runs it in its own process.
    Method("hf_compiled_greedy", "HF generate greedy, static cache, compiled (CUDA graphs)", "hf", False,
           hf_cache="static", hf_compile=True, opt_in=True),
    Method("plain_greedy", "specdec speculative=False greedy", "engine", False),
    Method("plain_sample", "specdec speculative=False sampling", "engine", True),
    Method("plain_sample_t1", "specdec speculative=False sampling, T=1.0", "engine", True, **T1),
    Method("chain_greedy", "specdec chain greedy", "engine", False, "chain", drafter="medusa"),
    Method("small_greedy", "specdec small tree greedy", "engine", False, "small", drafter="medusa"),
    Method("default_greedy", "specdec default tree greedy", "engine", False, "default", drafter="medusa"),
    Method("trained_greedy", "specdec trained tree greedy", "engine", False, "trained", drafter="medusa"),
    Method("auto_greedy", "specdec dynamic tree (heads alone) greedy", "engine", False, "auto", drafter="medusa"),
    Method("default_sample", "specdec default tree lossless sampling", "engine", True, "default", drafter="medusa"),
    Method("trained_sample", "specdec trained tree lossless sampling", "engine", True, "trained", drafter="medusa"),
    Method("auto_sample", "specdec dynamic tree (heads alone) lossless sampling", "engine", True, "auto", drafter="medusa"),
    Method("trained_sample_t1", "specdec trained tree lossless sampling, T=1.0", "engine", True, "trained", **T1, drafter="medusa"),
    Method("auto_sample_t1", "specdec dynamic tree (heads alone) lossless sampling, T=1.0", "engine", True, "auto",
           **T1, drafter="medusa"),
    Method("lookup_greedy", "specdec prompt lookup alone (no heads), greedy", "engine", False, "none", lookup=True),
    Method("merge_greedy", "specdec default tree with the lookup chain merged in, greedy", "engine", False,
           "default", lookup=True, lookup_mode="merge", drafter="medusa"),
    Method("static_hybrid_greedy", "specdec trained tree, lookup first (the static default before the dynamic "
           "tree), greedy", "engine", False, "trained", lookup=True, drafter="medusa"),
    Method("static_hybrid_sample", "specdec trained tree, lookup first, lossless sampling", "engine", True, "trained",
           lookup=True, drafter="medusa"),
    Method("eagle_greedy", "specdec EAGLE-3 on its 16-node tree, greedy", "engine", False, "trained",
           drafter="eagle3"),
    Method("eagle_sample", "specdec EAGLE-3 on its 16-node tree, lossless sampling", "engine", True, "trained",
           drafter="eagle3"),
    Method("eagle_lookup_greedy", "specdec EAGLE-3 tree with the lookup chain merged in, greedy", "engine", False,
           "trained", lookup=True, lookup_mode="merge", drafter="eagle3"),
    Method("eagle_lookup_sample", "specdec EAGLE-3 tree with the lookup chain merged in, lossless sampling",
           "engine", True, "trained", lookup=True, lookup_mode="merge", drafter="eagle3"),
    Method("heads_merge_greedy", "specdec heads' trained tree with the lookup chain merged in, greedy", "engine", False,
           "trained", lookup=True, lookup_mode="merge", drafter="medusa"),
    Method("heads_merge_sample", "specdec heads' trained tree with the lookup chain merged in, lossless sampling "
           "(the demo's settings with the heads)", "engine", True, "trained", lookup=True, lookup_mode="merge",
           drafter="medusa"),
    Method("heads_hybrid_greedy", "specdec heads' dynamic tree with the lookup chain in its budget; greedy", "engine",
           False, "auto", lookup=True, drafter="medusa"),
    Method("heads_hybrid_sample", "specdec heads' dynamic tree with the lookup chain in its budget; lossless sampling",
           "engine", True, "auto", lookup=True, drafter="medusa"),
    Method("hybrid_greedy", "specdec default: the dynamic tree with the lookup chain in its budget; greedy",
           "engine", False, "auto", lookup=True),
    Method("hybrid_sample", "specdec default: the dynamic tree with the lookup chain in its budget; lossless "
           "sampling", "engine", True, "auto", lookup=True),
    Method("hybrid_sample_t1", "specdec default (dynamic tree + lookup), lossless sampling, T=1.0", "engine", True,
           "auto", lookup=True, **T1),
)
BY_ID = {m.id: m for m in METHODS}
assert len(BY_ID) == len(METHODS), "method ids must be unique"

# Targets: (name, numerator method, denominator method, minimum ratio).
# The first four measure specdec's default drafting (what `specdec.generate` does with no arguments);
# the next four the heads alone on the 64-node default tree preset; the rest the dynamic tree, whose
# "at least the best static preset" target is computed in `suite.assemble`.
_GREEDY_BASES = (("HF greedy generate", "hf_greedy", 2.0), ("own speculative=False", "plain_greedy", 1.8),
                 ("HF prompt lookup", "hf_prompt_lookup", 1.3))
TARGETS = (
    *((f"specdec default greedy / {name}", "hybrid_greedy", base, t) for name, base, t in _GREEDY_BASES),
    ("specdec default lossless sampling / HF sampling", "hybrid_sample", "hf_sample", 1.5),
    *((f"heads only, default tree greedy / {name}", "default_greedy", base, t) for name, base, t in _GREEDY_BASES),
    ("heads only, default tree lossless sampling / HF sampling", "default_sample", "hf_sample", 1.5),
    ("dynamic tree + lookup (default) lossless sampling / HF sampling", "hybrid_sample", "hf_sample", 1.5),
    ("dynamic tree (heads alone) lossless sampling / HF sampling", "auto_sample", "hf_sample", 1.5),
    ("dynamic tree + lookup sampling, T=1.0 / own plain sampling, T=1.0", "hybrid_sample_t1", "plain_sample_t1", 1.0),
    ("dynamic tree (heads alone) sampling, T=1.0 / own plain, T=1.0", "auto_sample_t1", "plain_sample_t1", 1.0),
)
# The dynamic tree against every static preset of the same kind, in the same run.
VERSUS_STATIC = (
    ("dynamic tree greedy / best static preset greedy (heads alone)", "auto_greedy",
     ("chain_greedy", "small_greedy", "default_greedy", "trained_greedy")),
    ("dynamic tree + lookup greedy / best static tree + lookup greedy", "hybrid_greedy",
     ("static_hybrid_greedy", "merge_greedy")),
)


def select_methods(wanted: tuple[str, ...] | None, has_heads: bool, has_trained_tree: bool,
                   oracle: bool = False, has_eagle: bool = False) -> list[Method]:
    """The methods to run, in registry order: `wanted` (None: all) less those this model cannot run.

    hf_greedy always runs: every speedup is relative to it.
    """
    if wanted is not None:
        unknown = set(wanted) - set(BY_ID)
        if unknown:
            raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {list(BY_ID)}")
    out = []
    for m in METHODS:
        if (m.id not in wanted) if wanted is not None else m.opt_in:
            continue
        if (m.needs_heads and not has_heads) or (m.needs_eagle and not has_eagle):
            continue
        if m.tree == "trained" and m.drafter == "medusa" and not has_trained_tree:
            continue  # heads without a shipped tree: the presets stand in for it
        if oracle and m.backend == "engine" and m.sampling:
            continue  # the oracle knows the greedy continuation only
        out.append(m)
    if not any(m.id == "hf_greedy" for m in out):
        out.insert(0, BY_ID["hf_greedy"])
    return out
