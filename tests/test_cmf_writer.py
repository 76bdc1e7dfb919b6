"""cortiq.cmf.write / Writer: hypothesis round trips (values back exactly for
f32/f16/bf16, within one quantization step otherwise), §8 dtype rules, strict header
types, features, alignment, determinism, bounded-memory streaming, atomic replacement,
progress bar, skills overlay, masks, tokenizer/chat bundle, shards, and the CLI."""
import gc
import json
import os
import struct
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortiq
import cortiq.cmf as C
import optional
from cortiq.cmf import quant as Q
from cortiq.cmf.testing import tiny_arch, tiny_tensors
from cortiq.errors import ConfigError, FormatError

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cortiq.__file__)))

# One quantization step per layout, relative to the absmax of the row/group/tile the
# value lives in (the code grid spacing; rounding error is at most half of it, and the
# f16 rounding of scales adds < 0.1%). Checked against the row absmax as a bound.
STEP = {"q8_row": 1 / 127, "q8_2f": 1 / 127, "q4_block": 1 / 7, "q4_tiled": 1 / 7,
        "q4tp": 1 / 7 * 1.1, "q2tp": 1 / 1.5 * 1.1, "vbit": 1 / 3, "vbit_ro": 1 / 3}
EXACT = ("f32", "f16", "bf16")


def bf16_round(a):
    return Q.dequantize(Q.quantize(a, "bf16"), "bf16", a.shape)


def expected_exact(a, dt):
    return {"f32": a, "f16": Q.f16_round(a), "bf16": bf16_round(a)}[dt]


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24)


@st.composite
def tensor_cases(draw):
    kind = draw(st.sampled_from(["1d", "2d", "3d"]))
    if kind == "1d":
        shape = (draw(st.integers(1, 300)),)
    elif kind == "2d":
        m = draw(st.integers(0, 4))
        shape = (draw(st.integers(1, 300)),
                 draw(st.sampled_from([32 * m + d for d in (-1, 0, 1) if 32 * m + d > 0])))
    else:
        shape = (draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 40)))
    dtypes = list(EXACT) + ["q4_block"]
    if len(shape) == 2:
        dtypes += ["q8_row", "q8_2f", "q4_tiled"]
        if shape[1] % 32 == 0:
            dtypes += ["q4tp", "q2tp", "vbit", "vbit_ro"]
    dt = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([1e-3, 1.0, 100.0]))
    a = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    return a, dt


@settings(max_examples=40, deadline=None)
@given(cases=st.lists(tensor_cases(), min_size=1, max_size=5),
       tensor_names=st.lists(names, min_size=5, max_size=5, unique=True))
