"""The CMF reader against files composed here, independently of cortiq's writer, straight
from docs/cmf-format.md §1-§13: files in the shape the upstream tools write open with identical
values; everything the Rust reader refuses (§3, §4 serde typing) is refused with the
matching FormatError subclass; malformed input (truncation at every section boundary,
flipped bytes, offsets past EOF, unknown feature bits, absurd counts) never crashes,
hangs or allocates wildly; verify() catches single flipped bytes."""
import builtins
import json
import os
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cortiq.cmf as C
from cortiq.cmf import quant as Q
from cortiq.cmf.hash import hash64, hex16
from cortiq.cmf.masks import parse_sparse_index
from cortiq.cmf.testing import tiny_arch
from cortiq.errors import FormatError
from reference import cmf_spec

ENV = struct.Struct("<4sIII14Q")


# ---- an independent composer (the upstream Python writer's layout) --------------------
def directory(records):
    """records: (name, dtype_id, shape, off, nbytes, hash) -> directory bytes (§5)."""
    head = struct.pack("<QQ", len(records), 16 + 56 * len(records))
    pool = b""
    for name, did, shape, off, nb, h in records:
        nm = name.encode()
        dims = list(shape) + [0] * (6 - len(shape))
        head += struct.pack("<IHBB6IQQQ", len(pool), len(nm), did, len(shape), *dims, off, nb, h)
        pool += nm
    return head + pool


