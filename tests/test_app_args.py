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


@pytest.fixture
def torch_threads():
    """`app.main` sets torch's thread count for the process: give the other tests theirs back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_main_measures_the_cost_model_while_the_server_starts(monkeypatch, torch_threads):
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
    app.main(["--port", "0", "--engine-process", "off"])
    assert launched
    loaded.scheduler.call(lambda: None)  # calls run in order: the warm-up has finished
    assert loaded.engine._cost is not None
    loaded.scheduler.close()


@pytest.mark.process  # "on" starts the engine process
@pytest.mark.parametrize("where", ["off", "on"])
def test_main_names_why_a_model_is_refused(monkeypatch, tmp_path, where):
    """A model specdec cannot run exactly (here BLOOM: ALiBi cannot take a tree mask) stops the app at
    start-up with the reason as one line, not a traceback: loaded here, or by the engine's process."""
    import app
    from test_target import alibi_model

    from pathlib import Path

    from transformers import AutoTokenizer

    alibi_model("bloom").save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(Path(app.__file__).parent / "assets" / "model").save_pretrained(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: BloomForCausalLM cannot verify a draft tree exactly"):
        app.main(["--model", str(tmp_path), "--heads", "random", "--port", "0", "--engine-process", where])


def test_engine_process_flag(monkeypatch):
    from specdec.engine_process import wanted

    def engine_process_on(args):
        return wanted(args.engine_process, args.device)

    assert parse_args([]).engine_process == "auto"
    assert engine_process_on(parse_args(["--engine-process", "on", "--device", "cuda"]))
    assert not engine_process_on(parse_args(["--engine-process", "off"]))
    assert engine_process_on(parse_args(["--device", "cpu"]))  # auto: on for a CPU
    assert not engine_process_on(parse_args(["--device", "cuda"]))  # auto: off on CUDA (not measured there)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name == "spaces" else None)
    assert not engine_process_on(parse_args(["--device", "cpu"]))  # auto: off under ZeroGPU


def test_threads_flag():
    assert parse_args([]).threads == "auto"
    assert parse_args(["--threads", "3"]).threads == 3


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_bad_threads_are_named(value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--threads", value])
    assert f"--threads must be 'auto' or an integer >= 1, got '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize("flag,measured", [([], True), (["--threads", "2"], False)])
def test_main_sets_the_threads_before_the_scheduler_runs(monkeypatch, capsys, torch_threads, flag, measured):
    """The count is chosen (measured, or given) before the scheduler's thread runs its first op, so its
    OpenMP pool has that count: the cost model's warm-up, its first work, sees it."""
    import gradio as gr
    import torch

    import app
    import specdec

    loaded = specdec.load()
    monkeypatch.setattr(specdec, "load", lambda *a, **k: loaded)
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: None)
    timed = {"default": 2, "ms": {2: {16: 5.0, 64: 9.0}, 1: {16: 4.0, 64: 10.0}}}
    monkeypatch.setattr(specdec.cost, "serving_threads", lambda target: (1, timed))
    seen = []
    monkeypatch.setattr(loaded.engine, "cost_model", lambda: seen.append(torch.get_num_threads()))
    app.main(["--port", "0", "--engine-process", "off", *flag])
    loaded.scheduler.call(lambda: None)
    expected = 1 if measured else 2
    assert seen == [expected]
    out = capsys.readouterr().out
    if measured:
        assert "torch threads: 1 (measured forwards: 16 tokens 4.0 ms on one against 5.0 on 2, 64 tokens 10.0 ms" in out
    else:
        assert "torch threads: 2 (--threads)" in out
    loaded.scheduler.close()
