"""specdec: lossless tree speculative decoding with Medusa heads for HF causal LMs."""
from .api import Loaded, load
from .draft_tree import PRESETS, Tree, build_tree
from .engine import Engine
from .events import EmittedToken, RoundEvent, TreeNode
from .heads import HeadsConfig, MedusaHeads
from .request import GenerationRequest
from .sampler import SamplingParams
from .failure import RequestFailed
from .generation import GenerationResult, generate, generate_batch
from .scheduler import Scheduler
from .streaming import Delta, Stream, stream

__all__ = ["load", "generate", "generate_batch", "stream", "Stream", "Delta", "Scheduler", "RequestFailed", "Loaded", "GenerationResult",
           "Engine", "SamplingParams", "RoundEvent", "TreeNode", "EmittedToken", "MedusaHeads", "HeadsConfig", "Tree", "build_tree", "PRESETS",
           "GenerationRequest"]
__version__ = "0.1.0"
