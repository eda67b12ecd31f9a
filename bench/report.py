"""The benchmark's reports: a Markdown table, the JSON results, and a self-contained HTML page with figures."""
from __future__ import annotations

import json
from pathlib import Path

from .runners import STAGES


def _f(x, fmt="{:.2f}", none="-"):
    return none if x is None else fmt.format(x)


def markdown_table(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"model `{meta['model']}` ({meta['params_m']:.1f}M params), {meta['device']} {meta['dtype']}, "
        f"{meta['prompts']} prompts x {meta['max_new_tokens']} new tokens, median of {meta['repeats']} repeats, "
        f"{meta['machine']['gpu'] or meta['machine']['cpu']} ({meta['machine']['torch_threads']} threads)"
        + (f" -- PARTIAL: {meta['partial']}, no memory figures" if meta.get("partial") else ""),
        "",
        "| method | tok/s | speedup vs HF greedy | vs own plain | tau | nodes/round | expected err | acc@d (d=1..) "
        "| ms/tok p50 | ms/tok p99 | peak mem MiB | non-fwd % | eff. | greedy == HF |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result["methods"]:
        acc = " ".join(_f(a, "{:.2f}") for a in r["acceptance_per_depth"]) or "-"
        tree = f"{r['tree_nodes']} nodes" if r["tree_nodes"] else f"tree {r['tree']}"  # no fixed size: a policy
        if r.get("temperature_top_p") and tuple(r["temperature_top_p"]) != (meta["sampling"]["temperature"],
                                                                            meta["sampling"]["top_p"]):
            tree += ", T={:g} top-p={:g}".format(*r["temperature_top_p"])
        nodes = f" ({tree})" if r["tree"] is not None else ""
        if r.get("lookup"):
            nodes = (f" (lookup {r['lookup']})" if r["tree_nodes"] == 1
                     else f" ({tree} {'+' if r['lookup_mode'] == 'merge' else 'or'} lookup {r['lookup']})")
        g = r.get("greedy_check")
        if g is None:
            check = "n/a (sampling)"
        else:
            check = f"{g['tokens_equal']}/{g['runs']} ids"
            check += f", {g['text_equal']}/{g['runs']} text" if g["text_equal"] is not None else ""
            check += f" (1st diff @{g['first_mismatch']})" if g["first_mismatch"] is not None else ""
        lines.append(
            f"| {r['id']}{nodes} | {r['tok_s_median']:.1f} | {_f(r['speedup_vs_hf_greedy'])}x | "
            f"{_f(r.get('speedup_vs_plain'))}x | {_f(r['mean_accepted_length'])} | {_f(r.get('mean_tree_nodes'), '{:.1f}')} | "
            f"{_f(r.get('expected_length_mae'))} | {acc} | {_f(r['ms_per_token_p50'])} | {_f(r['ms_per_token_p99'])} | "
            f"{_f(r['peak_mem_mb'], '{:.1f}')} | {_f(r.get('non_forward_pct'), '{:.0f}')} | {_f(r['efficiency'])} | "
            f"{check} |")
    if result["targets"]:
        lines += ["", "| target | measured | needed | met |", "| --- | ---: | ---: | --- |"]
        for t in result["targets"]:
            lines.append(f"| {t['name']} | {_f(t['ratio'])}x | {t['target']:.1f}x | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


COLORS = {"hf": "#8c8c8c", "plain": "#4c78a8", "spec": "#f58518", "sample": "#54a24b"}


def _color(r: dict) -> str:
    if r["backend"] == "hf":
        return COLORS["hf"]
    if r["tree"] is None:
        return COLORS["plain"]
    return COLORS["sample"] if r["sampling"] else COLORS["spec"]


def figures(result: dict) -> list:
    """Plotly figures: speedup, tok/s, acceptance per depth, per-token latency, round breakdown."""
    import plotly.graph_objects as go

    rows = result["methods"]
    ids = [r["id"] for r in rows]
    figs = []
    f = go.Figure(go.Bar(x=ids, y=[r["speedup_vs_hf_greedy"] for r in rows], marker_color=[_color(r) for r in rows],
                         text=[_f(r["speedup_vs_hf_greedy"]) + "x" for r in rows], textposition="outside"))
    f.add_hline(y=1.0, line_dash="dot", line_color="#333333")
    f.update_layout(title="Speedup over HF greedy generate (median tok/s ratio, same run)", yaxis_title="x")
    figs.append(f)
    f = go.Figure(go.Bar(x=ids, y=[r["tok_s_median"] for r in rows], marker_color=[_color(r) for r in rows],
                         error_y=dict(type="data", symmetric=False,
                                      array=[max(r["tok_s_runs"]) - r["tok_s_median"] for r in rows],
                                      arrayminus=[r["tok_s_median"] - min(r["tok_s_runs"]) for r in rows])))
    f.update_layout(title="Tokens/s: median over repeats (whiskers: min and max repeat)", yaxis_title="tok/s")
    figs.append(f)
    f = go.Figure()
    for r in rows:
        if r["acceptance_per_depth"]:
            d = list(range(1, len(r["acceptance_per_depth"]) + 1))
            f.add_trace(go.Scatter(x=d, y=r["acceptance_per_depth"], mode="lines+markers", name=r["id"]))
    f.update_layout(title="Acceptance per depth: rounds accepting >= d drafts / rounds whose tree reached depth d",
                    xaxis_title="depth d", yaxis_title="rate", yaxis_range=[0, 1.05], xaxis_dtick=1)
    figs.append(f)
    f = go.Figure([go.Bar(x=ids, y=[r["ms_per_token_p50"] for r in rows], name="p50", marker_color="#4c78a8"),
                   go.Bar(x=ids, y=[r["ms_per_token_p99"] for r in rows], name="p99", marker_color="#e45756")])
    f.update_layout(title="Time per emitted token (ms)", barmode="group", yaxis_title="ms")
    figs.append(f)
    eng = [r for r in rows if r.get("stage_ms_per_round")]
    if eng:
        palette = ["#f58518", "#4c78a8", "#54a24b", "#b279a2", "#9d755d", "#bab0ac"]
        f = go.Figure([go.Bar(x=[r["id"] for r in eng], y=[r["stage_ms_per_round"][s] for r in eng], name=s,
                              marker_color=c) for s, c in zip(STAGES, palette)])
        f.update_layout(title="Engine round breakdown (ms per decoding round)", barmode="stack", yaxis_title="ms")
        figs.append(f)
    for f in figs:
        f.update_layout(template="plotly_white", height=420)
    return figs


def html_report(result: dict, markdown: str) -> str:
    """A self-contained page (plotly.js inlined, so it opens offline); the table alone without plotly."""
    meta = result["meta"]
    try:
        parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures(result))]
    except ImportError:
        parts = ["<p>plotly is not installed here: rebuild this page with "
                 "<code>python bench.py --report-from results.json</code>.</p>"]
    table = "<pre>" + markdown.replace("&", "&amp;").replace("<", "&lt;") + "</pre>"
    return ("<!doctype html><html><head><meta charset='utf-8'><title>specdec benchmark</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}pre{font-size:12px}</style></head><body>"
            f"<h1>specdec benchmark</h1><p><code>{meta['command']}</code> at {meta['date']}</p>{table}"
            + "".join(parts) + "<h2>meta</h2><pre>" + json.dumps(meta, indent=1) + "</pre></body></html>")


def write_reports(result: dict, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown_table(result)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "html": out / "report.html"}
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["markdown"].write_text(md)
    paths["html"].write_text(html_report(result, md))
    return paths
