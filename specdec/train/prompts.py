"""Distillation prompts: the user's file or dataset, chats through the chat template, or the Python corpus.

A record is one prompt string or one chat: a list of `{"role", "content"}`
messages. A chat is cut after its last user turn and rendered with the
tokenizer's chat template (`add_generation_prompt=True`), so the target's
own reply, generated later, is what the heads learn. Prompt ids are
token lists of varying length; `distill` pads them on the left.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from .corpus import iter_source_files, read_text

DEFAULT_FIELDS = ("messages", "conversations", "conversation", "prompt", "text")  # tried in order for dict records

Record = str | list  # a prompt, or a chat (list of {"role", "content"})


@dataclass(frozen=True)
class PromptSource:
    """Where the prompts came from, for logs and the model card."""

    kind: str  # "file", "dataset" or "corpus"
    name: str  # path, dataset name, or a description of the corpus
    records: int  # records read (before the held-out split)
    chat: bool  # prompts went through the chat template


def read_prompt_file(path: str | Path, field: str | None = None) -> list[Record]:
    """Records of a prompt file.

    `.json`: one list of records. `.jsonl`: one record per line. Anything
    else is text: one prompt per line, empty lines skipped (use JSONL for
    prompts that span lines).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"`--prompts` file {str(p)!r} does not exist")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"`--prompts` {str(p)!r} is not valid JSON: {e}") from e
        if not isinstance(data, list):
            raise ValueError(f"`--prompts` {str(p)!r} must hold a JSON list of records, got {type(data).__name__}")
        records = data
    elif p.suffix == ".jsonl":
        records = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"`--prompts` {str(p)!r} line {n} is not valid JSON: {e}") from e
    else:
        records = [line for line in text.splitlines() if line.strip()]
    out = [record_value(r, field, f"{p.name} record {i}") for i, r in enumerate(records)]
    if not out:
        raise ValueError(f"`--prompts` file {str(p)!r} has no records")
    return out


def read_dataset(name: str, split: str = "train", field: str | None = None) -> list[Record]:
    """Records of a dataset through the `datasets` library: a hub name, a local folder, or one local data file."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError("`--dataset` needs the `datasets` library: pip install datasets "
                         "(or pip install 'specdec[data]')") from e
    try:
        if Path(name).is_file():  # a local .json/.jsonl/.csv/.parquet file: the builder named by its extension
            builder = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(Path(name).suffix)
            if builder is None:
                raise ValueError(f"`--dataset` file {name!r} must be .json, .jsonl, .csv or .parquet")
            ds = datasets.load_dataset(builder, data_files={split: name}, split=split)
        else:
            ds = datasets.load_dataset(name, split=split)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"cannot load `--dataset` {name!r} split {split!r}: {e}") from e
    if field is not None and field not in ds.column_names:
        raise ValueError(f"`--field` {field!r} is not a column of {name!r}; columns: {ds.column_names}")
    out = [record_value(r, field, f"{name}[{i}]") for i, r in enumerate(ds)]
    if not out:
        raise ValueError(f"`--dataset` {name!r} split {split!r} is empty")
    return out


def record_value(rec, field: str | None, where: str) -> Record:
    """The prompt or chat inside one record: a string, a message list, or a dict holding one of those."""
    if isinstance(rec, dict) and not _is_message(rec):
        keys = [field] if field else [k for k in DEFAULT_FIELDS if k in rec]
        if not keys or keys[0] not in rec:
            raise ValueError(f"{where}: no field {field or '/'.join(DEFAULT_FIELDS)!r} in record keys {sorted(rec)} "
                             "(choose one with --field)")
        rec = rec[keys[0]]
    if isinstance(rec, str):
        if not rec.strip():
            raise ValueError(f"{where}: empty prompt")
        return rec
    if isinstance(rec, list) and rec and all(_is_message(m) for m in rec):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in rec]
    raise ValueError(f"{where}: a record must be a prompt string or a list of {{role, content}} messages, "
                     f"got {str(rec)[:80]!r}")


def _is_message(m) -> bool:
    return isinstance(m, dict) and "role" in m and "content" in m


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(tokenizer, rec: Record, chat: bool, max_len: int) -> list[int]:
    """Token ids of one record, left-truncated to the last `max_len` tokens (where generation continues)."""
    if chat:
        messages = rec if isinstance(rec, list) else [{"role": "user", "content": rec}]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last_user is None:
            raise ValueError(f"a chat has no user turn: {str(messages)[:80]!r}")
        out = tokenizer.apply_chat_template(messages[: last_user + 1], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
        ids = list(out["input_ids"])
    else:
        if isinstance(rec, list):
            raise ValueError("a chat record needs the chat template: the tokenizer has none, or --no-chat was given")
        ids = tokenizer(rec, add_special_tokens=False)["input_ids"]  # as specdec.generate encodes a prompt
    return ids[-max_len:]


def split_records(records: list[Record], valid: int, seed: int = 0) -> tuple[list[Record], list[Record]]:
    """A seeded shuffle, then (train, held-out). At most a tenth of the records are held out."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_valid = min(valid, max(1, len(records) // 10)) if len(records) > 1 else 0
    if len(records) - n_valid < 1:
        raise ValueError(f"need at least one training prompt, got {len(records)} records")
    return [records[i] for i in order[n_valid:]], [records[i] for i in order[:n_valid]]


def repeat_to(prompts: list[list[int]], n: int) -> list[list[int]]:
    """Cycle the prompts up to n rows (repeated prompts still differ in sampled rows)."""
    return [prompts[i % len(prompts)] for i in range(n)]


def corpus_prompts(tokenizer, split: str, n: int, length: int, seed: int = 0, max_files: int = 20000) -> torch.Tensor:
    """n random windows of `length` tokens from the local Python corpus: [n, length] long.

    Works with any tokenizer, so heads can be trained for any model.
    """
    files = [f for f in iter_source_files() if f.split == split]
    rng = random.Random(seed)
    rng.shuffle(files)
    out: list[list[int]] = []
    for f in files[:max_files]:
        text = read_text(f)
        if not text:
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= length:
            continue
        for _ in range(min(4, max(1, len(ids) // (4 * length)))):
            s = rng.randrange(0, len(ids) - length)
            out.append(ids[s : s + length])
        if len(out) >= n:
            break
    if not out:
        raise ValueError(f"no corpus file in split {split!r} is longer than {length} tokens")
    return torch.tensor(repeat_to(out, n), dtype=torch.long)
