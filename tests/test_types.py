"""The typing surface: src/cortiq/kernels/_kernels.pyi matches the compiled module, cortiq.types
describes what the API returns, py.typed ships, and mypy passes (when installed)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import typing


import cortiq
from cortiq.kernels import _kernels
from cortiq import types as T
import optional

PKG = os.path.dirname(os.path.abspath(cortiq.__file__))


def _stub_names() -> set[str]:
    with open(os.path.join(PKG, "kernels", "_kernels.pyi")) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_kernel_stub_matches_the_module():
    stub = _stub_names()
    imported = {"np", "KernelError"}             # names the module imports, not defines
    public = {n for n in dir(_kernels) if not n.startswith("_") and n not in imported}
    assert public - stub == set(), "in cortiq.kernels._kernels but not in _kernels.pyi: rerun " \
        "tools/gen_kernels_pyi.py"
    assert {n for n in stub if not hasattr(_kernels, n)} == set()


def test_py_typed_ships():
    assert os.path.exists(os.path.join(PKG, "py.typed"))


def _required(td) -> set[str]:
    return set(td.__required_keys__)


def test_responses_have_their_typed_keys():
    llm = cortiq.LLM(seed=1)
    try:
        c = llm.create_completion("x", max_tokens=2)
        assert _required(T.Completion) <= set(c)
        assert _required(T.CompletionChoice) <= set(c["choices"][0])
        assert _required(T.CompletionUsage) <= set(c["usage"])
        ch = llm.create_chat_completion([{"role": "user", "content": "x"}], max_tokens=2,
                                        logprobs=True, top_logprobs=1)
        assert _required(T.ChatCompletion) <= set(ch)
        choice = ch["choices"][0]
        assert _required(T.ChatCompletionChoice) <= set(choice)
        assert set(choice["message"]) <= set(typing.get_type_hints(T.ChatCompletionMessage))
        for e in choice["logprobs"]["content"]:
            assert set(e) == _required(T.ChatCompletionTokenLogprob)
        for chunk in llm.create_chat_completion([{"role": "user", "content": "x"}],
                                                max_tokens=2, stream=True):
            assert _required(T.ChatCompletionChunk) <= set(chunk)
            assert set(chunk["choices"][0]["delta"]) <= set(
                typing.get_type_hints(T.ChatCompletionDelta))
    finally:
        llm.close()


def test_mypy_is_clean():
    optional.need("extras", "mypy")
    # a checkout: <root>/src/cortiq; pyproject.toml is at <root>
    cfg = os.path.join(os.path.dirname(os.path.dirname(PKG)), "pyproject.toml")
    optional.need_that("source", os.path.exists(cfg),
                       "the installed package has no pyproject.toml next to it "
                       "(.ci/run runs mypy on the tree)")
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", cfg, PKG],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:]
