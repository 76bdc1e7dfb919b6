"""Python API habits from llama-cpp-python and vLLM: `llm(prompt)`, `create_embedding`,
the `repeat_penalty` alias, `max_tokens=None/-1`, `seed=-1`, `generate([...])`, and the
CLI naming the flag of a bad value."""
import base64
import os
import sys

import numpy as np
import pytest

import cortiq
from cortiq.errors import ConfigError
from cortiq.runtime.sampling import SamplingParams

sys.path.insert(0, os.path.dirname(__file__))
import toy_model as T

T.register()
PROMPTS = ["The quick brown", "Once upon", "def sorted("]


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("habits") / "toy.cmf"
    T.write_toy(p, max_pos=64)
    return str(p)


@pytest.fixture(scope="module")
def llm(toy_path):
    with cortiq.LLM(toy_path, seed=3, max_batch=1) as m:
        yield m


@pytest.fixture(scope="module")
def demo():
    """The bundled demo model (the toy model gives no hidden states to embed)."""
    with cortiq.LLM(os.path.join(os.path.dirname(cortiq.__file__), "data", "demo.cmf")) as m:
        yield m


@pytest.fixture(scope="module")
def batched(toy_path):
    with cortiq.LLM(toy_path, seed=3, max_batch=4) as m:
        yield m


def _text(r):
    return r["choices"][0]["text"]


def test_call_is_create_completion(llm):
    a = llm("The quick brown", max_tokens=5, temperature=0)
    b = llm.create_completion("The quick brown", max_tokens=5, temperature=0)
    assert a["object"] == "text_completion"
    assert _text(a) == _text(b)
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]


def test_create_embedding_shape_and_values(demo):
    r = demo.create_embedding(["alpha beta", "gamma"])
    assert r["object"] == "list" and r["model"] == demo.model_name
    assert [d["index"] for d in r["data"]] == [0, 1]
    want = demo.embed(["alpha beta", "gamma"])
    got = np.array([d["embedding"] for d in r["data"]], np.float32)
    np.testing.assert_array_equal(got, want)
    n = len(demo.tokenize("alpha beta")) + len(demo.tokenize("gamma"))
    assert r["usage"] == {"prompt_tokens": n, "total_tokens": n}


