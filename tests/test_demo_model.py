"""The bundled demo model (src/cortiq/data/demo.cmf, trained by tools/train_demo.py).

* the file is intact (verify()), small (<= 8 MB) and a Dory with loops, a sliding window and
  a full-attention layer, carrying its tokenizer and a chat template;
* the training script's PyTorch forward is the Dory of tests/reference/dory_numpy.py
  (float64, random weights, both KV modes) -- so "parity with the training framework" is
  parity with the spec;
* the runtime's logits on the bundled weights equal the training framework's (torch f32)
  within LOGIT_TOL on a few prompts: rebuilt with torch from the file's (dequantized)
  weights when torch is installed, else read from tests/data/demo_reference_logits.json.gz;
* greedy generation from a fixed prompt is deterministic, and at least WORD_FRAC of the
  words it produces occur in the training text (tests/data/demo_train_words.txt.gz, written
  by the training script): it produces words, not noise.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from cortiq import cmf
from cortiq.demo import demo_path
import optional

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
REF_LOGITS = DATA / "demo_reference_logits.json.gz"
TRAIN_WORDS = DATA / "demo_train_words.txt.gz"

#: The issue's bound: runtime vs torch f32 on the same (dequantized) weights. Both sides
#: compute in f32 over 16 virtual sub-layers; observed: <= 5e-6 on logits up to ~12.
LOGIT_TOL = 1e-3
#: torch float64 vs the NumPy float64 reference on random weights: only rounding differs.
F64_TOL = 1e-9
#: The stored reference logits are torch f32 rounded to 6 significant digits; the float64
#: NumPy reference over the same weights lands within f32 accumulation error of them
#: (observed <= 4e-5).
STORED_VS_F64_TOL = 5e-4
#: The runtime on the q8 file vs torch on its dequantized weights: the q8 kernels keep
#: activations in f32, so the same bound holds (observed <= 5e-6, as on the f32 copy).
Q8_TOL = 1e-3
MAX_BYTES = 8 * 1000 * 1000
WORD_FRAC = 0.80
PROMPT = "Return a new list containing"
N_NEW = 48


def _train_demo():
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "tools" / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def demo_file():
    with cmf.open(demo_path()) as cf:
        yield cf


@pytest.fixture(scope="module")
def reference():
    with gzip.open(REF_LOGITS, "rt") as f:
        return json.load(f)


# ------------------------------------------------------------------ the file

def test_bundled_file_is_intact_and_small(demo_file):
    assert demo_file.verify() == []
    assert os.path.getsize(demo_path()) <= MAX_BYTES


def test_bundled_file_is_a_looped_windowed_dory_with_chat_bundle(demo_file):
    a = demo_file.arch
    d = a["dory"]
    assert a["arch_name"] == "dory"
    assert d["n_recurrent_loops"] == 2
    assert d["recurrent_kv_cache_mode"] in ("per_loop", "last_loop")
    assert "S" in d["layer_pattern"] and "*" in d["layer_pattern"]
    assert 0 < d["sliding_window"] < 4096
    assert demo_file.quant_type.lower().startswith("q8")
    assert demo_file.tokenizer_json() is not None
    tc = demo_file.tokenizer_config
    assert "<|im_start|>" in tc["chat_template"]
    assert tc["eos_token_ids"]
    n = sum(int(np.prod(t.shape)) for t in demo_file.tensors.values())
    assert 1_000_000 < n < 20_000_000          # "a few million parameters"


def test_demo_path_error_names_the_file(monkeypatch):
    from cortiq import demo
    from cortiq.errors import ConfigError
    monkeypatch.setattr(demo, "DEMO_FILE", "no-such-demo.cmf")
    with pytest.raises(ConfigError, match="no-such-demo.cmf"):
        demo.demo_path()


# ------------------------------------------------------------------ the training forward

def test_torch_forward_is_the_reference_dory():
    torch = optional.need("torch", "torch")
    from tests.reference import dory_numpy, hf_tiny
    td = _train_demo()
    for kv, loops, gate in (("per_loop", 2, None), ("last_loop", 3, 4.0)):
        tensors, config = hf_tiny.make(seed=5, kv_mode=kv, loops=loops, window=3,
                                       gate_init=gate)
        ref = dory_numpy.DoryReference(tensors, config)
        model = td.Dory.from_tensors(tensors, config, torch.float64)
        ids = np.random.default_rng(1).integers(0, config["vocab_size"], 19)
        want = ref.forward(ids)
        with torch.no_grad():
            got = model(torch.as_tensor(ids)).numpy()[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=F64_TOL)


def test_torch_sphere_normalisation_follows_ngpt():
    optional.need("torch", "torch")
    from tests.reference import hf_tiny
    td = _train_demo()
    config = hf_tiny.hf_config()
    model = td.Dory(config)
    model.init_weights(0)
    sd = model.state_dict()
    row = lambda w: np.linalg.norm(w.numpy(), axis=1)  # noqa: E731
    col = lambda w: np.linalg.norm(w.numpy(), axis=0)  # noqa: E731
    for name, w in sd.items():
        if w.ndim != 2:
            continue
        norms = col(w) if name.endswith(("o_proj.weight", "down_proj.weight")) else row(w)
        np.testing.assert_allclose(norms, 1.0, atol=1e-5, err_msg=name)
    # effective scale values start where nGPT starts them (spec 2.2 transforms)
    std = config["init_method_std"]
    assert float(sd["backbone.layers.0.attn_alpha"][0]) == pytest.approx(std)
    assert float(sd["backbone.layers.1.mixer.suv_up"][0]) == 1.0


def test_stored_reference_logits_match_the_numpy_reference(demo_file, reference):
    """The JSON's torch logits are the Dory forward of the bundled weights (float64 check)."""
    from tests.reference import dory_numpy
    ref = dory_numpy.DoryReference.from_cmf_file(demo_file)
    assert len(reference["prompts"]) >= 3
    for p in reference["prompts"]:
        want = ref.forward(p["ids"])[p["rows"]]
        got = np.asarray(p["logits"])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=STORED_VS_F64_TOL)


