"""cortiq run / chat / bench / convert / serve argument handling (in-process, toy model)."""
import io
import json
import logging
import os
import subprocess
import sys

import pytest

import cortiq
from cortiq.serve.cli import main

sys.path.insert(0, os.path.dirname(__file__))
import toy_model as T
import optional

T.register()
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("cli") / "toy.cmf"
    T.write_toy(p)
    return str(p)


def test_run_chat_mode_and_raw(toy_path, capsys):
    assert main(["run", toy_path, "-p", "hello world", "--greedy", "-n", "6"]) == 0
    out = capsys.readouterr().out
    with cortiq.LLM(toy_path) as llm:
        ref = llm.create_chat_completion([{"role": "user", "content": "hello world"}],
                                         max_tokens=6, temperature=0, repetition_penalty=1.0)
        raw = llm.generate("hello world", max_tokens=6, temperature=0, repetition_penalty=1.0)
    assert out == ref["choices"][0]["message"]["content"] + "\n"
    assert main(["run", toy_path, "-p", "hello world", "--greedy", "-n", "6", "--raw",
                 "--stream", "--stats"]) == 0
    cap = capsys.readouterr()
    assert cap.out == raw + "\n" and "generated tokens" in cap.err


def test_chat_reuses_the_session(toy_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello world\nthe lazy dog\n/exit\n"))
    assert main(["chat", toy_path, "--greedy", "-n", "5", "--stats"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert ", 0 reused," in err[0]
    reused = int(err[1].split(", ")[1].split()[0])
    assert reused > 10


def test_bench_json(toy_path, capsys):
    assert main(["bench", toy_path, "--tokens", "4", "--prompt-tokens", "16", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["turn_reused_tokens"] == 16 + 4          # prompt + fed decode tokens
    assert res["decode_tokens"] == 4


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cortiq", *args], capture_output=True,
                          text=True, timeout=120, cwd=PKG_PARENT, check=False)


@pytest.mark.parametrize("args,needle", [
    (["run", "/nonexistent.cmf", "-p", "x"], "nonexistent.cmf"),
    (["bench", "/nonexistent.cmf"], "nonexistent.cmf"),
    (["serve", "/nonexistent.cmf"], "nonexistent.cmf"),
    (["convert", "/nonexistent-dir", "/tmp/x.cmf", "--quiet"], "config.json"),
    (["convert", "/nonexistent-dir", "/tmp/x.cmf", "--quant", "q9"], "--quant"),
])
def test_user_errors_are_one_line(args, needle):
    r = _cli(*args)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cortiq: error:") and needle in lines[0]


def test_bad_sampling_value_is_one_line(toy_path, capsys):
    assert main(["run", toy_path, "-p", "x", "--top-p", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--top-p: must be in [0, 1]" in err[0]


def test_serve_on_a_busy_port_is_one_line(toy_path, capsys):
    optional.need("extras", "uvicorn")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", toy_path, "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot listen on 127.0.0.1" in err[0]
    # serve() leaves the process's logging as it found it (no handler on a stream that
    # may be closed later, failures still propagate to the application's handlers)
    server_log = logging.getLogger("cortiq.server")
    assert server_log.handlers == [] and server_log.propagate


def test_chat_drops_old_exchanges_to_fit(toy_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello world " * 6 + "\n" + "the lazy dog\n"
                                                  + "the quick brown fox\n"))
    assert main(["chat", toy_path, "--greedy", "-n", "4", "--n-ctx", "80", "--stats"]) == 0
    err = capsys.readouterr().err
    assert "dropped the oldest exchange" in err
    assert err.count("generated;") == 3


def test_chat_and_bench_without_a_model_use_the_demo(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Once upon a time\n/exit\n"))
    assert main(["chat", "--greedy", "-n", "3", "--stats"]) == 0
    assert "generated" in capsys.readouterr().err
    assert main(["bench", "--tokens", "2", "--prompt-tokens", "4", "--turn-tokens", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_tokens"] == 2
