"""`load` a model with its drafters (the embedded one by default, or any hub id or folder); `encode` text."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import cost, eagle_io, hub
from .eagle import Eagle3
from .engine import Engine
from .heads import MedusaHeads, random_heads
from .heads_io import read_heads
from .scheduler import DEFAULT_MAX_BATCH_SIZE, Scheduler
from .target import TargetModel
from .threads import off_the_callers_thread


def _assets_dir() -> Path:
    """The embedded model's folder: specdec/assets in an installed wheel, else assets/ of the checkout."""
    here = Path(__file__).resolve().parent
    installed = here / "assets"
    return installed if (installed / "model").is_dir() else here.parent / "assets"


ASSETS = _assets_dir()
DEFAULT_MODEL = ASSETS / "model"
DEFAULT_HEADS = ASSETS / "heads"
DEFAULT_EAGLE = ASSETS / "eagle3"
SHIPPED = {"medusa": DEFAULT_HEADS, "eagle3": DEFAULT_EAGLE}  # the embedded model's drafters, by name
# "auto" is the heads: on the embedded 4-layer target EAGLE-3's serial steps cost more than they save.
EMBEDDED_DRAFTER = "medusa"

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class Loaded:
    """A target model, its tokenizer (may be None) and its draft heads (may be None)."""

    model: torch.nn.Module
    tokenizer: object | None
    heads: MedusaHeads | None
    tree_paths: tuple | None  # the tree shipped with the heads, if any
    engine: Engine = field(repr=False)
    name: str = ""
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE  # requests the scheduler decodes together
    _scheduler: Scheduler | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def device(self) -> torch.device:
        return self.engine.target.device

    @property
    def eagle(self):
        """The EAGLE-3 drafter (None: not loaded)."""
        return self.engine.eagle

    @property
    def scheduler(self) -> Scheduler:
        """The one scheduler every generation on this model goes through (started on first use)."""
        with self._lock:
            if self._scheduler is None:
                self._scheduler = Scheduler(self.engine, max_batch_size=self.max_batch_size)
            return self._scheduler

    @property
    def serving(self) -> bool:
        """Whether this model's scheduler has started."""
        return self._scheduler is not None

    def serve(self, **options) -> Scheduler:
        """Start and return this model's scheduler with `Scheduler`'s `options`; call it before generating."""
        with self._lock:
            if self._scheduler is not None:
                raise RuntimeError("this model's scheduler is already running: call serve() before generating")
            self._scheduler = Scheduler(self.engine, max_batch_size=self.max_batch_size, **options)
            return self._scheduler

    @property
    def has_chat_template(self) -> bool:
        """True when the tokenizer can wrap a prompt as a chat turn (`generate(..., chat=True)`)."""
        return bool(getattr(self.tokenizer, "chat_template", None))


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"`dtype` must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def resolve_device(device) -> torch.device:
    """`device` as a torch.device (None: cuda when present, else cpu), refused by name when this machine lacks it."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"`device` must be a device name such as {', '.join(available_devices())}, got {device!r}") from None
    if dev.type == "cpu":
        return dev
    backend = getattr(torch, dev.type, None)
    if dev.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    count = 0
    if backend is not None and backend.is_available():
        count = backend.device_count() if hasattr(backend, "device_count") else 1
    if count == 0 or (dev.index is not None and dev.index >= count):
        raise ValueError(f"`device` {device!r} is not available on this machine (this torch "
                         f"{torch.__version__} sees: {', '.join(available_devices())})")
    return dev


def available_devices() -> list[str]:
    """The device names this torch can run on here."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    return names