def test_stored_reference_logits_are_torch_f32_of_the_file(demo_file, reference):
    torch = optional.need("torch", "torch")
    td = _train_demo()
    from cortiq.convert.hf_dory import hf_name
    config = demo_file.header["provenance"]["hf_config"]
    model = td.Dory.from_tensors({hf_name(n): demo_file.tensor(n) for n in demo_file.names()},
                                 config, torch.float32).eval()
    for p in reference["prompts"]:
        with torch.no_grad():
            got = model(torch.as_tensor([p["ids"]]))[0].numpy()[p["rows"]]
        np.testing.assert_allclose(got, np.asarray(p["logits"]), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------ the runtime

def _torch_logits(demo_file, reference):
    """[(ids, rows, logits f32 of those rows)]: torch when installed, else the stored ones."""
    try:
        import torch
    except ImportError:
        return [(p["ids"], p["rows"], np.asarray(p["logits"], np.float32))
                for p in reference["prompts"]]
    td = _train_demo()
    from cortiq.convert.hf_dory import hf_name
    config = demo_file.header["provenance"]["hf_config"]
    model = td.Dory.from_tensors({hf_name(n): demo_file.tensor(n) for n in demo_file.names()},
                                 config, torch.float32).eval()
    out = []
    for p in reference["prompts"]:
        with torch.no_grad():
            lg = model(torch.as_tensor([p["ids"]]))[0].numpy()
        out.append((p["ids"], p["rows"], lg[p["rows"]]))
    return out


@pytest.fixture(scope="module")
def f32_copy(demo_file, tmp_path_factory):
    """The bundled weights (dequantized) rewritten as an all-f32 CMF: the runtime then
    computes on exactly the f32 weights the torch reference used."""
    path = tmp_path_factory.mktemp("demo") / "demo_f32.cmf"
    names = demo_file.names()
    cmf.write(path, [(n, demo_file.tensor(n)) for n in names], arch=demo_file.arch,
              quant="f32", dtypes={n: "f32" for n in names},
              tokenizer_json=demo_file.tokenizer_json(),
              tokenizer_config=demo_file.tokenizer_config,
              provenance=demo_file.header.get("provenance"), progress=False)
    return path


def test_runtime_matches_training_framework_on_f32_weights(demo_file, reference, f32_copy):
    from cortiq.runtime.llm import LLM
    with LLM(f32_copy) as llm:
        for ids, rows, want in _torch_logits(demo_file, reference):
            got = np.asarray(llm.session().feed(ids, want="all"))[rows]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_TOL)


