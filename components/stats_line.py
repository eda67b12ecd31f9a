"""The stats line under the tokens: a run's totals (specdec.stats.summarize) in a reader's words."""
from __future__ import annotations

from specdec.stats import rule_label


def _fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


FINISHED_WORDS = {  # the engine's `finished` values, as a reader would say them
    "eos": "done: the model ended the text",
    "length": "done: reached max new tokens",
    "context": "done: the model's context window is full",
}


def status_words(finished: str | None, stopped: bool = False) -> str:
    if stopped and not finished:
        return "stopped by you"
    return FINISHED_WORDS.get(finished, finished) if finished else "running…"


def stats_markdown(s: dict, stopped: bool = False, drafter: str = "heads") -> str:
    """One Markdown line for the stats box; `drafter` names the model drafter ("heads", "EAGLE-3")."""
    if not s["new_tokens"]:
        return ""
    rule = ", ".join(rule_label(r) for r in s["rules"])
    status = status_words(s["finished"], stopped)
    n = s["new_tokens"]
    head = ([f"**{n}** tokens in **{s['rounds']}** decoding rounds",
             f"mean accepted length **{_fmt(s['mean_accepted_length'])}** tokens/target forward "
             f"(over {s['rounds']} rounds, prefill excluded)"] if s["rounds"] else
            [f"**{n}** token{'s' * (n != 1)} from the prefill alone (no decoding round, so nothing drafted)"])
    parts = [
        *head,
        f"**{_fmt(s['tokens_per_second'], 1)}** tok/s (engine time)",
        *([f"accepted drafts: {s['accepted_drafts'] - s['lookup_drafts']} by {drafter}, "
           f"**{s['lookup_drafts']}** by prompt lookup (which drafted in {s['lookup_rounds']} of the rounds)"]
          if s.get("lookup_rounds") else []),
        f"rule: {rule}",
        f"**{status}**",
    ]
    if s["changes"]:
        parts.append(f"settings changed {s['changes']}×")
    return " · ".join(parts)
