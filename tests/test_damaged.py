"""Damaged model files are refused, never run: the hash checks of `cmf.open(verify=...)`
and `LLM(verify=...)`, the non-finite-logits guard, and what the CLI and the server
say about both (one line / a 500 in OpenAI's shape, never a traceback).

The damage is done to copies of the bundled demo model (a real Dory file) the way a
flipped disk block or a bad download would: bytes overwritten inside one tensor or
section, every hash left as the writer stored it.
"""
import json
import shutil
import struct
import threading

import numpy as np
import pytest

import cortiq
import cortiq.cmf as C
import optional
from cortiq.serve.cli import main
from cortiq.demo import demo_path

SQK = "model.layers.0.mixer.sqk"
HEAD = "lm_head.weight"
UP = "model.layers.3.mixer.up_proj.weight"


def _damaged(tmp_path, name, kind):
    """A copy of the demo model with `kind` damage inside tensor `name` (or the vocab
    section when name is None)."""
    src = demo_path()
    out = tmp_path / f"{kind}-{name or 'vocab'}.cmf".replace("/", "_")
    shutil.copy(src, out)
    with C.open(src, verify="off") as cf:
        if name is None:
            off, n = cf.sections()["vocab"]
        else:
            off, n = cf.tensors[name].offset, cf.tensors[name].nbytes
    with open(out, "r+b") as f:
        if kind == "ff":
            f.seek(off)
            f.write(b"\xff" * min(1024, n))
        elif kind == "random":
            f.seek(off + min(5000, n // 4))
            f.write(np.random.default_rng(7).bytes(min(4096, n // 2)))
        elif kind == "zero":
            f.seek(off)
            f.write(bytes(n))
    return str(out)


def _rehash(path, name):
    """Make the damage of tensor `name` consistent: store its new payload hash and the
    new directory hash, as a writer of a broken (not damaged) model would."""
    with C.open(path, verify="off") as cf:
        doff = cf.sections()["dir"][0]
        payload = bytes(cf.raw(name))
        d = bytearray(cf._part().dir_bytes.tobytes())
        record = cf.names().index(name)          # directory order = record order
    struct.pack_into("<Q", d, 16 + 56 * record + 48, C.hash64(payload))   # its hash field
    with open(path, "r+b") as f:
        f.seek(doff)
        f.write(d)
        f.seek(0x78)
        f.write(struct.pack("<Q", C.hash64(bytes(d))))
    return path


CASES = [(SQK, "ff"), (HEAD, "ff"), (UP, "random"), (None, "zero")]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    d = tmp_path_factory.mktemp("damaged")
    return {(n, k): _damaged(d, n, k) for n, k in CASES}


# ---------------------------------------------------------------- refused on load

@pytest.mark.parametrize("name,kind", CASES)
def test_llm_refuses_a_damaged_file(damaged, name, kind):
    with pytest.raises(C.HashMismatch) as e:
        cortiq.LLM(damaged[name, kind])
    msg = str(e.value)
    assert (f"tensor {name!r}" if name else "vocab section") in msg
    assert "hash mismatch" in msg and "damaged" in msg and "\n" not in msg


@pytest.mark.parametrize("name,kind", CASES)
def test_verify_full_refuses_on_open(damaged, name, kind):
    with pytest.raises(C.HashMismatch, match=repr(name) if name else "vocab section"):
        C.open(damaged[name, kind], verify="full")


@pytest.mark.parametrize("name,kind", CASES)
def test_cli_run_is_one_line(damaged, name, kind, capsys):
    assert main(["run", damaged[name, kind], "-p", "hi", "-n", "4"]) == 1
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert cap.out == ""
    assert len(lines) == 1 and lines[0].startswith("cortiq: error:")
    assert "hash mismatch" in lines[0] and "Traceback" not in cap.err


def test_cli_serve_refuses_before_listening(damaged, capsys):
    assert main(["serve", damaged[SQK, "ff"], "--port", "1"]) == 1   # never binds port 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and repr(SQK) in lines[0]


def test_cli_verify_still_lists_every_problem(damaged, tmp_path, capsys):
    assert main(["verify", damaged[UP, "random"]]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and repr(UP) in out[0]
    # a damaged directory too (it is refused on open by the other modes)
    p = tmp_path / "dir.cmf"
    shutil.copy(demo_path(), p)
    with open(p, "r+b") as f:
        f.seek(0x78)
        f.write(struct.pack("<Q", 12345))
    with pytest.raises(C.HashMismatch, match="directory hash mismatch"):
        C.open(p)
    assert main(["verify", str(p)]) == 1
    assert "directory hash mismatch" in capsys.readouterr().out


def test_cli_info_describes_a_damaged_tokenizer(damaged, capsys):
    assert main(["info", damaged[None, "zero"]]) == 0
    assert "tokenizer:   tokenizer.json" in capsys.readouterr().out


# ---------------------------------------------------------------- lazy, full, off

def test_lazy_hashes_each_tensor_once_on_first_use(monkeypatch):
    import cortiq.cmf.reader as R
    seen = []
    real = R.hash64

    def counting(b):
        seen.append(len(b))
        return real(b)
    monkeypatch.setattr(R, "hash64", counting)
    cf = C.open(demo_path())
    assert seen == [cf.sections()["header"][1], cf.sections()["dir"][1]]   # no tensor
    del seen[:]
    barrier = threading.Barrier(8)

    def use():
        barrier.wait()
        cf.raw(UP)
    ts = [threading.Thread(target=use) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    cf.tensor(UP)
    assert seen == [cf.tensors[UP].nbytes]        # hashed exactly once, by one thread
    del seen[:]
    cf.tokenizer_json()
    cf.tokenizer_json()
    assert seen == [cf.sections()["vocab"][1]]    # the vocab section, once
    cf.close()


def test_verify_modes(damaged):
    p = damaged[UP, "random"]
    with C.open(p) as cf:                          # lazy: only the damaged tensor fails
        cf.raw(SQK)
        with pytest.raises(C.HashMismatch, match=repr(UP)):
            cf.raw(UP)
        with pytest.raises(C.HashMismatch, match=repr(UP)):
            cf.tensor(UP)                          # and keeps failing
    with C.open(p, verify="off") as cf:
        assert cf.raw(UP).size == cf.tensors[UP].nbytes
        assert len(cf.verify()) == 1
    with C.open(demo_path(), verify="full") as cf:
        assert cf.verify() == []
    with pytest.raises(cortiq.ConfigError, match="verify"):
        C.open(demo_path(), verify="yes")
    with pytest.raises(cortiq.ConfigError, match="verify"):
        cortiq.LLM(verify=True)


def test_verify_off_runs_the_damaged_file(damaged):
    with cortiq.LLM(damaged[UP, "random"], verify="off") as llm:
        assert isinstance(llm.generate("hi", max_tokens=3, temperature=0), str)


def test_unreadable_tokenizer_is_refused_even_with_a_matching_hash(tmp_path):
    """An all-zero tokenizer section whose recorded hash matches (a broken writer, or
    no hash to compare) is still refused: only a file with no tokenizer at all falls
    back to bytes."""
    p = _damaged(tmp_path, None, "zero")
    with C.open(p, verify="off") as cf:
        hoff, _hlen = cf.sections()["header"]
        _voff, vlen = cf.sections()["vocab"]
        header = cf._part().header_bytes.tobytes()
        old = cf.header["section_hashes"]["vocab"]
    new = C.hash64(bytes(vlen))
    header = header.replace(old.encode(), f"{new:016x}".encode())
    with open(p, "r+b") as f:
        f.seek(hoff)
        f.write(header)
        f.seek(0x70)
        f.write(struct.pack("<Q", C.hash64(header)))
    assert C.open(p).verify() == []
    with pytest.raises(cortiq.FormatError, match="tokenizer cannot be read"):
        cortiq.LLM(p)


# ---------------------------------------------------------------- non-finite logits

@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    """Hashes consistent, sqk all NaN: a broken model rather than a damaged file."""
    p = _damaged(tmp_path_factory.mktemp("nan"), SQK, "ff")
    return _rehash(p, SQK)


def test_nan_logits_raise_model_error(nan_model):
    assert C.open(nan_model).verify() == []
    with cortiq.LLM(nan_model) as llm:
        with pytest.raises(cortiq.ModelError,
                           match=r"non-finite logits at position \d+ .* run cortiq verify"):
            llm.generate("hi", max_tokens=3)
        with pytest.raises(cortiq.ModelError):
            list(llm.create_chat_completion([{"role": "user", "content": "hi"}],
                                            stream=True))


def test_nan_logits_are_one_cli_line(nan_model, capsys):
    assert main(["run", nan_model, "-p", "hi", "-n", "3"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "non-finite logits at position" in lines[0]


def test_nan_logits_are_a_500_from_the_server(nan_model):
    optional.need("extras", "starlette", "httpx")   # Starlette's test client needs httpx
    from starlette.testclient import TestClient

    from cortiq.serve import create_app
    with cortiq.LLM(nan_model) as llm, TestClient(create_app(llm)) as c:
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 500
        e = r.json()["error"]
        assert e["type"] == "server_error" and "non-finite logits" in e["message"]
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True})
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["type"] == "server_error" and "non-finite logits" in err["message"]


def test_finite_check():
    from cortiq.runtime.generation import check_finite as _check_finite
    _check_finite(np.full(8, 3e38, np.float32), 0)        # large but finite
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros(8, np.float32)
        x[5] = bad
        with pytest.raises(cortiq.ModelError, match="position 7"):
            _check_finite(x, 7)
