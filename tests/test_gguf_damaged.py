"""Damaged GGUF files are refused with a FormatError naming what is wrong (the key or
tensor, and the byte offset), never an IndexError, a numpy error or a crash.

The field offsets are found by walking the file with the layout GGUF's specification
gives (independently of cortiq's parser)."""
from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

gguf = optional.need("extras", "gguf")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cortiq  # noqa: E402
from cortiq.errors import CortiqError, FormatError  # noqa: E402
from cortiq.gguf import open as gguf_open  # noqa: E402
from cortiq.gguf.parser import GGML_TYPES  # noqa: E402

T = gguf.GGMLQuantizationType


def _tiny(path):
    """A two-layer Qwen3-shaped file with a vocabulary: every key kind (strings,
    string arrays, numbers) and every tensor kind the importer knows."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen3")
    H, F, V, hd = 64, 96, 40, 16
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_block_count(1)
    w.add_feed_forward_length(F)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(V)])
    w.add_token_types([1] * V)
    w.add_token_merges(["t 1"])
    w.add_eos_token_id(1)
    mats = {"token_embd.weight": (V, H), "blk.0.attn_q.weight": (4 * hd, H),
            "blk.0.attn_k.weight": (2 * hd, H), "blk.0.attn_v.weight": (2 * hd, H),
            "blk.0.attn_output.weight": (H, 4 * hd), "blk.0.ffn_gate.weight": (F, H),
            "blk.0.ffn_up.weight": (F, H), "blk.0.ffn_down.weight": (H, F)}
    for n, shape in mats.items():
        a = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        if "ffn" in n:
            w.add_tensor(n, gguf.quants.quantize(a, T.Q8_0), raw_dtype=T.Q8_0)
        else:
            w.add_tensor(n, a.astype(np.float16))
    for n in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(n, np.ones(H, np.float32))
    for n in ("blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"):
        w.add_tensor(n, np.ones(hd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _walk(data: bytes) -> dict:
    """Byte offsets of the fields: header counts, each key (its name length, value
    type, value), each tensor entry (name length, n_dims, dims, type, offset)."""
    def u32(p):
        return struct.unpack_from("<I", data, p)[0]

    def u64(p):
        return struct.unpack_from("<Q", data, p)[0]
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(vt, p):
        if vt in sizes:
            return p + sizes[vt]
        if vt == 8:
            return p + 8 + u64(p)
        et, n = u32(p), u64(p + 4)
        p += 12
        for _ in range(n):
            p = skip(et, p)
        return p
    n_t, n_k = u64(8), u64(16)
    p, keys = 24, {}
    for _ in range(n_k):
        name = data[p + 8:p + 8 + u64(p)].decode()
        vt_at = p + 8 + u64(p)
        keys[name] = {"at": p, "type_at": vt_at, "value_at": vt_at + 4, "type": u32(vt_at)}
        p = skip(u32(vt_at), vt_at + 4)
    tensors = {}
    for _ in range(n_t):
        name = data[p + 8:p + 8 + u64(p)].decode()
        q = p + 8 + u64(p)
        nd = u32(q)
        tensors[name] = {"at": p, "ndims_at": q, "dims_at": q + 4, "type_at": q + 4 + 8 * nd,
                         "offset_at": q + 8 + 8 * nd}
        p = q + 16 + 8 * nd
    return {"keys": keys, "tensors": tensors, "dir_end": p}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = _tiny(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    data = path.read_bytes()
    with gguf_open(path) as gf:       # the intact file opens and decodes
        for n in gf.tensors:
            assert np.isfinite(gf.tensor(n)).all()
        last = max(t.offset + t.nbytes for t in gf.layout.tensors.values())
    return data, _walk(data), last


def _open_damaged(tmp_path, data: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    with gguf_open(p) as gf:
        gf.tokenizer_json()
        for n in gf.tensors:
            gf.tensor(n)


def _patch(data: bytes, at: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, value)
    return bytes(b)


def test_truncated_anywhere(tiny, tmp_path):
    data, _, last = tiny
    cuts = sorted(set(list(range(64)) + list(np.linspace(64, last - 1, 150).astype(int))))
    for cut in cuts:
        with pytest.raises(FormatError, match=r"bad\.gguf") as e:
            _open_damaged(tmp_path, data[:cut])
        msg = str(e.value)
        assert ("offset" in msg or "empty file" in msg), (cut, msg)


def _cases(walk, size):
    k, t = walk["keys"], walk["tensors"]
    q, tok = t["blk.0.attn_q.weight"], k["tokenizer.ggml.tokens"]
    emb = k["qwen3.embedding_length"]
    return [
        ("magic", 0, "<4s", b"GGUX", r"bad magic b'GGUX' at offset 0"),
        ("version", 4, "<I", 1, r"version 1 at offset 4"),
        ("big-endian", 4, "<I", 3 << 24, r"big-endian"),
        ("tensor count", 8, "<Q", 2 ** 40, r"tensor count 1099511627776 cannot fit"),
        ("key count", 16, "<Q", 2 ** 40, r"key count 1099511627776 cannot fit"),
        ("key name length", emb["at"], "<Q", 2 ** 62,
         r"metadata key \d+: string length \d+ runs past the end .*offset \d+"),
        ("value type", emb["type_at"], "<I", 99,
         r"metadata qwen3.embedding_length: unknown value type 99 .*offset"),
        ("array element type", tok["value_at"], "<I", 77,
         r"tokenizer.ggml.tokens: unknown array element type 77"),
        ("array length", tok["value_at"] + 4, "<Q", 2 ** 50,
         r"tokenizer.ggml.tokens: array of \d+ strings runs past the end"),
        ("string in array", tok["value_at"] + 12, "<Q", 2 ** 50,
         r"tokenizer.ggml.tokens\[0\]: string length \d+ runs past"),
        ("n_dims", q["ndims_at"], "<I", 9, r"tensor blk.0.attn_q.weight: n_dims 9"),
        ("dim", q["dims_at"], "<Q", 2 ** 40,
         r"tensor blk.0.attn_q.weight .*runs past the end of the file"),
        ("tensor type", q["type_at"], "<I", 200,
         r"tensor blk.0.attn_q.weight: unknown ggml type 200 .*offset"),
        ("tensor type gap", q["type_at"], "<I", 31,
         r"tensor blk.0.attn_q.weight: unknown ggml type 31"),
        ("block type on odd rows", q["type_at"], "<I", 12,
         r"tensor blk.0.attn_q.weight .*Q4_K rows of 64 values are not whole blocks"),
        ("tensor offset alignment", q["offset_at"], "<Q", 3,
         r"tensor blk.0.attn_q.weight .*data offset 3 is not a multiple of the alignment"),
        ("tensor offset past end", q["offset_at"], "<Q", size,
         r"tensor blk.0.attn_q.weight .*runs past the end of the file"),
    ]


@pytest.mark.parametrize("which", range(17))
def test_corrupt_field(tiny, tmp_path, which):
    data, walk, _ = tiny
    _what, at, fmt, value, pattern = _cases(walk, len(data))[which]
    with pytest.raises(FormatError, match=pattern):
        _open_damaged(tmp_path, _patch(data, at, fmt, value))


@pytest.mark.parametrize("key,value,pattern", [
    ("attention.layer_norm_rms_epsilon", float("nan"), "not a finite number >= 0"),
    ("attention.layer_norm_rms_epsilon", -1e-6, "not a finite number >= 0"),
    ("rope.freq_base", 0.0, "not a finite number > 0"),
    ("rope.freq_base", float("inf"), "not a finite number > 0"),
    ("rope.freq_base", "10000", "not a finite number > 0"),
    ("attention.sliding_window", -4, "not a positive integer"),
    ("rope.scaling.factor", -2.0, "not a finite number >= 0"),
])
def test_real_valued_keys_are_checked(key, value, pattern):
    """A metadata value that would only surface later as non-finite logits (a NaN or
    negative epsilon, a zero rotary base, a negative window) is refused by name."""
    from cortiq.gguf.llama_meta import Meta, arch_from_gguf
    base = {"general.architecture": "llama", "llama.embedding_length": 64,
            "llama.block_count": 1, "llama.attention.head_count": 4,
            "llama.feed_forward_length": 96, f"llama.{key}": value}
    with pytest.raises(FormatError, match=rf"llama\.{key}: .*{pattern}"):
        arch_from_gguf(Meta(base), {"token_embd.weight": (40, 64)})
    del base[f"llama.{key}"]
    arch, _ = arch_from_gguf(Meta(base), {"token_embd.weight": (40, 64)})
    assert arch["rms_norm_eps"] == 1e-6 and arch["rope_theta"] == 10000.0


def test_a_negative_epsilon_in_the_file_is_refused_on_open(tiny, tmp_path):
    data, walk, _ = tiny
    at = walk["keys"]["qwen3.attention.layer_norm_rms_epsilon"]["value_at"]
    p = tmp_path / "eps.gguf"
    p.write_bytes(_patch(data, at, "<f", -1.0))
    with pytest.raises(FormatError, match="layer_norm_rms_epsilon: -1.0 is not a finite"):
        cortiq.LLM(p)


def _rename(data, at, new: bytes) -> bytes:
    n = struct.unpack_from("<Q", data, at)[0]
    assert len(new) == n
    return data[:at + 8] + new + data[at + 8 + n:]


def test_duplicates_and_missing_keys(tiny, tmp_path):
    data, walk, _ = tiny
    t = walk["tensors"]
    dup = _rename(data, t["blk.0.attn_k.weight"]["at"], b"blk.0.attn_q.weight")
    with pytest.raises(FormatError, match=r"tensor blk.0.attn_q.weight .*duplicate tensor"):
        _open_damaged(tmp_path, dup)
    k = walk["keys"]
    twice = _rename(data, k["qwen3.context_length"]["at"], b"general.architecture")
    with pytest.raises(FormatError, match=r"metadata key 'general.architecture': appears "
                                          r"twice .*offset"):
        _open_damaged(tmp_path, twice)
    gone = _rename(data, k["qwen3.embedding_length"]["at"], b"qwen3.embedding_lengtX")
    with pytest.raises(FormatError, match=r"metadata qwen3.embedding_length: missing"):
        _open_damaged(tmp_path, gone)
    gone = _rename(data, k["general.architecture"]["at"], b"general.architecturX")
    with pytest.raises(FormatError, match=r"metadata general.architecture: missing"):
        _open_damaged(tmp_path, gone)
    bad_utf8 = _rename(data, t["output_norm.weight"]["at"], b"output_norm.weigh\xff")
    with pytest.raises(FormatError, match=r"string is not UTF-8"):
        _open_damaged(tmp_path, bad_utf8)


def test_neither_format_names_both(tmp_path):
    for content in (b"", b"GG", b"\x00" * 64, b"CMF\x02" + b"\x00" * 200):
        p = tmp_path / "x.bin"
        p.write_bytes(content)
        with pytest.raises(FormatError):
            cortiq.LLM(p)
    p.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with pytest.raises(FormatError, match=r"neither a CMF file .* nor a GGUF file"):
        cortiq.LLM(p)


def test_type_table_matches_ggml():
    """cortiq's ggml type table agrees with the gguf package's (names and sizes)."""
    for t, (elems, size) in gguf.GGML_QUANT_SIZES.items():
        if int(t) in GGML_TYPES:
            g = GGML_TYPES[int(t)]
            assert (g.name, g.block_elems, g.block_bytes) == (t.name, elems, size)
    from cortiq.cmf.ggml_blocks import FORMATS
    for f in FORMATS.values():
        g = GGML_TYPES[f.ggml_type]
        assert (g.name.lower(), g.block_elems, g.block_bytes) == (
            f.name, f.block_elems, f.block_bytes)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_byte_damage_is_refused_or_read(tiny, tmp_path_factory, data):
    """Any byte of the metadata and directory changed: the file opens (the damage hit a
    value that is still valid) or raises a cortiq error, never anything else."""
    raw, walk, _ = tiny
    at = data.draw(st.integers(0, walk["dir_end"] - 1))
    val = data.draw(st.integers(0, 255))
    b = bytearray(raw)
    b[at] = val
    tmp = tmp_path_factory.mktemp("fuzz")
    try:
        _open_damaged(tmp, bytes(b))
    except CortiqError:
        pass