def test_round_trip(cases, tensor_names):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "rt.cmf")
        items = [(n, a) for n, (a, _) in zip(tensor_names, cases)]
        dtypes = {n: dt for n, (_, dt) in zip(tensor_names, cases)}
        C.write(p, items, arch=tiny_arch(), quant="q8_row", dtypes=dtypes, progress=False)
        with C.open(p) as cf:
            assert cf.verify() == []
            assert cf.names() == [n for n, _ in items]
            for (name, a), (_, dt) in zip(items, cases):
                info = cf.tensors[name]
                assert info.dtype == dt and info.shape == a.shape
                got = cf.tensor(name)
                assert got.shape == a.shape and got.dtype == np.float32
                if dt in EXACT:
                    np.testing.assert_array_equal(got, expected_exact(a, dt))
                else:
                    if dt in ("q4_block", "q4_tiled"):  # groups of 32 over the flat tensor
                        flat = np.zeros(-(-a.size // 32) * 32, np.float32)
                        flat[:a.size] = a.ravel()
                        rows = flat.reshape(-1, 32)
                        got = np.concatenate([got.ravel(), flat[a.size:]])
                    else:
                        rows = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
                    amax = np.abs(rows).max(axis=1, keepdims=True)
                    err = np.abs(got.reshape(rows.shape) - rows)
                    bound = amax * STEP[dt] * 0.5 * 1.01 + 2**-14 * 8
                    if dt == "q8_2f":  # the column factor can stretch a row's grid
                        bound = np.abs(rows).max() * STEP[dt] * 4 + 2**-14 * 8
                    assert (err <= bound).all(), (dt, a.shape, float((err - bound).max()))


def test_dtype_rules_of_section_8():
    cd = C.choose_dtype
    assert cd("model.norm.weight", (64,), "q4_tiled") == "f16"
    assert cd("x", (4, 7), "q8_row") == "f16"  # < 32 elements
    assert cd("x", (4, 8), "q8_row") == "q8_row"
    assert cd("model.layers.3.mlp.gate.weight", (8, 64), "q4_tiled") == "f16"
    assert cd("model.layers.3.mlp.shared_expert_gate.weight", (1, 64), "q8_row") == "f16"
    assert cd("model.layers.0.linear_attn.in_proj_a.weight", (8, 64), "q8_row") == "f16"
    assert cd("model.layers.0.linear_attn.conv1d.weight", (64, 1, 4), "q8_row") == "f16"
    assert cd("model.layers.0.self_attn.g_proj.weight", (64, 64), "q8_row") == "f16"
    assert cd("model.layers.0.mlp.gate_proj.weight", (64, 64), "q8_row") == "q8_row"
    assert cd("model.layers.2.mlp.tid2eid", (128, 6), "q4tp") == "f32"
    assert cd("model.layers.2.mlp.tid2eid", (128, 6), "f16") == "f32"
    assert cd("w", (64, 48), "q4_tiled") == "q8_2f"
    assert cd("w", (64, 48), "q4tp") == "q8_2f"
    assert cd("w", (64, 64), "q4tp") == "q4tp"
    assert cd("w", (4, 4, 64), "q8_row") == "f16"
    assert cd("w", (4, 4, 64), "q4_block") == "q4_block"
    assert cd("model.norm.weight", (64,), "f32") == "f32"
    assert cd("w", (64, 64), "bf16") == "bf16"


def test_writer_applies_rules_and_keeps_tid2eid_exact(tmp_path):
    ids = np.random.default_rng(0).integers(0, 256, (50, 6)).astype(np.float32) + 2048
    t = {"model.layers.0.mlp.tid2eid": ids, "model.layers.0.mlp.gate.weight":
         np.ones((8, 64), np.float32), "w": np.ones((64, 48), np.float32),
         "cfg": np.frombuffer(b'{"a": 1}', np.uint8)}
    C.write(tmp_path / "r.cmf", t, arch=tiny_arch(), quant="q4_tiled", progress=False)
    with C.open(tmp_path / "r.cmf") as cf:
        assert {n: i.dtype for n, i in cf.tensors.items()} == {
            "model.layers.0.mlp.tid2eid": "f32", "model.layers.0.mlp.gate.weight": "f16",
            "w": "q8_2f", "cfg": "u8"}
        np.testing.assert_array_equal(cf.tensor("model.layers.0.mlp.tid2eid"), ids)
        assert cf.tensor("cfg").tobytes() == b'{"a": 1}'
        assert cf.features & 0x04  # q8_2f present -> QUANT_2F
        assert cf.quant_type == "Q4_BLOCK"


def envelope(p):
    return struct.unpack("<4sIII14Q", open(p, "rb").read(128))


def test_layout_alignment_hashes_and_features(tmp_path):
    t = tiny_tensors()
    t["big"] = np.ones((256, 128), np.float32)  # q8_row payload >= 16 KiB
    p = tmp_path / "l.cmf"
    C.write(p, t, arch=tiny_arch(), quant="q8_row", progress=False)
    e = envelope(p)
    assert e[0] == b"CMF\x01" and e[1] == 2 and e[2] == 0 and e[3] == 0x01
    hoff, hlen, doff, dlen, data_off, data_len = e[4:10]
    assert hoff == 128 and doff == 128 + hlen and data_off % 4096 == 0
    assert data_off == -(-(doff + dlen) // 4096) * 4096
    raw = p.read_bytes()
    assert e[16] == C.hash64(raw[hoff:hoff + hlen]) != 0
    assert e[17] == C.hash64(raw[doff:doff + dlen]) != 0
    assert raw[doff + dlen:data_off] == b"\0" * (data_off - doff - dlen)
    with C.open(p) as cf:
        for i in cf.tensors.values():
            rel = i.offset - data_off
            assert rel % (4096 if i.nbytes >= 16384 else 64) == 0
        assert cf.tensors["big"].nbytes >= 16384
        assert cf.header["version"] == 2 and cf.quant_type == "Q8_ROW"
    # absent sections: off = len = 0
    assert e[10:16] == (0, 0, 0, 0, 0, 0)
    assert len(raw) == data_off + data_len


def test_deterministic_output(tmp_path):
    kw = dict(arch=tiny_arch(), quant="q4_tiled", tokenizer_json=b'{"t": 1}',
              tokenizer_config={"chat_template": "{{ x }}", "eos_token_ids": [1]},
              skills=[{"id": "math"}], provenance={"src": "test"}, progress=False)
    C.write(tmp_path / "a.cmf", tiny_tensors(), **kw)
    C.write(tmp_path / "b.cmf", tiny_tensors(), **kw)
    assert (tmp_path / "a.cmf").read_bytes() == (tmp_path / "b.cmf").read_bytes()


@pytest.mark.parametrize("bad,msg", [
    ({"hidden_size": 64.0}, "arch.hidden_size: expected an integer"),
    ({"hidden_size": None}, "arch.hidden_size: null"),
    ({"layer_types": ["Full"]}, "expected one of"),
    ({"norm_style": "llama"}, "expected one of"),
    ({"rms_norm_eps": float("nan")}, "cannot be stored"),
])
def test_writer_header_is_strict(tmp_path, bad, msg):
    with pytest.raises(ConfigError, match=msg):
        C.write(tmp_path / "x.cmf", {}, arch=tiny_arch(**bad), progress=False)
    assert not os.listdir(tmp_path)


def test_writer_refuses_missing_arch_keys_and_bad_quant(tmp_path):
    a = tiny_arch()
    del a["vocab_size"]
    with pytest.raises(ConfigError, match="arch.vocab_size: missing"):
        C.Writer(tmp_path / "x.cmf", arch=a, progress=False)
    with pytest.raises(ConfigError, match="quant 'q3'"):
        C.Writer(tmp_path / "x.cmf", arch=tiny_arch(), quant="q3", progress=False)
    with pytest.raises(ConfigError, match="tokenizer_config.eos_token_ids"):
        C.Writer(tmp_path / "x.cmf", arch=tiny_arch(), progress=False,
                 tokenizer_config={"eos_token_ids": [1.5]})
    assert not os.listdir(tmp_path)


def test_numpy_scalars_stay_integers(tmp_path):
    a = tiny_arch(hidden_size=np.int64(64), rms_norm_eps=np.float32(1e-5),
                  layer_types=("FullAttention", "FullAttention"))
    C.write(tmp_path / "n.cmf", {}, arch=a, progress=False)
    with C.open(tmp_path / "n.cmf") as cf:
        assert cf.arch["hidden_size"] == 64 and type(cf.arch["hidden_size"]) is int
        raw = (tmp_path / "n.cmf").read_bytes()
        assert b'"hidden_size":64,' in raw


def test_add_validation(tmp_path):
    with C.Writer(tmp_path / "v.cmf", arch=tiny_arch(), progress=False) as w:
        w.add("a", np.ones(4, np.float32))
        with pytest.raises(ValueError, match="duplicate tensor name 'a'"):
            w.add("a", np.ones(4, np.float32))
    assert not (tmp_path / "v.cmf").exists()  # the failed add aborted the writer
    with C.Writer(tmp_path / "v.cmf", arch=tiny_arch(), progress=False) as w:
        for bad, msg in [("", "non-empty"), ("x" * 70000, "max 65535")]:
            with pytest.raises(ValueError, match=msg):
                w2 = C.Writer(tmp_path / "w.cmf", arch=tiny_arch(), progress=False)
                w2.add(bad, np.ones(3, np.float32))
        with pytest.raises(ValueError, match="NaN"):
            w.add("nan", np.full((4, 64), np.nan, np.float32))
    assert not (tmp_path / "v.cmf").exists()
    assert not [f for f in os.listdir(tmp_path) if "tmp" in f]


def test_streaming_holds_one_tensor_at_a_time(tmp_path):
    alive = []

    def make(i):
        def f():
            gc.collect()
            assert all(r() is None for r in alive), "an earlier tensor is still referenced"
            a = np.full((64, 64), float(i), np.float32)
            alive.append(weakref.ref(a))
            return a
        return f

    def gen():
        for i in range(6):
            yield f"t{i}", make(i)

    C.write(tmp_path / "s.cmf", gen(), arch=tiny_arch(), quant="q8_row", progress=False)
    with C.open(tmp_path / "s.cmf") as cf:
        assert abs(cf.tensor("t5")[0, 0] - 5) < 0.01 and len(cf) == 6


def test_interrupted_write_keeps_previous_file(tmp_path):
    p = tmp_path / "m.cmf"
    C.write(p, tiny_tensors(), arch=tiny_arch(), progress=False)
    before = p.read_bytes()

    def boom():
        raise KeyboardInterrupt

    def tensors():
        yield "a", np.ones((64, 64), np.float32)
        # mid-write: only temporaries exist, and none of them looks like a CMF file
        tmps = [f for f in os.listdir(tmp_path) if f != "m.cmf"]
        assert tmps and all((tmp_path / f).read_bytes()[:4] != b"CMF\x01" for f in tmps)
        yield "b", boom

    with pytest.raises(KeyboardInterrupt):
        C.write(p, tensors(), arch=tiny_arch(), progress=False)
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.cmf"]


def test_failure_at_rename_leaves_nothing(tmp_path, monkeypatch):
    p = tmp_path / "m.cmf"

    def bad_replace(a, b):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", bad_replace)
    with pytest.raises(OSError, match="disk on fire"):
        C.write(p, tiny_tensors(), arch=tiny_arch(), progress=False)
    assert os.listdir(tmp_path) == []


def test_progress_bar_optional(tmp_path, capsys, monkeypatch):
    C.write(tmp_path / "q.cmf", tiny_tensors(), arch=tiny_arch(), progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    C.write(tmp_path / "q2.cmf", tiny_tensors(), arch=tiny_arch(), progress=True)
    assert capsys.readouterr().err == ""  # no tqdm: no bar, no error
    monkeypatch.undo()
    optional.need("extras", "tqdm")
    C.write(tmp_path / "q3.cmf", tiny_tensors(), arch=tiny_arch(), progress=True)
    assert "tensor" in capsys.readouterr().err


def test_tokenizer_and_chat_bundle(tmp_path):
    tok = json.dumps({"model": {"type": "BPE", "vocab": {"ä": 0}}}, ensure_ascii=False).encode()
    tc = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
          "eos_token_ids": [2, 7], "bos_token_id": None, "pad_token_id": 0}
    C.write(tmp_path / "t.cmf", {}, arch=tiny_arch(), tokenizer_json=tok, tokenizer_config=tc,
            progress=False)
    with C.open(tmp_path / "t.cmf") as cf:
        assert cf.tokenizer_json() == tok and cf.tokenizer_config == tc
        assert cf.header["section_hashes"] == {"vocab": f"{C.hash64(tok):016x}"}
        assert cf.verify() == [] and len(cf) == 0


def test_skill_overlay(tmp_path):
    t = tiny_tensors()
    name = "model.layers.0.mlp.up_proj.weight"
    t[f"skill.math.{name}"] = t[name] * 2
    C.write(tmp_path / "s.cmf", t, arch=tiny_arch(), quant="f32",
            skills=[{"id": "math", "name": "Math", "layers": [0]}], progress=False)
    with C.open(tmp_path / "s.cmf") as cf:
        assert cf.skills == [{"id": "math", "name": "Math", "layers": [0]}]
        assert cf.resolve(name, "math") == f"skill.math.{name}"
        assert cf.resolve("lm_head.weight", "math") == "lm_head.weight"
        np.testing.assert_array_equal(cf.tensor(name, skill="math"), t[name] * 2)
        np.testing.assert_array_equal(cf.tensor(name), t[name])
        np.testing.assert_array_equal(cf.tensor("lm_head.weight", skill="math"),
                                      t["lm_head.weight"])
        assert cf.skill_tensors("math") == [name]
        with pytest.raises(C.MissingTensor, match="unknown skill 'poetry'"):
            cf.tensor(name, skill="poetry")
        assert not cf.features & 0x40
    C.write(tmp_path / "sf.cmf", {name: t[name]}, arch=tiny_arch(), progress=False,
            skills=[{"id": "math", "base_dir_hash": "00ff00ff00ff00ff"}])
    with C.open(tmp_path / "sf.cmf") as cf:
        assert cf.features & 0x40  # SKILL_FILE


def _masks(arch, rows=None):
    L, inter, heads = arch["num_layers"], arch["intermediate_size"], arch["num_attention_heads"]
    rng = np.random.default_rng(1)
    rows = rows or L
    e = arch.get("moe", {}).get("num_experts") if arch.get("moe") else None
    tasks = [C.MaskTask(name=n, ffn=rng.random((rows, inter)) < 0.5,
                        heads=rng.random((L, heads)) < 0.5, layers=np.array([True] * L),
                        experts=(rng.random((L, e)) < 0.5) if e else None, task_id=i,
                        sparsity=0.5, priority="Primary" if i == 0 else "Normal",
                        description="d", quality={"metric": "ppl", "value": 3.5})
             for i, n in enumerate(["chat", "code"])]
    return C.Masks("chat", tasks)


@pytest.mark.parametrize("loops,per_visit,moe", [(1, False, False), (2, True, False),
                                                 (2, False, True)])
def test_masks_round_trip(tmp_path, loops, per_visit, moe):
    arch = tiny_arch(num_loops=loops, intermediate_size=13, num_attention_heads=5)
    if moe:
        arch["moe"] = {"num_experts": 9, "top_k": 2, "moe_intermediate_size": 16}
    m = _masks(arch, rows=arch["num_layers"] * loops if per_visit else None)
    C.write(tmp_path / "m.cmf", {}, arch=arch, masks=m, progress=False)
    with C.open(tmp_path / "m.cmf") as cf:
        assert cf.features & 0x02 and bool(cf.features & 0x20) == (loops > 1)
        assert "masks" in cf.header["section_hashes"] and cf.verify() == []
        got = cf.masks
        assert got.default_task == "chat" and got.names() == ["chat", "code"]
        for a, b in zip(m.tasks, got.tasks):
            np.testing.assert_array_equal(a.ffn, b.ffn)
            np.testing.assert_array_equal(a.heads, b.heads)
            np.testing.assert_array_equal(a.layers, b.layers)
            if moe:
                np.testing.assert_array_equal(a.experts, b.experts)
            assert (b.priority, b.quality, b.per_visit) == (a.priority, a.quality, per_visit)
        off, ln = cf.sections()["masks"]
        blob = (tmp_path / "m.cmf").read_bytes()[off:off + ln]
        meta_len = struct.unpack_from("<I", blob, 4)[0]
        for r in json.loads(blob[8:8 + meta_len])["masks"]:
            assert r["blob_off"] % 8 == 0


def test_mask_bit_examples():
    arch = tiny_arch(num_layers=1, num_attention_heads=4, intermediate_size=10)
    t = C.MaskTask(name="x", ffn=np.ones((1, 10), bool), heads=np.array([[1, 0, 1, 1]], bool),
                   layers=np.array([True]))
    sec = C.Masks("x", [t]).encode(arch)
    meta_len = struct.unpack_from("<I", sec, 4)[0]
    rec = json.loads(sec[8:8 + meta_len])["masks"][0]
    blob = sec[rec["blob_off"]:rec["blob_off"] + rec["blob_len"]]
    assert blob == bytes([0xFF, 0x03, 0x0D, 0x01])


def test_shards_write_and_open_from_any(tmp_path):
    t = tiny_tensors()
    base = tmp_path / "model.cmf"
    tok = b'{"tok": true}'
    w = C.Writer(base, arch=tiny_arch(), quant="q8_row", tokenizer_json=tok,
                 tokenizer_config={"eos_token_ids": [3]}, skills=[{"id": "s"}],
                 max_shard_bytes=12000, progress=False)
    with w:
        for n, a in t.items():
            w.add(n, a)
    files = sorted(os.listdir(tmp_path))
    n = len(files)
    assert n >= 3 and files == [f"model-{k:05d}-of-{n:05d}.cmf" for k in range(1, n + 1)]
    assert [os.path.basename(p) for p in w.paths] == files
    ref = None
    for f in files:
        with C.open(tmp_path / f) as cf:
            assert cf.files == [str(tmp_path / g) for g in files]
            assert cf.shard == {"no": 1, "count": n} and cf.tokenizer_json() == tok
            assert cf.skills == [{"id": "s"}] and cf.tokenizer_config["eos_token_ids"] == [3]
            assert cf.names() == list(t) and cf.verify() == []
            vals = {k: cf.tensor(k) for k in cf.names()}
            if ref is None:
                ref = vals
            for k in t:
                np.testing.assert_array_equal(vals[k], ref[k])
    for k, f in enumerate(files[1:], start=2):  # only shard 1 carries the extras
        with open(tmp_path / f, "rb") as fh:
            e = struct.unpack("<4sIII14Q", fh.read(128))
        assert e[10:16] == (0, 0, 0, 0, 0, 0)
        hdr = json.loads((tmp_path / f).read_bytes()[e[4]:e[4] + e[5]])
        assert hdr["shard"] == {"no": k, "count": n}
        assert "tokenizer_config" not in hdr and not hdr.get("skills")
    # a missing sibling is an error naming it
    os.remove(tmp_path / files[-1])
    with pytest.raises(C.CmfFileNotFound, match=f"shard {n} of {n} is missing"):
        C.open(tmp_path / files[0])
    # a renamed shard whose header disagrees with its name
    os.rename(tmp_path / files[1], tmp_path / files[-1])
    with pytest.raises(FormatError, match="file name says shard"):
        C.open(tmp_path / files[-1])


def test_shard_siblings_must_agree(tmp_path):
    C.write(tmp_path / "a.cmf", tiny_tensors(), arch=tiny_arch(), max_shard_bytes=20000,
            progress=False)
    files = sorted(os.listdir(tmp_path))
    assert len(files) >= 2
    # replace shard 2 with shard 1 of the same set: coordinates disagree
    import shutil
    shutil.copy(tmp_path / files[0], tmp_path / files[1])
    with pytest.raises(FormatError):
        C.open(tmp_path / files[0])


def test_cli_info_and_verify(tmp_path):
    arch = tiny_arch(moe={"num_experts": 4, "top_k": 2, "moe_intermediate_size": 32})
    p = tmp_path / "c.cmf"
    C.write(p, tiny_tensors(), arch=arch, tokenizer_json=b"{}", masks=_masks(arch),
            tokenizer_config={"chat_template": "x", "eos_token_ids": [1]},
            skills=[{"id": "math"}], progress=False)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "cortiq", *map(str, args)],
                              capture_output=True, text=True, timeout=120, cwd=PKG_PARENT,
                              check=False)

    r = run("info", p)
    assert r.returncode == 0, r.stderr
    for word in ("arch:", "dory", "q8_row", "f16", "tokenizer.json", "eos [1]", "math",
                 "chat, code", "4 experts"):
        assert word in r.stdout, word
    r = run("verify", p)
    assert r.returncode == 0 and r.stdout.startswith("ok")
    b = bytearray(p.read_bytes())
    with C.open(p) as cf:
        b[cf.tensors["lm_head.weight"].offset + 3] ^= 1
    bad = tmp_path / "bad.cmf"
    bad.write_bytes(bytes(b))
    r = run("verify", bad)
    assert r.returncode == 1 and r.stdout.count("\n") == 1 and "lm_head.weight" in r.stdout
    for target, msg in [(tmp_path / "missing.cmf", "no such file"),
                        (tmp_path, "not a Hugging Face checkpoint directory")]:
        r = run("info", target)
        assert r.returncode == 1 and msg in r.stderr
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    junk = tmp_path / "junk.cmf"
    junk.write_bytes(b"CMF\x01" + b"\x02\0\0\0" + b"\0" * 200)
    for cmd in ("info", "verify"):
        r = run(cmd, junk)
        assert r.returncode == 1 and "junk.cmf" in r.stderr and "Traceback" not in r.stderr


def upstream_python_reader(path):
    """An emulation of upstream's python/cmf_reader.py checks (§3, §15): magic, version,
    the 0b111 feature whitelist, header hash always compared, dtype ids it can name
    (<= 12) and decode, q4_tiled needing n % 32 == 0; hashes with the numpy reference."""
    raw = Path(path).read_bytes()
    e = struct.unpack("<4sIII14Q", raw[:128])
    assert e[0] == b"CMF\x01" and e[1] == 2 and e[3] & ~0b111 == 0
    hoff, hlen, doff, dlen, data_off = e[4:9]
    header = json.loads(raw[hoff:hoff + hlen])
    assert C.hash64_numpy(raw[hoff:hoff + hlen]) == e[16]
    assert e[17] == 0 or C.hash64_numpy(raw[doff:doff + dlen]) == e[17]
    count, pool_off = struct.unpack_from("<QQ", raw, doff)
    out = {}
    for i in range(count):
        r = struct.unpack_from("<IHBB6IQQQ", raw, doff + 16 + 56 * i)
        name = raw[doff + pool_off + r[0]:doff + pool_off + r[0] + r[1]].decode()
        did, shape = r[2], tuple(r[4:4 + r[3]])
        payload = raw[data_off + r[10]:data_off + r[10] + r[11]]
        assert did <= 12 and C.hash64_numpy(payload) == r[12]
        if Q.DTYPE_NAMES[did] == "q4_tiled":
            assert Q.numel(shape) % 32 == 0
        out[name] = Q.dequantize(np.frombuffer(payload, np.uint8), Q.DTYPE_NAMES[did], shape)
    return header, out


@pytest.mark.parametrize("quant", ["q8_row", "q8_2f", "q4_block", "q4_tiled", "f16", "f32"])
def test_our_files_pass_the_upstream_python_reader_checks(tmp_path, quant):
    t = tiny_tensors()
    t["odd"] = np.ones((40, 48), np.float32)  # cols % 32 != 0 -> q8_2f fallback for q4_tiled
    p = tmp_path / "u.cmf"
    C.write(p, t, arch=tiny_arch(), quant=quant, tokenizer_json=b"{}", progress=False)
    header, vals = upstream_python_reader(p)
    assert header["quant_type"] in ("Q8_ROW", "Q8_2F", "Q4_BLOCK", "F16", "F32")
    with C.open(p) as cf:
        for name in t:
            np.testing.assert_array_equal(vals[name], cf.tensor(name))
