"""The training corpus: the Python source of the local installation.

Every machine that runs specdec has a Python standard library and a
site-packages folder full of real code (torch, transformers, gradio, ...).
We read it at train time and never copy it into the repository. Files are
split into train and validation by a hash of their path relative to their
root, so the split is stable across machines with the same packages.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

MAX_FILE_BYTES = 512 * 1024  # larger .py files are mostly generated tables
VALID_PERCENT = 2  # per-mille would be too few files for a stable estimate


@dataclass(frozen=True)
class SourceFile:
    path: Path
    rel: str  # path relative to its root, used for the split hash
    split: str  # "train" or "valid"


def python_roots() -> list[Path]:
    """The standard library plus every site-packages folder, de-duplicated."""
    roots = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
    roots += site.getsitepackages()
    out: list[Path] = []
    for r in roots:
        p = Path(r).resolve()
        if p.is_dir() and not any(p == q or q in p.parents for q in out):
            out = [q for q in out if p not in q.parents] + [p]
    return out


def split_of(rel: str, valid_percent: int = VALID_PERCENT) -> str:
    h = int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16)
    return "valid" if h % 100 < valid_percent else "train"


def iter_source_files(roots: list[Path] | None = None) -> Iterator[SourceFile]:
    """All readable `.py` files under the roots, in a deterministic order."""
    roots = roots or python_roots()
    seen: set[Path] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            # site-packages inside the stdlib folder is walked as its own root
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                try:
                    real = path.resolve()
                    size = real.stat().st_size
                except OSError:
                    continue
                if real in seen or size == 0 or size > MAX_FILE_BYTES:
                    continue
                seen.add(real)
                rel = str(path.relative_to(root))
                yield SourceFile(path, rel, split_of(rel))


def read_text(f: SourceFile) -> str | None:
    try:
        text = f.path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return text.replace("\r\n", "\n")


def iter_texts(split: str | None = None, max_chars: int | None = None, seed: int = 0) -> Iterator[str]:
    """Texts of one split (or both) in a seeded shuffled order, stopping after about `max_chars` characters."""
    import random

    files = list(iter_source_files())
    random.Random(seed).shuffle(files)
    total = 0
    for f in files:
        if split is not None and f.split != split:
            continue
        text = read_text(f)
        if not text:
            continue
        yield text
        total += len(text)
        if max_chars is not None and total >= max_chars:
            return


def describe_environment() -> dict:
    """Python and package versions, for the model card."""
    wanted = ["torch", "transformers", "gradio", "numpy", "tokenizers", "jax", "scipy"]
    versions = {}
    for name in wanted:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    n_dists = sum(1 for _ in importlib.metadata.distributions())
    return {
        "python": platform.python_version(),
        "roots": [str(r) for r in python_roots()],
        "packages": versions,
        "installed_distributions": n_dists,
    }
