"""specdec/__main__.py: the `specdec` command; its errors are the request's own messages, exit status 2."""
from __future__ import annotations

import json

from specdec.__main__ import main as cli


def test_generate_prints_the_text_and_the_stats(capsys):
    assert cli(["generate", "--prompt", "def f(x):", "--max-new-tokens", "6", "--lookup", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def f(x):") and "6 tokens" in err and "mean accepted length" in err


def test_generate_json_is_the_text_and_stats(capsys):
    assert cli(["generate", "--prompt", "class A:", "--max-new-tokens", "5", "--json", "--no-speculation"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["token_ids"]) == 5 and res["stats"]["mean_accepted_length"] == 1.0
    assert "rounds" not in res and res["text"] and res["load_seconds"] > 0


def test_generate_drafts_with_the_drafter_it_is_told(capsys):
    for drafter, source in (("eagle3", "eagle3"), ("medusa", "heads")):
        assert cli(["generate", "--prompt", "class A:", "--max-new-tokens", "8", "--events", "--lookup", "0",
                    "--drafter", drafter]) == 0
        rounds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {n["source"] for r in rounds for n in r["nodes"]} - {"root"} == {source}
    assert cli(["generate", "--prompt", "x", "--drafter", "hydra"]) == 2
    assert "`drafter` must be one of" in capsys.readouterr().err


def test_generate_events_prints_each_round_as_a_json_line(capsys):
    assert cli(["generate", "--prompt", "class A:", "--max-new-tokens", "5", "--events", "--no-speculation"]) == 0
    out, err = capsys.readouterr()
    rounds = [json.loads(line) for line in out.splitlines()]
    assert [r["index"] for r in rounds] == [0, 1, 2, 3, 4] and "decode" in err and "tok/s" in err


def test_the_cli_refuses_bad_values_before_it_loads_anything(monkeypatch, capsys):
    import specdec

    def load(*a, **k):
        raise AssertionError("loaded before the flags were checked")

    monkeypatch.setattr(specdec, "load", load)
    for args, words in ((["--temperature", "-1"], "`temperature` must be"),
                        (["--top-p", "1.5"], "`top_p` must be"),
                        (["--max-new-tokens", "0"], "`max_new_tokens` must be an integer >= 1"),
                        (["--tree", "bushy"], "`tree` must be one of"),
                        (["--device", "cuda:7"], "`device` 'cuda:7' is not available"),
                        (["--dtype", "int3"], "`dtype` must be one of"),
                        (["--model", "./no/such/folder"], "`model` path './no/such/folder' does not exist")):
        assert cli(["generate", "--prompt", "x", *args]) == 2, args
        assert words in capsys.readouterr().err, args
    assert cli(["generate", "--prompt", "   "]) == 2
    assert "`--prompt` is empty" in capsys.readouterr().err


def test_bad_values_are_the_requests_messages(capsys):
    for args, words in ((["--lookup-mode", "both"], "`lookup_mode` must be one of"),
                        (["--lookup", "99"], "`lookup` must be an integer in [0, 64]"),
                        (["--acceptance", "fast"], "`acceptance` must be"),
                        (["--max-new-tokens", "0"], "`max_new_tokens` must be an integer >= 1")):
        assert cli(["generate", "--prompt", "x", *args]) == 2, args
        assert words in capsys.readouterr().err, args


def test_cli_chat_flag(capsys):
    assert cli(["generate", "--prompt", "hi", "--chat", "--max-new-tokens", "4"]) == 2
    assert "needs a chat template" in capsys.readouterr().err