def compose(header, tensors, masks=b"", vocab=b"", index=b"", features=1, align=64,
            hashes=True, version=2, magic=b"CMF\x01"):
    """tensors: [(name, dtype, shape, payload bytes)] -> file bytes, 64-aligned tensors."""
    blob, recs = b"", []
    for name, dtype, shape, payload in tensors:
        off = -(-len(blob) // align) * align
        blob += b"\0" * (off - len(blob)) + payload
        recs.append((name, Q.DTYPES[dtype], shape, off, len(payload), hash64(payload)))
    if isinstance(header, dict):
        header = dict(header)
        sh = {}
        for key, sec in (("masks", masks), ("vocab", vocab), ("index", index)):
            if sec:
                sh[key] = hex16(hash64(sec))
        if sh:
            header["section_hashes"] = sh
        header = json.dumps(header).encode()
    d = directory(recs)
    data_off = -(-(128 + len(header) + len(d)) // 4096) * 4096
    pos, offs = data_off + len(blob), []
    for sec in (masks, vocab, index):
        offs += [pos if sec else 0, len(sec)]
        pos += len(sec)
    env = ENV.pack(magic, version, 0, features, 128, len(header), 128 + len(header), len(d),
                   data_off, len(blob), *offs, hash64(header) if hashes else 0,
                   hash64(d) if hashes else 0)
    pad = b"\0" * (data_off - 128 - len(header) - len(d))
    return env + header + d + pad + blob + masks + vocab + index


def py_writer_header(**over):
    """The header the upstream Python writer emits (explicit nulls, empty skills)."""
    h = {"format": "cmf", "version": 2, "arch": tiny_arch(), "quant_type": "Q8_ROW",
         "provenance": {"tool": "convert_dtgma_to_cmf.py", "source": "hf"},
         "tokenizer_config": None, "skills": [], "shard": None}
    h.update(over)
    return h


RNG = np.random.default_rng(7)
W = RNG.standard_normal((8, 64)).astype(np.float32)
FIRST = ["f32", "f16", "bf16", "q8_row", "q8_2f", "q4_block", "q4_tiled"]
LATER = ["q4tp", "q2tp", "vbit", "vbit_ro"]


def sample_tensors():
    out = [(f"t.{dt}", dt, W.shape, Q.quantize(W, dt).tobytes()) for dt in FIRST + LATER]
    out.append(("model.cfg.config_json", "u8", (5,), b"{\"a\"}"))
    out.append(("model.norm.weight", "f16", (64,), Q.quantize(W[0], "f16").tobytes()))
    return out


def write(tmp_path, data, name="m.cmf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- files in the upstream tools' shapes open with identical values --------------------
@pytest.mark.parametrize("align", [64, 4096])
def test_upstream_shaped_file_opens_with_identical_values(tmp_path, align):
    tensors = sample_tensors()
    tok = json.dumps({"model": {"vocab": {"a": 0}}}).encode()
    p = write(tmp_path, compose(py_writer_header(), tensors, vocab=tok, features=0b101,
                                align=align))
    with C.open(p) as cf:
        assert cf.verify() == []
        assert cf.tokenizer_json() == tok and cf.tokenizer_config is None and cf.skills == []
        assert cf.shard is None and cf.provenance["tool"].startswith("convert")
        for name, dt, shape, payload in tensors:
            info = cf.tensors[name]
            assert (info.dtype, info.shape, info.nbytes) == (dt, shape, len(payload))
            assert cf.raw(name).tobytes() == payload
            want = cmf_spec.decode(payload, dt, shape)   # the spec's decoder, not the reader's
            got = cf.tensor(name)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want, err_msg=name)
        # exact values for the plain float layouts
        np.testing.assert_array_equal(cf.tensor("t.f32"), W)
        np.testing.assert_array_equal(cf.tensor("t.f16"), Q.f16_round(W))


def test_rust_writer_header_form_is_accepted(tmp_path):
    yarn = {"factor": 4, "original_max_position_embeddings": 4096}
    h = {"version": 2, "arch": tiny_arch(norm_style="gemma", yarn=yarn),
         "quant_type": "Q4_BLOCK", "tokenizer_config": {"eos_token_ids": [1, 2]},
         "future_key": {"anything": [1, 2.5, None]}}
    h["arch"]["future_arch_key"] = "x"
    h["arch"]["rms_norm_eps"] = 0  # an integer in a float field is fine for serde
    h["arch"]["sliding_window"] = None
    p = write(tmp_path, compose(h, sample_tensors()[:2]))
    with C.open(p) as cf:
        assert cf.arch["norm_style"] == "gemma" and cf.tokenizer_config["eos_token_ids"] == [1, 2]
        assert cf.quant_type == "Q4_BLOCK"


def test_raw_is_a_zero_copy_read_only_view(tmp_path):
    p = write(tmp_path, compose(py_writer_header(), sample_tensors()))
    cf = C.open(p)
    r = cf.raw("t.q8_row")
    assert not r.flags.writeable and not r.flags.owndata
    assert r.base is not None
    with pytest.raises(ValueError):
        r[0] = 1
    cf.close()  # views alive: the map stays until they go away, no error


def test_tensor_offsets_and_info(tmp_path):
    p = write(tmp_path, compose(py_writer_header(), sample_tensors()))
    with C.open(p) as cf:
        off, _ = cf.sections()["data"]
        for t in cf.tensors.values():
            assert (t.offset - off) % 64 == 0 and t.file == str(p)
        with pytest.raises(C.MissingTensor, match="no tensor 'nope'"):
            cf.tensor("nope")
        with pytest.raises(KeyError):  # MissingTensor is also a KeyError
            cf.raw("nope")


# ---- §3 validation order and error kinds ----------------------------------------------
def base_file():
    return compose(py_writer_header(), sample_tensors()[:3], vocab=b"{}")


def patch(data, off, fmt, *vals):
    b = bytearray(data)
    struct.pack_into(fmt, b, off, *vals)
    return bytes(b)


def expect(tmp_path, data, exc, match=None):
    p = write(tmp_path, data)
    with pytest.raises(exc, match=match) as ei:
        C.open(p)
    assert str(p) in str(ei.value)
    return ei.value


def test_short_file_is_bounds(tmp_path):
    for n in (0, 1, 127):
        e = expect(tmp_path, base_file()[:n], C.BoundsError, "shorter than the 128-byte")
        assert "offset 0" in str(e)


def test_magic_version_features(tmp_path):
    d = base_file()
    expect(tmp_path, b"GGUF" + d[4:], C.InvalidMagic, "bad magic")
    for v in (0, 1, 3, 2**32 - 1):
        expect(tmp_path, patch(d, 4, "<I", v), C.UnsupportedVersion, f"version {v}")
    for bit in [3, 4] + list(range(8, 32)):
        expect(tmp_path, patch(d, 12, "<I", 1 | (1 << bit)), C.UnsupportedFeature, "0x")
    for ok in (0, 1, 2, 4, 0x20, 0x40, 0x80, 0xE7):  # 0x80: GGML_BLOCKS (§7.9)
        p = write(tmp_path, patch(d, 12, "<I", ok))
        C.open(p).close()
    # magic is checked before version, version before features
    expect(tmp_path, patch(b"XXXX" + d[4:], 4, "<I", 9), C.InvalidMagic)
    expect(tmp_path, patch(patch(d, 4, "<I", 9), 12, "<I", 0xFF00), C.UnsupportedVersion)


def test_empty_header_or_directory(tmp_path):
    d = base_file()
    expect(tmp_path, patch(d, 0x18, "<Q", 0), C.BoundsError, "header section is empty")
    expect(tmp_path, patch(d, 0x28, "<Q", 0), C.BoundsError, "dir section is empty")


@pytest.mark.parametrize("field", range(6))
def test_sections_past_eof_or_overflowing(tmp_path, field):
    d = base_file()
    at = 0x10 + 16 * field
    _off, _ln = struct.unpack_from("<QQ", d, at)
    for new_off, new_len in [(len(d), 1), (len(d) - 1, 2), (2**64 - 1, 2), (0, 2**63),
                             (2**63, 2**63)]:
        e = expect(tmp_path, patch(d, at, "<QQ", new_off, new_len), C.BoundsError,
                   "runs past the end")
        assert f"0x{at:x}" in str(e)


def test_data_off_alignment(tmp_path):
    d = base_file()
    data_off = struct.unpack_from("<Q", d, 0x30)[0]
    expect(tmp_path, patch(d, 0x30, "<Q", data_off - 64), C.BoundsError, "multiple of 4096")
    # data_len 0: any data_off is fine
    h = py_writer_header()
    C.open(write(tmp_path, compose(h, []))).close()


def with_header(obj_or_bytes, tensors=None):
    return compose(obj_or_bytes, sample_tensors()[:2] if tensors is None else tensors)


def _set(d, path, value):
    d = json.loads(json.dumps(d))
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    if value is _DEL:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return d


_DEL = object()
REFUSED = [
    (("arch", "hidden_size"), 64.0, "expected an integer"),
    (("arch", "hidden_size"), True, "expected an integer"),
    (("arch", "hidden_size"), -1, "out of range"),
    (("arch", "hidden_size"), 2**64, "out of range"),
    (("arch", "hidden_size"), "64", "expected an integer"),
    (("arch", "hidden_size"), None, "null is not allowed"),
    (("arch", "vocab_size"), _DEL, "missing required field"),
    (("arch", "rms_norm_eps"), _DEL, "missing required field"),
    (("arch", "rms_norm_eps"), "1e-6", "expected a number"),
    (("arch", "layer_types"), None, "null is not allowed"),
    (("arch", "layer_types"), ["full"], "expected one of"),
    (("arch", "norm_style"), "Qwen", "expected one of"),
    (("arch", "norm_style"), None, "null is not allowed"),
    (("arch", "tie_word_embeddings"), 1, "expected a boolean"),
    (("arch", "num_loops"), 1.0, "expected an integer"),
    (("arch", "moe"), {"num_experts": 8, "moe_intermediate_size": 32}, "top_k"),
    (("arch", "yarn"), {"factor": 4}, "original_max_position_embeddings"),
    (("arch", "mla"), {"kv_lora_rank": 1, "qk_rope_head_dim": 1, "qk_nope_head_dim": 1},
     "v_head_dim"),
    (("arch",), _DEL, "arch: missing"),
    (("version",), _DEL, "version: missing"),
    (("version",), "2", "expected an integer"),
    (("version",), 2**32, "out of range"),
    (("quant_type",), "q8_row", "expected one of"),
    (("quant_type",), "Q4_TILED", "expected one of"),
    (("quant_type",), _DEL, "missing"),
    (("skills",), None, "null is not allowed"),
    (("skills",), [{"name": "x"}], "skills\\[0\\].id: missing"),
    (("skills",), [{"id": "a", "selection": {"metric": "mse", "phi_layer": 1, "mean": "",
                                             "basis": ""}}], "rank: missing"),
    (("skills",), [{"id": "a", "layers": None}], "null"),
    (("tokenizer_config",), {"eos_token_ids": None}, "null"),
    (("tokenizer_config",), {"bos_token_id": 2**32}, "out of range"),
    (("tokenizer_config",), {"eos_token_ids": [1.0]}, "expected an integer"),
    (("shard",), {"no": 1}, "count: missing"),
    (("routing",), {"temperature": 1, "novelty_theta": 1, "samples": 3}, "target_fpr"),
    (("format",), None, "null is not allowed"),
]


@pytest.mark.parametrize("path,value,msg", REFUSED, ids=[".".join(r[0]) + "=" + repr(r[1])[:20]
                                                         for r in REFUSED])
def test_header_typing_is_serde_strict(tmp_path, path, value, msg):
    h = _set(py_writer_header(), path, value)
    e = expect(tmp_path, with_header(h), C.ParseError, msg)
    assert "header JSON at offset 128" in str(e)


@pytest.mark.parametrize("raw", [
    b'{"version": 2, "version": 2}',
    b"[]", b"null", b"42", b'"cmf"', b"{", b"\xff\xfe{}",
    b'{"version": 2, "arch": {}, "quant_type": "F32"} trailing',
    b'{"rms": NaN}', b'{"x": Infinity}', b"[" * 5000 + b"]" * 5000,
    b'{"x": 1e999}', b'{"x": "\\ud800"}', b'{"x": ' + b"9" * 5000 + b"}",
])
def test_header_json_garbage(tmp_path, raw):
    expect(tmp_path, with_header(raw), C.ParseError, "header JSON")


def test_duplicate_keys_refused_at_any_depth(tmp_path):
    good = json.dumps(py_writer_header())
    bad = good.replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 64')
    assert bad != good
    expect(tmp_path, with_header(bad.encode()), C.ParseError, "duplicate key")


def dir_at(d):
    return struct.unpack_from("<QQ", d, 0x20)


def test_directory_structure(tmp_path):
    d = base_file()
    doff, dlen = dir_at(d)
    expect(tmp_path, patch(d, 0x28, "<Q", 15), C.ParseError, "shorter than its 16-byte head")
    for count in (2**63, 2**64 - 1, 10**6):
        expect(tmp_path, patch(d, doff, "<Q", count), C.ParseError, f"claims {count} tensors")
    expect(tmp_path, patch(d, doff + 8, "<Q", 16), C.ParseError, "name pool offset")
    expect(tmp_path, patch(d, doff + 8, "<Q", dlen + 1), C.ParseError, "name pool offset")


def rec(d, i):
    return dir_at(d)[0] + 16 + 56 * i


def test_directory_records(tmp_path):
    d = base_file()  # t.f32 (8x64), t.f16, t.bf16
    r0 = rec(d, 0)
    expect(tmp_path, patch(d, r0 + 7, "<B", 7), C.ParseError, "ndim 7 > 6")
    expect(tmp_path, patch(d, r0, "<I", 10**6), C.ParseError, "outside the")
    expect(tmp_path, patch(d, r0 + 4, "<H", 60000), C.ParseError, "outside the")
    pool = dir_at(d)[0] + struct.unpack_from("<Q", d, dir_at(d)[0] + 8)[0]
    expect(tmp_path, patch(d, pool, "<B", 0xFF), C.ParseError, "not UTF-8")
    for did in (17, 200, 255):
        expect(tmp_path, patch(d, r0 + 6, "<B", did), C.UnknownDtype, f"unknown dtype id {did}")
    expect(tmp_path, patch(d, r0 + 32, "<Q", 32), C.BoundsError, "not a multiple of 64")
    expect(tmp_path, patch(d, r0 + 32, "<Q", 2**63), C.BoundsError, "runs past")
    expect(tmp_path, patch(d, r0 + 40, "<Q", 2**40), C.BoundsError, "runs past")
    expect(tmp_path, patch(d, r0 + 40, "<Q", 2**64 - 1), C.BoundsError, "runs past")
    expect(tmp_path, patch(d, r0 + 40, "<Q", 4 * 8 * 64 - 4), C.BoundsError, "needs 2048 bytes")
    expect(tmp_path, patch(d, r0 + 8, "<I", 9), C.BoundsError, "needs")
    expect(tmp_path, patch(d, r0 + 7, "<B", 6) if False else
           patch(patch(d, r0 + 7, "<B", 6), r0 + 8, "<6I", *([2**32 - 1] * 6)),
           C.BoundsError)
    # rename record 1 to record 0's name -> duplicate
    r1 = rec(d, 1)
    no0, nl0 = struct.unpack_from("<IH", d, r0)
    expect(tmp_path, patch(d, r1, "<IH", no0, nl0), C.ParseError, "duplicate tensor name")


def test_ndim0_and_reserved_dtypes_accepted(tmp_path):
    t = [("scalar", "f32", (), np.float32(3.5).tobytes()),
         ("cfg", "u8", (3,), b"abc"),
         ("m84", "mix8_4", (2,), b"\1\2\3")]
    p = write(tmp_path, compose(py_writer_header(), t))
    with C.open(p) as cf:
        assert cf.tensor("scalar") == np.float32(3.5) and cf.tensors["scalar"].shape == ()
        assert cf.tensor("cfg").tobytes() == b"abc"
        with pytest.raises(FormatError, match="cannot be decoded"):
            cf.tensor("m84")


def test_vbit_structure_checked_on_open(tmp_path):
    for dt in ("vbit", "vbit_ro"):
        payload = bytearray(Q.quantize(W, dt).tobytes())
        payload[0] = 7  # width outside {3,4,5,6,8}
        expect(tmp_path, compose(py_writer_header(), [("v", dt, W.shape, bytes(payload))]),
               C.BoundsError, "widths")
        good = Q.quantize(W, dt).tobytes()
        expect(tmp_path, compose(py_writer_header(), [("v", dt, W.shape, good[:-1])]),
               C.BoundsError)
        expect(tmp_path, compose(py_writer_header(), [("v", dt, (8, 48), good)]),
               C.BoundsError, "multiple of 32")
        if dt == "vbit_ro":
            bad = bytearray(good)
            bad[8 + 2 * 8 * 2 + 4] ^= 1  # offs[1]
            expect(tmp_path, compose(py_writer_header(), [("v", dt, W.shape, bytes(bad))]),
                   C.BoundsError, "offsets")


# ---- masks / sparse index ----------------------------------------------------------------
def masks_section(arch, tasks, n_masks=None, blob_len_delta=0, expert=False):
    blobs, recs, meta = [], [], b""
    L, inter, heads = arch["num_layers"], arch["intermediate_size"], arch["num_attention_heads"]
    for tid, name in enumerate(tasks):
        blob = b"\xff" * (L * -(-inter // 8)) + b"\x0d" * (L * -(-heads // 8)) + b"\x03"
        blobs.append(blob)
    for _ in range(5):
        off = -(-(8 + len(meta)) // 8) * 8
        recs = []
        for tid, (name, blob) in enumerate(zip(tasks, blobs)):
            recs.append({"task_id": tid, "name": name, "sparsity": 0.1, "quality": None,
                         "priority": "Normal", "has_expert_fields": expert, "blob_off": off,
                         "blob_len": len(blob) + blob_len_delta})
            off = -(-(off + len(blob)) // 8) * 8
        meta = json.dumps({"default_task": tasks[0], "masks": recs}).encode()
    out = bytearray(struct.pack("<II", len(tasks) if n_masks is None else n_masks, len(meta)))
    out += meta
    for r, blob in zip(recs, blobs):
        out += b"\0" * (r["blob_off"] - len(out)) + blob
    return bytes(out)


def test_masks_section_from_spec(tmp_path):
    arch = tiny_arch(num_attention_heads=4, intermediate_size=10)
    h = py_writer_header(arch=arch)
    m = masks_section(arch, ["chat", "code"])
    p = write(tmp_path, compose(h, sample_tensors()[:1], masks=m, features=0b11))
    with C.open(p) as cf:
        assert cf.masks.names() == ["chat", "code"] and cf.masks.default_task == "chat"
        t = cf.masks["code"]
        assert t.heads.tolist() == [[True, False, True, True]] * 2  # byte 0d
        assert t.ffn.all() and t.ffn.shape == (2, 10)  # ff 03
        assert t.layers.tolist() == [True, True] and t.experts is None
        assert cf.verify() == []
    for bad, msg in [(masks_section(arch, ["a"], n_masks=2), "n_masks is 2"),
                     (masks_section(arch, ["a"], blob_len_delta=-1), "neither"),
                     (masks_section(arch, ["a"], expert=True), "no moe"),
                     (m[:7], "shorter than its 8-byte head"),
                     (m[:40], "meta_len")]:
        expect(tmp_path, compose(h, [], masks=bad, features=3), C.ParseError, msg)


def test_sparse_index_parsed_and_bounded(tmp_path):
    entry = struct.pack("<IIII", 0, 1, 2, 3) + struct.pack("<2H", 4, 5) + b"\1\0\1" + b"\0"
    idx = struct.pack("<II", 1, 0) + entry
    assert [(a, b, g.tolist(), hd.tolist()) for a, b, g, hd in parse_sparse_index(idx)] == [
        (0, 1, [4, 5], [1, 0, 1])]
    p = write(tmp_path, compose(py_writer_header(), [], index=idx))
    with C.open(p) as cf:
        assert len(cf.sparse_index) == 1 and cf.verify() == []
    for bad in (idx[:6], struct.pack("<II", 2**32 - 1, 0) + entry, idx[:-5],
                struct.pack("<II", 1, 0) + struct.pack("<IIII", 0, 0, 2**32 - 1, 0)):
        expect(tmp_path, compose(py_writer_header(), [], index=bad), C.ParseError,
               "sparse index")


# ---- verify ------------------------------------------------------------------------------
def test_verify_reports_each_kind(tmp_path):
    d = compose(py_writer_header(), sample_tensors()[:3], vocab=b'{"v": 1}')
    p = write(tmp_path, d)
    assert C.open(p).verify() == []
    data_off = struct.unpack_from("<Q", d, 0x30)[0]
    b = bytearray(d)
    b[data_off + 5] ^= 0x10
    probs = C.open(write(tmp_path, bytes(b))).verify()
    assert len(probs) == 1 and "'t.f32'" in probs[0] and f"offset {data_off}" in probs[0]
    with pytest.raises(C.HashMismatch, match="'t.f32'"):
        C.open(write(tmp_path, bytes(b))).verify(strict=True)
    assert C.open(write(tmp_path, d, "clean.cmf")).verify(strict=True) == []
    b = bytearray(d)
    b[-2] ^= 1  # vocab byte
    probs = C.open(write(tmp_path, bytes(b))).verify()
    assert len(probs) == 1 and "vocab section" in probs[0]
    # a damaged header or directory is refused on open; verify="off" lists it
    with pytest.raises(C.HashMismatch, match="header hash mismatch"):
        C.open(write(tmp_path, patch(d, 0x70, "<Q", 12345)))
    probs = C.open(write(tmp_path, patch(d, 0x70, "<Q", 12345)), verify="off").verify()
    assert len(probs) == 1 and "header hash mismatch" in probs[0]
    probs = C.open(write(tmp_path, patch(d, 0x78, "<Q", 12345)), verify="off").verify()
    assert len(probs) == 1 and "directory hash mismatch" in probs[0]
    # 0 = not recorded (Rust semantics): no problem
    assert C.open(write(tmp_path, compose(py_writer_header(), sample_tensors()[:2],
                                          hashes=False))).verify() == []
    # an unparsable section hash is itself a problem
    h = py_writer_header(section_hashes={"vocab": "zz"})
    raw = json.dumps(h).encode()
    probs = C.open(write(tmp_path, compose(raw, [], vocab=b"{}"))).verify()
    assert probs and "not a hex hash" in probs[0]


# ---- malformed input never crashes --------------------------------------------------------
def rich_file():
    arch = tiny_arch(intermediate_size=10)
    return compose(py_writer_header(arch=arch), sample_tensors(), vocab=b'{"tok": 1}',
                   masks=masks_section(arch, ["a", "b"]), features=0b111)


def open_fully(p):
    """Open, decode every tensor, verify. Anything but FormatError escapes."""
    try:
        cf = C.open(p)
    except FormatError:
        return "refused"
    with cf:
        for name in cf.names():
            try:
                cf.tensor(name)
            except FormatError:
                pass
        return cf.verify()


def boundaries(d):
    cuts = {0, 1, 4, 8, 16, 127, 128, 129, len(d) - 1}
    for i in range(6):
        off, ln = struct.unpack_from("<QQ", d, 0x10 + 16 * i)
        if ln:
            cuts.update({off - 1, off, off + 1, off + ln // 2, off + ln - 1, off + ln})
    return sorted(c for c in cuts if 0 <= c < len(d))


def test_truncation_at_every_section_boundary(tmp_path):
    d = rich_file()
    assert open_fully(write(tmp_path, d)) == []
    for cut in boundaries(d) + list(range(0, len(d), 997)):
        with pytest.raises(FormatError):
            C.open(write(tmp_path, d[:cut]))


def _regions(d):
    doff, dlen = dir_at(d)
    data_off, data_len = struct.unpack_from("<QQ", d, 0x30)
    return {"envelope": range(128), "header": range(128, doff),
            "directory": range(doff, doff + dlen), "data": range(data_off, data_off + data_len)}


@pytest.mark.parametrize("region", ["envelope", "header", "directory", "data"])
def test_flipped_bytes_never_crash(tmp_path, region):
    d = rich_file()
    rng = np.random.default_rng(len(region))
    rg = _regions(d)[region]
    positions = rng.choice(np.array(rg), size=min(120, len(rg)), replace=False)
    with C.open(write(tmp_path, d, "orig.cmf")) as cf:  # payload bytes (gaps are unhashed)
        hashed = {i for t in cf.tensors.values() for i in range(t.offset, t.offset + t.nbytes)}
    for pos in positions:
        for mask in (0x01, 0x80, 0xFF):
            b = bytearray(d)
            b[pos] ^= mask
            res = open_fully(write(tmp_path, bytes(b)))
            covered = region in ("header", "directory") or pos in hashed
            if covered and res != "refused":
                # covered by a hash: verify() must notice
                assert res, f"{region} flip at {pos} ^{mask:#x} went unnoticed"


def test_every_data_byte_flip_is_caught_by_verify(tmp_path):
    d = compose(py_writer_header(), sample_tensors()[:4])
    _data_off, _ = struct.unpack_from("<QQ", d, 0x30)
    cf0 = C.open(write(tmp_path, d, "orig.cmf"))
    for t in cf0.tensors.values():
        for pos in (t.offset, t.offset + t.nbytes // 2, t.offset + t.nbytes - 1):
            b = bytearray(d)
            b[pos] ^= 0x01
            probs = C.open(write(tmp_path, bytes(b))).verify()
            assert len(probs) == 1 and repr(t.name) in probs[0]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(C.CmfFileNotFound, match="no such file"):
        C.open(tmp_path / "nope.cmf")
    with pytest.raises(FileNotFoundError):
        C.open(tmp_path / "nope.cmf")
    with pytest.raises(FormatError, match="is a directory"):
        C.open(tmp_path)


def test_error_hierarchy():
    for e in (C.InvalidMagic, C.UnsupportedVersion, C.UnsupportedFeature, C.UnknownDtype,
              C.MissingTensor, C.BoundsError, C.ParseError, C.HashMismatch, C.CmfFileNotFound):
        assert issubclass(e, FormatError)
    import cortiq.errors
    assert C.FormatError is cortiq.errors.FormatError


RICH = rich_file()


@settings(max_examples=150, deadline=None)
@given(muts=st.lists(st.tuples(st.one_of(st.integers(0, len(RICH) - 1),  # anywhere, or
                                         st.integers(0, 127),             # the envelope,
                                         st.integers(128, 4095)),         # header + dir
                               st.integers(0, 255)),
                     min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.integers(0, len(RICH))))
def test_random_mutations_only_raise_format_errors(muts, cut):
    b = bytearray(RICH)
    for pos, val in muts:
        b[pos] = val
    data = bytes(b if cut is None else b[:cut])
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "fuzz.cmf")
        with builtins.open(p, "wb") as fh:
            fh.write(data)
        open_fully(p)  # anything but FormatError fails the test


def test_ggml_block_records(tmp_path):
    """§7.9: a ggml block format's record must hold whole blocks per row and exactly
    numel / block_elems * block_bytes bytes; a good one opens with its bytes as given."""
    raw = bytes(range(18)) * 2                      # two q4_0 blocks
    ok = write(tmp_path, compose(py_writer_header(), [("w", "q4_0", (1, 64), raw)], features=0x81))
    cf = C.open(ok)
    assert cf.tensors["w"].dtype == "q4_0" and bytes(cf.raw("w")) == raw
    cf.close()
    expect(tmp_path, compose(py_writer_header(), [("w", "q4_0", (2, 16), raw)], features=0x81),
           C.BoundsError, "multiple of 32")
    expect(tmp_path, compose(py_writer_header(), [("w", "q4_0", (1, 96), raw)], features=0x81),
           C.BoundsError, "needs 54 bytes")
    expect(tmp_path, compose(py_writer_header(), [("w", "q4_k", (1, 64), raw)], features=0x81),
           C.BoundsError, "multiple of 256")