def load(model=None, heads=None, device=None, dtype=None, tokenizer=None, prefix_cache=None,
         cost_cache: str | None | bool = None, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
         cuda_graphs: bool | None = None, heads_dtype=None, packed_rows: bool | None = None) -> Loaded:
    """Load a target model and its drafter: Medusa heads, an EAGLE-3 drafter, or (embedded model) both.

    Args:
        model: hub id, local path, a loaded PreTrainedModel, or None for the embedded default (offline).
        heads: a folder or hub id of Medusa heads or an EAGLE-3 drafter in any layout `heads_io` or
            `eagle_io` reads; a MedusaHeads or an Eagle3; "random"; "medusa" or "eagle3" (the embedded
            model's shipped drafters); or None (the embedded model's two, else none).
        device: "cpu", "cuda", ... (default: cuda when present).
        dtype: torch dtype or name (default: float32 on CPU, bfloat16 on CUDA).
        tokenizer: a tokenizer, to override or supply one for a model object.
        cost_cache: None measures the dynamic tree's round costs once per process, so an old busy moment
            cannot size today's trees; a folder, or True for $SPECDEC_CACHE (~/.cache/specdec), keeps them.
        max_batch_size: requests decoded together by `Loaded.scheduler` (1: one at a time).
        cuda_graphs: replay captured CUDA graphs (`specdec.graphs`); None: on where the model runs on CUDA,
            True elsewhere is refused, and a forward that cannot be captured runs eagerly.
        heads_dtype: the heads' vocabulary projections' dtype (default: the model's); a head only proposes
            tokens, so it changes speed and acceptance, never the output.
        packed_rows: speculative rounds' vocabulary rows through a prepacked oneDNN lm_head (fp32 on a CPU);
            None: where it measures at least 10% faster at load. Plain decoding keeps HF's logits bit for bit.
    """
    if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
        raise ValueError(f"`max_batch_size` must be an integer >= 1, got {max_batch_size!r}")
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise ValueError(f"`cuda_graphs` must be None, True or False, got {cuda_graphs!r}")
    if packed_rows is not None and not isinstance(packed_rows, bool):
        raise ValueError(f"`packed_rows` must be None, True or False, got {packed_rows!r}")
    if not (cost_cache is None or isinstance(cost_cache, (bool, str, os.PathLike))):
        raise ValueError(f"`cost_cache` must be None, True, False or a folder path, got {cost_cache!r}")
    if isinstance(cost_cache, (str, os.PathLike)) and os.path.isfile(cost_cache):
        raise ValueError(f"`cost_cache` must be a folder, but {str(cost_cache)!r} is a file")
    if heads_dtype is not None and not (isinstance(heads_dtype, torch.dtype) and heads_dtype.is_floating_point) \
            and heads_dtype not in _DTYPES:
        raise ValueError(f"`heads_dtype` must be None, a floating torch dtype or one of {sorted(_DTYPES)}, "
                         f"got {heads_dtype!r}")
    dev = resolve_device(device)
    args = (model, heads, dev, dtype, tokenizer, prefix_cache, cost_cache, max_batch_size, cuda_graphs, heads_dtype,
            packed_rows)
    # Off the caller's thread, so it keeps no OpenMP pool to slow the scheduler's rounds (`specdec.threads`).
    return off_the_callers_thread(dev, _load, *args)


