"""Where a model or heads name points: a local folder, or a Hugging Face hub id (online or from the local cache).

A name is a local path when it exists or starts with `/`, `./`, `../` or `~`; anything else
(`org/name`, `gpt2`) goes to the hub, or to the local cache under `HF_HUB_OFFLINE=1`.
"""
from __future__ import annotations

import os

LOCAL_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")


def is_local(name: str) -> bool:
    """True when `name` names a local path (whether or not it exists)."""
    return os.path.exists(name) or name.startswith(LOCAL_PREFIXES)


def check(name: str, what: str = "model") -> str:
    """`name` itself, after refusing a local path that does not exist (before anything is loaded)."""
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise ValueError(f"`{what}` must be a local folder or a hub id such as 'org/name', got {name!r}")
    name = os.path.expanduser(str(name))
    if is_local(name) and not os.path.isdir(name):
        raise ValueError(f"`{what}` path {name!r} does not exist")
    return name


def offline() -> bool:
    """Whether the hub is switched off (`HF_HUB_OFFLINE=1`): ids then resolve from the local cache only."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def not_found(name: str, what: str, error: Exception) -> ValueError:
    """One line naming `name`, for a hub id or folder that transformers could not load."""
    if is_local(name):
        return ValueError(f"cannot load `{what}` {name!r}: {_first_line(error)}")
    if offline():
        return ValueError(f"`{what}` {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
                          f"download it first (`hf download {name}`) or unset HF_HUB_OFFLINE")
    return ValueError(f"`{what}` {name!r} is neither a local folder nor a repository on the Hugging Face hub "
                      f"that this machine can read ({_first_line(error)})")


def pretrained(loader, name: str, what: str = "model", **kwargs):
    """`loader.from_pretrained(name, **kwargs)` with a missing folder or hub id as one ValueError."""
    name = check(name, what)
    try:
        return loader.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:  # transformers: OSError for a missing repo, HFValidationError for a bad id
        if isinstance(e, ValueError) and not _is_hub_error(e):
            raise
        raise not_found(name, what, e) from e


def _is_hub_error(e: ValueError) -> bool:
    from huggingface_hub.errors import HFValidationError

    return isinstance(e, HFValidationError)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