def test_create_embedding_one_string_base64_and_model_name(demo):
    r = demo.create_embedding("alpha beta", model="mine", encoding_format="base64")
    assert r["model"] == "mine" and len(r["data"]) == 1
    v = np.frombuffer(base64.b64decode(r["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(v, demo.embed("alpha beta"))


def test_create_embedding_token_ids_and_bad_input(demo):
    ids = demo.tokenize("alpha beta")
    r = demo.create_embedding(ids)
    assert len(r["data"]) == 1 and r["usage"]["prompt_tokens"] == len(ids)
    with pytest.raises(ConfigError, match=r"input\[1\]"):
        demo.create_embedding(["fine", ""])
    with pytest.raises(ConfigError, match="encoding_format"):
        demo.create_embedding("x", encoding_format="hex")


def test_repeat_penalty_is_repetition_penalty(llm):
    p = llm._params(None, {"repeat_penalty": 1.3})
    assert p.repetition_penalty == pytest.approx(1.3)
    same = llm._params(None, {"repeat_penalty": 1.3, "repetition_penalty": 1.3})
    assert same.repetition_penalty == pytest.approx(1.3)
    a = llm.generate("The quick brown", max_tokens=6, temperature=0, repeat_penalty=1.5)
    b = llm.generate("The quick brown", max_tokens=6, temperature=0, repetition_penalty=1.5)
    assert a == b


@pytest.mark.parametrize("call", ["generate", "create_completion", "create_chat_completion"])
def test_repeat_penalty_conflict_names_both(llm, call):
    arg = [{"role": "user", "content": "hi"}] if call == "create_chat_completion" else "hi"
    with pytest.raises(ConfigError, match="repeat_penalty and repetition_penalty"):
        getattr(llm, call)(arg, max_tokens=2, repeat_penalty=1.2, repetition_penalty=1.1)


@pytest.mark.parametrize("limit", [None, -1])
def test_max_tokens_none_or_minus_one_runs_to_the_context(llm, limit):
    never_end = list(llm.tokenizer.eos_token_ids)
    r = llm.create_completion("The quick brown", max_tokens=limit, temperature=0,
                              suppress_tokens=never_end)
    u = r["usage"]
    assert r["choices"][0]["finish_reason"] == "length"
    assert u["prompt_tokens"] + u["completion_tokens"] == llm.n_ctx
    c = llm.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=limit,
                                   temperature=0)
    assert c["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_other_max_tokens_stay_errors(llm, bad):
    with pytest.raises(ConfigError, match="max_tokens"):
        llm.create_completion("hi", max_tokens=bad)


def test_seed_minus_one_is_fresh_entropy(llm):
    assert SamplingParams(seed=-1).seed is None
    assert llm._params(None, {"seed": -1}).seed is None
    with pytest.raises(ConfigError, match="seed"):
        SamplingParams(seed=-2)
    outs = {llm.generate("The quick brown", max_tokens=8, temperature=5.0, top_k=0, top_p=1,
                         min_p=0, seed=-1) for _ in range(6)}
    assert len(outs) > 1                       # not one fixed seed
    fixed = {llm.generate("The quick brown", max_tokens=8, temperature=5.0, top_k=0,
                          top_p=1, min_p=0, seed=7) for _ in range(3)}
    assert len(fixed) == 1


@pytest.mark.parametrize("which", ["llm", "batched"])
def test_generate_list_matches_one_at_a_time(request, which):
    m = request.getfixturevalue(which)
    one = [m.generate(p, max_tokens=6, temperature=0) for p in PROMPTS]
    many = m.generate(PROMPTS, max_tokens=6, temperature=0)
    assert isinstance(many, list) and many == one
    ids = [m.tokenize(p) for p in PROMPTS]
    assert m.generate(ids, max_tokens=6, temperature=0) == one


def test_generate_one_prompt_unchanged(llm):
    ids = llm.tokenize("The quick brown")
    assert isinstance(llm.generate(ids, max_tokens=3, temperature=0), str)
    assert isinstance(llm.generate("The quick brown", max_tokens=3, temperature=0), str)


def test_generate_list_refusals(llm):
    with pytest.raises(ConfigError, match="stream"):
        llm.generate(PROMPTS, stream=True)
    with pytest.raises(ConfigError, match="session"):
        llm.generate(PROMPTS, session=llm.session())
    with pytest.raises(ConfigError, match=r"prompt\[1\]"):
        llm.generate(["fine", ""], max_tokens=2)


# ---------------------------------------------------------------- the CLI

def _cli(argv, capsys):
    from cortiq.serve.cli import main
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("flag,value,field", [
    ("--top-p", "5", "--top-p: must be in [0, 1]"),
    ("--temperature", "-1", "--temperature: must be in [0, inf)"),
    ("--repetition-penalty", "0", "--repetition-penalty: must be in (0, inf)"),
    ("--seed", "-5", "--seed: must be an integer"),
    ("--max-tokens", "0", "--max-tokens: expected an integer >= 1"),
])
def test_cli_bad_value_names_the_flag(toy_path, capsys, flag, value, field):
    rc, err = _cli(["run", toy_path, "--prompt", "hi", flag, value], capsys)
    assert rc == 1
    assert field in err and "SamplingParams" not in err


def test_cli_unknown_flag_prints_the_subcommand_usage(capsys):
    rc, err = _cli(["run", "--bogus"], capsys)
    assert rc == 2
    assert "usage: cortiq run" in err and "unrecognized arguments: --bogus" in err