def _load(model, heads, dev: torch.device, dtype, tokenizer, prefix_cache, cost_cache, max_batch_size: int,
          cuda_graphs: bool | None, heads_dtype, packed_rows: bool | None) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars are noise in a CLI and an app log
    eagle_src = None  # an EAGLE-3 drafter's folder, beside the heads (the embedded model) or instead of them

    if model is None:
        if not (DEFAULT_MODEL / "config.json").is_file():
            raise ValueError(f"the embedded default model is missing from {DEFAULT_MODEL}; "
                             "pass model=<hub id or path> or rebuild it (see assets/README.md)")
        model, name = str(DEFAULT_MODEL), "embedded"
        if heads is None:  # both shipped drafters
            heads, eagle_src = str(DEFAULT_HEADS), (str(DEFAULT_EAGLE) if DEFAULT_EAGLE.is_dir() else None)
        elif isinstance(heads, str) and heads in SHIPPED and not os.path.isdir(heads):
            heads = str(SHIPPED[heads])
    elif isinstance(heads, str) and heads in SHIPPED and not os.path.isdir(heads):
        raise ValueError(f"`heads` {heads!r} names a drafter shipped with the embedded model; for another model "
                         "give a folder or hub id")
    if isinstance(model, PreTrainedModel):
        name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        hf_model = model.to(dev) if dtype is None else model.to(dev, resolve_dtype(dtype, dev))
    else:
        name = "embedded" if str(model) == str(DEFAULT_MODEL) else str(model)
        hf_model = hub.pretrained(AutoModelForCausalLM, str(model), "model", dtype=resolve_dtype(dtype, dev))
        hf_model.to(dev)
        if tokenizer is None:
            tokenizer = hub.pretrained(AutoTokenizer, str(model), "model")
    hf_model.eval()
    if cuda_graphs and hf_model.device.type != "cuda":
        raise ValueError(f"`cuda_graphs=True` needs a CUDA device, but the model is on {hf_model.device}")
    target = TargetModel(hf_model)
    if cuda_graphs is not False and target.device.type == "cuda":
        target.use_graphs("cuda")
    tree_paths, eagle, eagle_shape = None, None, None
    if isinstance(heads, str) and heads != "random":
        heads = heads_folder(heads)  # a folder from here on: Medusa heads or an EAGLE-3 drafter
        if eagle_io.detect(heads):
            eagle_src, heads = heads, None
    if isinstance(heads, Eagle3):
        eagle, heads = heads.to(device=target.device, dtype=target.dtype).eval(), None
    elif eagle_src is not None:
        eagle, eagle_shape, _ = eagle_io.read_eagle(eagle_src, hf_model)
    if heads is None:
        head_mod = None
    elif isinstance(heads, MedusaHeads):
        # Heads built or trained elsewhere (often fp32 on the CPU) must run where the model runs.
        head_mod = heads.to(device=target.device, dtype=target.dtype).eval()
    elif heads == "random":
        head_mod = random_heads(hf_model)
    else:
        head_mod, tree_paths, _ = read_heads(heads, hf_model)
    if packed_rows is None and target.device.type == "cpu":
        packed_rows = cost.packed_rows_pay(target)
    if packed_rows:
        target.use_packed_rows(True)
    if head_mod is not None and heads_dtype is not None:
        head_mod.store_projections(resolve_dtype(heads_dtype, target.device))
    if cost_cache is True:
        cost_cache = os.environ.get("SPECDEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specdec")
    both = head_mod is not None and eagle is not None and name == "embedded"
    engine = Engine(target, head_mod, tokenizer, tree_paths, prefix_cache, cost_cache=cost_cache or None,
                    eagle=eagle, eagle_shape=eagle_shape, default_drafter=EMBEDDED_DRAFTER if both else None)
    return Loaded(hf_model, tokenizer, head_mod, tree_paths, engine, name, max_batch_size)


def heads_folder(heads: str) -> str:
    """A local heads folder, or a hub repo id ("owner/name") downloaded on first use (or read from the cache)."""
    heads = hub.check(heads, "heads")
    if os.path.isdir(heads):
        return heads
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:  # only the heads' own files, never a bundled base model
        return snapshot_download(repo_id=heads, allow_patterns=["*.json", "*.safetensors", "medusa_lm_head.pt",
                                                                 "pytorch_model.bin"])
    except (HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OSError) as e:
        raise hub.not_found(heads, "heads", e) from e


def encode(loaded: Loaded, prompt: str | None, prompt_ids=None, chat: bool = False) -> list[int]:
    """Token ids for a prompt: raw text, or (chat=True) one user turn through the chat template."""
    if not isinstance(chat, bool):
        raise ValueError(f"`chat` must be True or False, got {chat!r}")
    if prompt_ids is not None:
        if chat:
            raise ValueError("`chat=True` wraps text: pass `prompt`, not `prompt_ids`")
        return prompt_ids  # checked (and flattened from [1, T]) by GenerationRequest
    if prompt is None or not str(prompt).strip():
        raise ValueError("`prompt` is empty: give some text (or prompt_ids)")
    if loaded.tokenizer is None:
        raise ValueError("this model was loaded without a tokenizer: pass prompt_ids")
    if chat:
        if not loaded.has_chat_template:
            raise ValueError(f"`chat=True` needs a chat template, but the tokenizer of {loaded.name or 'this model'!r} "
                             "has none: pass chat=False to send the prompt as raw text")
        # The template already adds the special tokens it wants (BOS, role markers).
        out = loaded.tokenizer.apply_chat_template([{"role": "user", "content": str(prompt)}],
                                                   add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])
    return loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