def test_runtime_on_the_q8_file_stays_close(demo_file, reference):
    """The shipped q8 file itself: logits within Q8_TOL of torch on its dequantized weights
    (float32 activations: the default, "auto", takes prompt chunks to int8)."""
    from cortiq.runtime.llm import LLM
    with LLM(precision="exact") as llm:
        for ids, rows, want in _torch_logits(demo_file, reference):
            got = np.asarray(llm.session().feed(ids, want="all"))[rows]
            np.testing.assert_allclose(got, want, rtol=0, atol=Q8_TOL)


def _greedy(llm, prompt: str, n: int) -> tuple[list[int], str]:
    from cortiq.text.tokenizer import Tokenizer
    tok = Tokenizer.from_cmf(llm.file)
    ids = tok.encode(prompt)
    s = llm.session()
    logits = s.feed(ids, want="last")
    out = []
    for _ in range(n):
        nxt = int(np.argmax(logits))
        if tok.is_eos(nxt):
            break
        out.append(nxt)
        logits = s.feed([nxt], want="last")
    return out, tok.decode(out, skip_special_tokens=True)


def test_greedy_generation_is_deterministic():
    from cortiq.runtime.llm import LLM
    with LLM() as a, LLM() as b:
        first = _greedy(a, PROMPT, N_NEW)
        assert first[0], "the demo model produced nothing"
        assert _greedy(a, PROMPT, N_NEW) == first
        assert _greedy(b, PROMPT, N_NEW) == first
        # the library's own greedy generation (no repetition penalty) gives the same text
        greedy = dict(max_tokens=N_NEW, temperature=0, repetition_penalty=1.0)
        text = a.generate(PROMPT, **greedy)
        assert text == a.generate(PROMPT, **greedy) == b.generate(PROMPT, **greedy)
        assert text == first[1]


def test_cortiq_run_uses_the_demo_model(capsys):
    from cortiq.serve.cli import main
    assert main(["run", "--prompt", "What does `sorted` do?", "-n", "24", "--greedy"]) == 0
    out = capsys.readouterr().out.strip()
    assert out and any(w.isalpha() for w in out.split()), out


def test_greedy_generation_produces_training_words():
    td = _train_demo()
    with gzip.open(TRAIN_WORDS, "rt") as f:
        vocab = set(f.read().split())
    from cortiq.runtime.llm import LLM
    with LLM() as llm:
        texts = [_greedy(llm, p, N_NEW)[1] for p in
                 (PROMPT, "The default value is", "This module provides")]
    ws = [w for t in texts for w in td.words(t)]
    assert len(ws) >= 15, texts
    frac = sum(w in vocab for w in ws) / len(ws)
    assert frac >= WORD_FRAC, (frac, texts)


def test_word_check_can_fail():
    """The vocabulary check rejects noise (so the test above can fail)."""
    td = _train_demo()
    with gzip.open(TRAIN_WORDS, "rt") as f:
        vocab = set(f.read().split())
    rng = np.random.default_rng(0)
    noise = " ".join("".join(chr(97 + c) for c in rng.integers(0, 26, 7)) for _ in range(50))
    ws = td.words(noise)
    assert sum(w in vocab for w in ws) / len(ws) < 0.2
    assert math.isclose(sum(w in vocab for w in td.words("return the value of the list")) / 6,
                        1.0)


def test_cli_info_and_verify_default_to_the_demo_model(capsys):
    from cortiq.serve.cli import main
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "demo.cmf" in out and "dory" in out
    assert main(["verify"]) == 0
    assert capsys.readouterr().out.startswith("ok:")
