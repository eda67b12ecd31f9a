"""The model card written next to trained heads: README.md in the Hugging Face hub's format.

Everything in it comes from heads_metrics.json (its `card` entry holds the
data source and the exact command), tree.json and tree_choice.json, so
`train tree` can rewrite the card after it picks another tree.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..heads import TREE_NAME


def _yaml_str(s: str) -> str:
    return json.dumps(str(s))  # a JSON string is a valid YAML scalar


def render_card(metrics: dict, variant: str, heads_dir: Path) -> str:
    """The card's markdown for one variant's heads folder."""
    v = metrics["variants"][variant]
    info = metrics.get("card", {})
    cfg = v["config"]
    base = info.get("base_model") or cfg.get("base_model") or "unknown"
    data = info.get("data", {})
    tree_path = heads_dir / TREE_NAME
    paths = json.loads(tree_path.read_text()) if tree_path.is_file() else []
    paths = paths.get("paths", paths) if isinstance(paths, dict) else paths
    choice_path = heads_dir / "tree_choice.json"
    chosen_by = json.loads(choice_path.read_text()).get("chosen_by") if choice_path.is_file() else None
    heads_arg = info.get("heads_dir_hint", str(heads_dir))
    model_arg = info.get("model_arg", base)
    front = ["---", f"base_model: {_yaml_str(base)}", "library_name: specdec", "tags:", "- medusa",
             "- speculative-decoding", "- specdec"]
    if data.get("kind") == "dataset":
        front += ["datasets:", f"- {_yaml_str(data.get('name', ''))}"]
    front.append("---")
    rows = [f"| {k} | t+{k + 2} | {a[0]:.1%} | {sum(a[:5]):.1%} |" for k, a in enumerate(v["acc"])]
    lines = front + [
        "",
        f"# Medusa heads for `{base}`",
        "",
        f"{cfg['num_heads']} Medusa-1 draft heads ({cfg['num_layers']} residual block(s) each, "
        + ("the base model's own `lm_head`" if cfg.get("shared_lm_head") else "own vocabulary projection")
        + f", {v.get('params', 0):,} trainable parameters) for lossless speculative decoding with "
        "specdec. The base model was frozen; the heads learned its own continuations "
        "(self-distillation).",
        "",
        "## Training data",
        "",
        f"- source: {data.get('kind', 'corpus')} `{data.get('name', 'local Python corpus')}`"
        + (" through the tokenizer's chat template" if data.get("chat") else ""),
        f"- {metrics['train_sequences']:,} training sequences ({metrics.get('train_generated_tokens', 0):,} "
        f"generated tokens, up to {metrics['gen_len']} per prompt; {data.get('records', '?')} records read), "
        f"{metrics['valid_sequences']:,} held-out prompts",
        (f"- distillation {metrics['distill_seconds']:.0f} s ({metrics['distill_tokens_per_second']:,.0f} tokens/s)"
         if metrics.get("distill_tokens") else f"- distillation loaded from the cache `{metrics.get('distill_cache')}`")
        + f", training {metrics['steps']:,} steps in {metrics['train_seconds']:.0f} s",
        "",
        "## Accuracy on held-out prompts",
        "",
        "Head k guesses token t+k+2 from the hidden state at t; measured on the base model's greedy replies to "
        "prompts held out of training.",
        "",
        "| head | predicts | top-1 | top-5 |",
        "| --- | --- | --- | --- |",
        *rows,
    ]
    tau = metrics.get("tau")
    if tau:
        lines += ["", f"Greedy mean accepted length on {tau['prompts']} held-out prompts × {tau['new_tokens']} "
                      f"tokens, heads alone (no prompt lookup), bonus token included: "
                      f"**{tau['mean_accepted_length']:.2f}** tokens per target forward "
                      f"({tau['identical_to_greedy']}/{tau['prompts']} outputs identical to plain greedy)."]
    lines += [
        "",
        "## Tree",
        "",
        f"{len(paths) + 1} nodes (root included)" + (f", chosen by {chosen_by}" if chosen_by else
                                                      ", the best expected accepted length for its node budget")
        + f": `{json.dumps([list(p) for p in paths])}`",
        "",
        "## Command",
        "",
        "```bash",
        info.get("command", "(not recorded)"),
        "```",
        "",
        "## Use",
        "",
        "```python",
        "import specdec",
        f"loaded = specdec.load({model_arg!r}, heads={heads_arg!r})",
        "print(specdec.generate(loaded, prompt=\"Hello\", max_new_tokens=64"
        + (", chat=True" if data.get("chat") else "") + ").text)",
        "```",
        "",
        "```bash",
        f"specdec generate --model {model_arg} --heads {heads_arg} --prompt \"Hello\""
        + (" --chat" if data.get("chat") else ""),
        "# an OpenAI-compatible server, and the demo (pip install 'specdec[app]'):",
        f"specdec serve --model {model_arg} --heads {heads_arg}",
        f"specdec app --model {model_arg} --heads {heads_arg}",
        "# vLLM's Medusa layout:",
        f"specdec export-heads --heads {heads_arg} --format vllm --out {heads_arg}-vllm",
        "# publish on the hub (huggingface_hub's CLI; log in first with `hf auth login`):",
        f"hf upload <user>/<repo> {heads_arg} .",
        "```",
        "",
    ]
    return "\n".join(lines)


def write_card(metrics: dict, variant: str, heads_dir: str | Path) -> Path:
    """README.md beside the weights: Medusa heads' card, or the EAGLE-3 drafter's (variant "eagle3")."""
    path = Path(heads_dir) / "README.md"
    text = render_eagle_card(metrics, Path(heads_dir)) if variant == "eagle3" else render_card(metrics, variant, Path(heads_dir))
    path.write_text(text)
    return path


def render_eagle_card(metrics: dict, eagle_dir: Path) -> str:
    """The card of a trained EAGLE-3 drafter (from eagle3_metrics.json and its config.json)."""
    info = metrics.get("card", {})
    config = json.loads((eagle_dir / "config.json").read_text())
    base = info.get("base_model") or "unknown"
    data = info.get("data", {})
    arg = info.get("heads_dir_hint", str(eagle_dir))
    model_arg = info.get("model_arg", base)
    tree = (config.get("specdec") or {}).get("tree", {})
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    rows = [f"| {j} | {'target states' if j == 0 else f'its own step {j - 1} output'} | {a:.1%} |"
            for j, a in enumerate(metrics["top1_by_step"])]
    tau = metrics.get("tau")
    lines = ["---", f"base_model: {_yaml_str(base)}", "library_name: specdec", "tags:", "- eagle3",
             "- speculative-decoding", "- specdec", "---", "",
             f"# EAGLE-3 drafter for `{base}`", "",
             f"One decoder layer ({metrics['params']:,} parameters) that fuses the target's hidden states entering "
             f"layers {layers} and drafts a tree token by token, over a draft vocabulary of "
             f"{metrics['draft_vocab_size']:,} ids. The target was frozen; the drafter learned its own replies "
             f"(self-distillation), fed its own outputs for {metrics['unrolled_steps']} steps (the training-time test).",
             "", "## Training data", "",
             f"- source: {data.get('kind', 'corpus')} `{data.get('name', 'local Python corpus')}`"
             + (" through the tokenizer's chat template" if data.get("chat") else ""),
             f"- {metrics['train_sequences']:,} training sequences (up to {metrics['gen_len']} generated tokens each), "
             f"{metrics['valid_sequences']:,} held-out prompts; {metrics['steps']:,} steps in "
             f"{metrics['train_seconds']:.0f} s", "",
             "## Accuracy on held-out replies", "",
             "Top-1 of each unrolled step against the token the target actually wrote two positions on.", "",
             "| step | reads | top-1 |", "| --- | --- | --- |", *rows]
    if tau:
        lines += ["", f"Greedy mean accepted length on {tau['prompts']} held-out prompts × {tau['new_tokens']} "
                      f"tokens, on its {tree.get('budget', 15) + 1}-node tree, no prompt lookup: "
                      f"**{tau['mean_accepted_length']:.2f}** tokens per target forward."]
    lines += ["", "## Use", "", "```python", "import specdec",
              f"loaded = specdec.load({model_arg!r}, heads={arg!r})",
              "print(specdec.generate(loaded, prompt=\"Hello\", max_new_tokens=64).text)", "```", "",
              "```bash", f"specdec serve --model {model_arg} --heads {arg}",
              "# vLLM and SGLang load this folder as it is (SafeAILab's EAGLE-3 layout):",
              f"vllm serve {model_arg} --speculative-config '{{\"method\": \"eagle3\", \"model\": \"{arg}\", "
              f"\"num_speculative_tokens\": {tree.get('depth', 5)}}}'",
              f"python -m sglang.launch_server --model {model_arg} --speculative-algorithm EAGLE3 "
              f"--speculative-draft-model-path {arg} --speculative-num-steps {tree.get('depth', 5)} "
              f"--speculative-eagle-topk {tree.get('top_k', 4)} --speculative-num-draft-tokens {tree.get('budget', 15) + 1}",
              "```", "", "## Command", "", "```bash", info.get("command", "(not recorded)"), "```", ""]
    return "\n".join(lines)
