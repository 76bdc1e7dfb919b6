"""Split GGUF sets (llama.cpp's gguf-split layout, written here by the ``gguf``
package's writer): any part opens the whole set as one model whose logits equal the
unsplit file's bit for bit, through `LLM`, the CLI, `import-gguf` and the model
argument; every damaged set is refused with a FormatError naming the file at fault."""
from __future__ import annotations

import json
import os
import shutil
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import optional

gguf = optional.need("extras", "gguf")
from reference import gguf_llama as G  # noqa: E402

import cortiq  # noqa: E402
from cortiq import pretrained  # noqa: E402
from cortiq.convert.gguf_import import import_gguf  # noqa: E402
from cortiq.errors import ConfigError, FormatError  # noqa: E402
from cortiq.gguf import open as gguf_open  # noqa: E402
from cortiq.serve.cli import main  # noqa: E402

T = gguf.GGMLQuantizationType
V, H, F, HEADS, KV, HD, LAYERS = 48, 64, 96, 4, 2, 16, 2
ARCH = {"arch_name": "llama", "hidden_size": H, "intermediate_size": F,
        "num_layers": LAYERS, "num_attention_heads": HEADS, "num_kv_heads": KV,
        "head_dim": HD, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0}
IDS = [3, 17, 5, 40, 11, 2, 29, 8]


