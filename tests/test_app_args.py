"""components/app_args.py: the app's flags, their defaults, and named errors for bad values."""
from __future__ import annotations

import pytest

from components.app_args import parse_args, prefix_cache


def test_defaults():
    a = parse_args([])
    assert (a.host, a.port, a.max_prompt_tokens, a.queue_size) == ("127.0.0.1", 7860, 512, 16)
    assert a.max_batch_size >= 1 and a.chaos == 0.0
    assert prefix_cache(a).max_bytes == 256 * 2**20
    assert prefix_cache(parse_args(["--no-prefix-cache"])) is None


@pytest.mark.parametrize("flags,message", [
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["--queue-size", "0"], "--queue-size must be >= 1"),
    (["--max-batch-size", "0"], "--max-batch-size must be >= 1"),
    (["--chaos", "1.5"], r"--chaos must be in \[0, 1\]"),
    (["--prefix-cache-mb", "0"], "--prefix-cache-mb must be > 0"),
])
def test_bad_values_are_named(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(flags)
    assert message.replace("\\", "") in capsys.readouterr().err


def test_main_measures_the_cost_model_while_the_server_starts(monkeypatch):
    """`python app.py` queues the dynamic tree's cost model on the scheduler's thread before it serves, so
    the first visitor's first request does not pay for it (measured: TTFT 0.9-1.1 s -> 0.08-0.14 s)."""
    import gradio as gr

    import app
    import specdec

    loaded = specdec.load()
    launched = []
    monkeypatch.setattr(specdec, "load", lambda *a, **k: loaded)
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: launched.append(kw))
    assert loaded.engine._cost is None  # nothing has asked for it yet
    app.main(["--port", "0"])
    assert launched
    loaded.scheduler.call(lambda: None)  # calls run in order: the warm-up has finished
    assert loaded.engine._cost is not None
    loaded.scheduler.close()


def test_main_names_why_a_model_is_refused(monkeypatch, tmp_path):
    """A model specdec cannot run exactly (here BLOOM: ALiBi cannot take a tree mask) stops the app at
    start-up with the reason as one line, not a traceback."""
    import app
    from test_target import alibi_model

    from pathlib import Path

    from transformers import AutoTokenizer

    alibi_model("bloom").save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(Path(app.__file__).parent / "assets" / "model").save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: BloomForCausalLM cannot verify a draft tree exactly"):
        app.main(["--model", str(tmp_path), "--heads", "random", "--port", "0"])
