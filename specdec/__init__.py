"""specdec: lossless tree speculative decoding with Medusa heads for HF causal LMs."""
from .api import GenerationResult, Loaded, generate, generate_batch, load
from .draft_tree import PRESETS, Tree, build_tree
from .engine import Engine
from .events import EmittedToken, RoundEvent, TreeNode
from .heads import HeadsConfig, MedusaHeads
from .request import GenerationRequest
from .sampler import SamplingParams
from .failure import RequestFailed
from .scheduler import Scheduler
from .streaming import Delta, Stream, stream

__all__ = ["load", "generate", "generate_batch", "stream", "Stream", "Delta", "Scheduler", "RequestFailed", "Loaded", "GenerationResult",
           "Engine", "SamplingParams", "RoundEvent", "TreeNode", "EmittedToken", "MedusaHeads", "HeadsConfig", "Tree", "build_tree", "PRESETS",
           "GenerationRequest"]
__version__ = "0.1.0"