def _tensors(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def m(rows, cols):
        return (0.08 * rng.standard_normal((rows, cols))).astype(np.float32)
    out = {"model.embed_tokens.weight": m(V, H), "model.norm.weight": 1 + m(1, H)[0],
           "lm_head.weight": m(V, H)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": 1 + m(1, H)[0],
                p + "post_attention_layernorm.weight": 1 + m(1, H)[0],
                p + "self_attn.q_proj.weight": m(HEADS * HD, H),
                p + "self_attn.k_proj.weight": m(KV * HD, H),
                p + "self_attn.v_proj.weight": m(KV * HD, H),
                p + "self_attn.o_proj.weight": m(H, HEADS * HD),
                p + "mlp.gate_proj.weight": m(F, H), p + "mlp.up_proj.weight": m(F, H),
                p + "mlp.down_proj.weight": m(H, F)}
    return out


def _types(name, a):
    """Q4_0 for the MLP, Q8_0 for attention, F16 for the embedding and head."""
    if "mlp" in name:
        return T.Q4_0
    return T.Q8_0 if "self_attn" in name else T.F16


_TOKENIZER = {"model": "gpt2", "tokens": ["t", "1", "t1", "2", "Ġ"] + [f"w{i}" for i in
                                                                       range(5, V)],
              "types": [1] * V, "merges": ["t 1"], "eos": 4, "add_bos": False}


def _write(path, **split) -> list:
    return G.write(path, _tensors(), ARCH, types=_types, tokenizer=_TOKENIZER, **split)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The whole file, a set of 5 parts and a set whose first part holds no tensor."""
    d = tmp_path_factory.mktemp("split")
    whole = _write(d / "whole.gguf")[0]
    (d / "a").mkdir()
    (d / "b").mkdir()
    parts = _write(d / "a" / "m.gguf", split_max_tensors=5)
    meta_first = _write(d / "b" / "m.gguf", split_max_tensors=8, small_first_shard=True)
    return whole, parts, meta_first


def _logits(path) -> np.ndarray:
    with cortiq.LLM(path, precision="exact") as llm:
        return np.asarray(llm.session().feed(IDS, want="all"))


def test_the_writer_made_split_sets(files):
    _whole, parts, meta_first = files
    assert [p.name for p in parts] == [f"m-0000{i}-of-00005.gguf" for i in range(1, 6)]
    assert all(p.is_file() for p in parts + meta_first)
    first = gguf.GGUFReader(str(meta_first[0]))
    assert len(first.tensors) == 0 and "general.architecture" in first.fields
    later = gguf.GGUFReader(str(parts[1]))
    assert "general.architecture" not in later.fields and len(later.tensors) > 0


def test_any_part_opens_the_set_with_the_whole_files_logits(files):
    whole, parts, meta_first = files
    want = _logits(whole)
    for s in (parts, meta_first):
        for given in (s[0], s[-1], s[len(s) // 2]):
            with gguf_open(given) as gf:
                assert gf.files == [str(p) for p in s] and gf.path == str(s[0])
                with gguf_open(whole) as w:
                    assert set(gf.tensors) == set(w.tensors)
                    assert gf.arch == w.arch
                    for n in w.tensors:
                        np.testing.assert_array_equal(gf.raw(n), w.raw(n))
            np.testing.assert_array_equal(_logits(given), want)


def test_preloaded_set_and_reading_never_modifies_it(files):
    _whole, parts, _ = files
    before = [(p.read_bytes(), os.path.getmtime(p)) for p in parts]
    with cortiq.LLM(parts[2], preload=True, precision="exact") as llm:
        got = llm.session().feed(IDS, want="all")
    np.testing.assert_array_equal(got, _logits(parts[0]))
    assert [(p.read_bytes(), os.path.getmtime(p)) for p in parts] == before


def test_import_gguf_writes_one_cmf(files, tmp_path):
    whole, parts, _ = files
    import_gguf(whole, tmp_path / "whole.cmf", progress=False)
    import_gguf(parts[3], tmp_path / "split.cmf", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split.cmf", "whole.cmf"]
    np.testing.assert_array_equal(_logits(tmp_path / "split.cmf"),
                                  _logits(tmp_path / "whole.cmf"))
    assert main(["import-gguf", str(parts[1]), str(tmp_path / "cli.cmf"), "--quiet"]) == 0
    np.testing.assert_array_equal(_logits(tmp_path / "cli.cmf"),
                                  _logits(tmp_path / "whole.cmf"))


def test_cli_info_verify_run_on_a_part(files, capsys):
    _whole, parts, _ = files
    assert main(["info", str(parts[1])]) == 0
    out = capsys.readouterr().out
    assert f"file:        {parts[0]} (5 split parts)" in out
    assert "in 5 split parts" in out and "arch:        llama" in out
    assert sum(line.startswith("part:") for line in out.splitlines()) == 5
    assert main(["verify", str(parts[4])]) == 0
    assert "GGUF structure checked" in capsys.readouterr().out
    assert main(["run", str(parts[0]), "-p", "t1t1", "-n", "2", "--temperature", "0"]) == 0


def test_model_argument_takes_a_part_or_a_folder(files, tmp_path):
    _whole, parts, _ = files
    assert pretrained.resolve(parts[2]) == parts[2]
    assert pretrained.resolve(parts[0].parent) == parts[0]      # one split set: one model
    both = tmp_path / "both"
    both.mkdir()
    for p in parts:
        shutil.copyfile(p, both / p.name)
    shutil.copyfile(parts[0], both / "other.gguf")
    (both / "mmproj-m-f16.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"holds 2 models: pass one of them "
                                          r"\(m-00001-of-00005.gguf, other.gguf\)"):
        pretrained.resolve(both)
    # re-quantizing a set converts it once, keyed on every part
    out = pretrained.resolve(parts[1], quant="f32", cache=tmp_path / "cache",
                             progress=False)
    assert out.name.startswith("m-f32-") and out.suffix == ".cmf"
    assert pretrained.resolve(parts[4], quant="f32", cache=tmp_path / "cache",
                              progress=False) == out


# -- damaged sets -------------------------------------------------------------------------

def _copy_set(parts, folder):
    folder.mkdir()
    return [shutil.copyfile(p, folder / p.name) for p in parts]


def _patch_key(path, key: str, fmt: str, value) -> None:
    """Overwrite the value of metadata `key` (its bytes follow the key's name and its
    u32 value type)."""
    data = bytearray(path.read_bytes())
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4
    struct.pack_into(fmt, data, at, value)
    path.write_bytes(bytes(data))


def test_a_missing_part_is_named(files, tmp_path):
    s = _copy_set(files[1], tmp_path / "s")
    os.remove(s[2])
    for given in (s[0], s[4]):
        with pytest.raises(FormatError, match=r"part 3 of this 5-part split GGUF is "
                                              rf"missing: no file .*{s[2].name}"):
            cortiq.LLM(given)
    os.remove(s[0])                        # the metadata part itself
    with pytest.raises(FormatError, match=rf"part 1 .* missing: no file .*{s[0].name}"):
        gguf_open(s[1])
    assert main(["info", str(s[1])]) == 1


def test_parts_that_do_not_belong_together(files, tmp_path):
    parts = files[1]
    s = _copy_set(parts, tmp_path / "count")
    _patch_key(s[1], "split.count", "<H", 6)
    with pytest.raises(FormatError, match=rf"{s[1].name}: expected part 2 of 5 .* says part "
                                          r"2 of 6"):
        gguf_open(s[0])
    s = _copy_set(parts, tmp_path / "swapped")
    shutil.copyfile(parts[3], s[1])        # part 4's file under part 2's name
    with pytest.raises(FormatError, match=r"expected part 2 of 5 .* says part 4 of 5"):
        gguf_open(s[0])
    with pytest.raises(FormatError, match=r"the name says part 2 of 5 but its GGUF metadata "
                                          r"says part 4 of 5"):
        gguf_open(s[1])
    s = _copy_set(parts, tmp_path / "whole-mixed-in")
    shutil.copyfile(files[0], s[2])        # an unsplit file under a part's name
    with pytest.raises(FormatError, match=r"expected part 3 of 5 .* no split keys"):
        gguf_open(s[0])
    s = _copy_set(parts, tmp_path / "other-set")
    _patch_key(s[3], "split.tensors.count", "<i", 99)
    with pytest.raises(FormatError, match=rf"{s[3].name}: GGUF metadata split.tensors.count "
                                          r"is 99 .* parts of different sets"):
        gguf_open(s[0])
    s = _copy_set(parts, tmp_path / "total")
    n = len(gguf.GGUFReader(str(files[0])).tensors)
    for p in s:
        _patch_key(p, "split.tensors.count", "<i", n + 1)
    with pytest.raises(FormatError, match=rf"parts hold {n} tensors but split.tensors.count "
                                          rf"says {n + 1}"):
        gguf_open(s[0])
    s = _copy_set(parts, tmp_path / "range")
    _patch_key(s[0], "split.no", "<H", 7)
    with pytest.raises(FormatError, match=r"split.no is 7, outside a set of 5 parts"):
        gguf_open(s[0])


def test_a_tensor_in_two_parts(tmp_path):
    s = _write(tmp_path / "m.gguf", split_max_tensors=1)
    holder = {gguf.GGUFReader(str(p)).tensors[0].name: p for p in s[1:]}
    k, q = holder["blk.0.attn_k.weight"], holder["blk.0.attn_q.weight"]
    k.write_bytes(k.read_bytes().replace(b"blk.0.attn_k.weight", b"blk.0.attn_q.weight"))
    with pytest.raises(FormatError, match=r"tensor blk.0.attn_q.weight is also in .* a "
                                          r"tensor may be in one part only"):
        gguf_open(s[0])
    assert {k.name, q.name} <= {p.name for p in s}


def test_a_renamed_part_cannot_find_its_set(files, tmp_path):
    odd = tmp_path / "weights.gguf"
    shutil.copyfile(files[1][0], odd)
    with pytest.raises(FormatError, match=r"weights.gguf: GGUF part 1 of a split into 5 "
                                          r"files, but its name does not end in the split "
                                          r"convention's '-00001-of-00005.gguf'"):
        cortiq.LLM(odd)


def test_a_hub_quant_that_is_a_split_set(files, tmp_path, monkeypatch, capsys):
    pytest.importorskip("huggingface_hub")
    import fake_hub
    whole, parts, _ = files
    hub = fake_hub.install(tmp_path, monkeypatch)
    hub.add("org/m-GGUF", {f"Q8_0/m-Q8_0-0000{i + 1}-of-00005.gguf": p.read_bytes()
                           for i, p in enumerate(parts)} |
            {"m-Q4_0.gguf": whole.read_bytes()})
    with cortiq.LLM.from_pretrained("org/m-GGUF:q8_0", precision="exact",
                                    progress=False) as llm:
        assert len(llm.file.files) == 5
        got = llm.session().feed(IDS, want="all")
    np.testing.assert_array_equal(got, _logits(whole))
    assert [c[2] for c in hub.calls if c[0] == "download"] == [
        f"Q8_0/m-Q8_0-0000{i}-of-00005.gguf" for i in range(1, 6)]
    capsys.readouterr()
    assert main(["models", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["models"]
    assert (entry["name"], entry["quant"], entry["format"]) == ("org--m-GGUF--Q8_0", "Q8_0",
                                                               "gguf")
    assert entry["size"] >= sum(p.stat().st_size for p in parts)
    assert main(["info", "org/m-GGUF:Q8_0"]) == 0
    assert "(5 split parts)" in capsys.readouterr().out
    # import-gguf takes the Hub id too (the cached download) and a folder holding one
    import_gguf(whole, tmp_path / "whole.cmf", progress=False)
    want = _logits(tmp_path / "whole.cmf")
    assert main(["import-gguf", "org/m-GGUF:Q8_0", str(tmp_path / "hub.cmf"), "--quiet"]) == 0
    np.testing.assert_array_equal(_logits(tmp_path / "hub.cmf"), want)
    assert main(["import-gguf", str(parts[0].parent), str(tmp_path / "dir.cmf"),
                 "--quiet"]) == 0
    np.testing.assert_array_equal(_logits(tmp_path / "dir.cmf"), want)
