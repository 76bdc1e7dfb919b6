"""Preload (cmf.open(preload=True), LLM(preload=...), --preload; CORTIQ_PRELOAD is pinned
in test_public_api.py): the file's bytes copied into private anonymous memory give the
same tensors, hashes and logits as the file mapping, read-only views, an untouched
file, and a copy (later writes to the file do not reach it) that starts on a 2 MiB
boundary."""
import io
import mmap
import os
import sys

import numpy as np
import pytest

import cortiq
import cortiq.cmf as C
from cortiq.kernels import _config
from cortiq.serve.cli import build_parser, main
from cortiq.cmf._anon import HUGE_PAGE, anon_copy
from cortiq.cmf.testing import tiny_arch, tiny_tensors
from cortiq.demo import demo_path

import toy_model as T

T.register()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("preload") / "m.cmf"
    C.write(p, tiny_tensors(), arch=tiny_arch(), quant="q8_row", tokenizer_json=b'{"t": 1}',
            progress=False)
    return p


@pytest.fixture
def shards(tmp_path):
    C.write(tmp_path / "s.cmf", tiny_tensors(seed=3), arch=tiny_arch(), quant="q8_row",
            max_shard_bytes=12000, progress=False)
    files = sorted(tmp_path.iterdir())
    assert len(files) >= 3
    return files


def _same_contents(a, b):
    assert a.header == b.header and a.files == b.files and a.names() == b.names()
    assert a.tensors == b.tensors and a.tokenizer_json() == b.tokenizer_json()
    for name in a.names():
        np.testing.assert_array_equal(a.raw(name), b.raw(name))
        x, y = a.tensor(name), b.tensor(name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("which", ["single", "shards"])
def test_preload_gives_the_mapped_bytes(model_file, shards, which):
    path = model_file if which == "single" else shards[1]
    with C.open(path) as mapped, C.open(path, preload=True) as pre:
        assert not mapped.preload and pre.preload and "preload=True" in repr(pre)
        _same_contents(mapped, pre)
        assert pre.verify() == [] and len(pre._parts) == len(mapped._parts)


@pytest.mark.parametrize("which", ["single", "shards"])
def test_preload_is_a_copy_of_every_part(model_file, shards, tmp_path, which):
    """Bytes written to the file after open reach the map but not the copy."""
    if which == "single":
        files = [tmp_path / "m.cmf"]
        files[0].write_bytes(model_file.read_bytes())
    else:
        files = shards
    with C.open(files[0], preload=True) as pre, \
    C.open(files[0], verify="off") as mapped:   # damaged below, on purpose
        before = {n: pre.raw(n).copy() for n in pre.names()}
        for f in files:
            part = pre._part(str(f))
            off, ln = part.sections["data"]
            with open(f, "r+b") as fh:
                fh.seek(off)
                flipped = bytes(b ^ 0xFF for b in fh.read(ln))
                fh.seek(off)
                fh.write(flipped)
        changed = [n for n in pre.names() if not np.array_equal(mapped.raw(n), before[n])]
        assert len(changed) == len(pre.names())  # the map sees the writes, in every file
        for n in pre.names():
            np.testing.assert_array_equal(pre.raw(n), before[n])
        assert pre.verify() == []


def test_file_bytes_and_mtime_unchanged(model_file):
    data, st = model_file.read_bytes(), os.stat(model_file)
    with C.open(model_file, preload=True) as cf:
        for n in cf.names():
            cf.tensor(n)
        cf.verify(strict=True)
    assert model_file.read_bytes() == data
    assert os.stat(model_file).st_mtime_ns == st.st_mtime_ns


def test_views_are_read_only(model_file):
    with C.open(model_file, preload=True) as cf:
        for r in (cf.raw("lm_head.weight"), cf._parts[0].buf):
            assert not r.flags.writeable
            with pytest.raises(ValueError):
                r.flags.writeable = True
            with pytest.raises(ValueError):
                r[0] = 1


def test_close_releases_the_copy(model_file):
    cf = C.open(model_file, preload=True)
    mm = cf._parts[0]._mm
    assert isinstance(mm, mmap.mmap) and not mm.closed
    cf.close()
    assert mm.closed and cf._parts[0].buf is None
    with pytest.raises(ValueError, match="closed"):
        cf.raw("lm_head.weight")
    # a view still alive keeps the copy (close does not raise, the view stays valid)
    with C.open(model_file) as mapped:
        want = mapped.raw("lm_head.weight").copy()
    cf = C.open(model_file, preload=True)
    r = cf.raw("lm_head.weight")
    mm = cf._parts[0]._mm
    cf.close()
    assert not mm.closed
    np.testing.assert_array_equal(r, want)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages: Linux")
def test_copy_starts_on_a_huge_page_boundary(model_file, shards):
    for path in (model_file, shards[0]):
        with C.open(path, preload=True) as cf:
            for part in cf._parts:
                assert part.buf.ctypes.data % HUGE_PAGE == 0
                assert part.buf.nbytes == os.path.getsize(part.path)


def test_without_map_private_or_madv_hugepage(model_file, monkeypatch):
    """What macOS / Windows lack: preload falls back to plain anonymous memory."""
    for name in ("MAP_PRIVATE", "MAP_ANONYMOUS", "MADV_HUGEPAGE"):
        monkeypatch.delattr(mmap, name, raising=False)
    with C.open(model_file) as mapped, C.open(model_file, preload=True) as pre:
        _same_contents(mapped, pre)
        assert not pre.raw("lm_head.weight").flags.writeable


def test_a_file_that_shrinks_while_read_is_a_bounds_error(model_file):
    with pytest.raises(C.BoundsError, match=r"x\.cmf: file shrank .* at 100 bytes, 200"):
        anon_copy(io.BytesIO(b"x" * 100), 200, "x.cmf")
    size = os.path.getsize(model_file)
    with open(model_file, "rb") as fh, pytest.raises(C.BoundsError, match=str(model_file)):
        anon_copy(fh, size + 1, str(model_file))
    with open(model_file, "rb") as fh:  # the exact size copies every byte
        buf, mm = anon_copy(fh, size, str(model_file))
    assert buf.tobytes() == model_file.read_bytes()
    del buf
    mm.close()


def test_llm_logits_identical():
    ids = [1, 5, 9, 2, 7, 3, 11, 4]
    out = {}
    for preload in (False, True):
        with cortiq.LLM(demo_path(), preload=preload) as llm:
            assert llm.file.preload is preload
            s = llm.session()
            out[preload] = (s.feed(ids, want="all"), s.feed([6], want="last"))
    for a, b in zip(out[False], out[True]):
        assert a.dtype == np.float32 and a.tobytes() == b.tobytes()


def test_llm_preload_default_and_validation(model_file, monkeypatch, tmp_path):
    toy = tmp_path / "toy.cmf"
    T.write_toy(toy)
    monkeypatch.setattr(_config, "_preload", True)
    with cortiq.LLM(toy) as llm:
        assert llm.file.preload is True
    with cortiq.LLM(toy, preload=False) as llm:
        assert llm.file.preload is False
    for bad in ("yes", 1, "0"):
        with pytest.raises(cortiq.ConfigError, match="preload"):
            cortiq.LLM(toy, preload=bad)


def test_cli_preload_flag(tmp_path, capsys, monkeypatch):
    toy = str(tmp_path / "toy.cmf")
    T.write_toy(toy)
    seen = []
    real_open = cortiq.runtime.llm._cmf.open

    def spy(path, preload=False, **kw):
        seen.append(preload)
        return real_open(path, preload=preload, **kw)

    monkeypatch.setattr(cortiq.runtime.llm._cmf, "open", spy)
    argv = ["run", toy, "-p", "hello world", "--greedy", "-n", "5"]
    outs = []
    for extra in ([], ["--preload"], ["--no-preload"]):
        assert main(argv + extra) == 0
        outs.append(capsys.readouterr().out)
    assert seen == [C.worth_preloading(toy), True, False] and outs[0] == outs[1] == outs[2]
    monkeypatch.setattr(_config, "_preload", True)  # CORTIQ_PRELOAD=1 ...
    assert main(argv) == 0 and main(argv + ["--no-preload"]) == 0  # ... and its override
    assert seen[3:] == [True, False]
    assert main(["bench", toy, "--tokens", "2", "--prompt-tokens", "4", "--json",
                 "--preload"]) == 0
    assert seen[5:] == [True]
    for cmd in ("chat", "serve"):
        args = build_parser().parse_args([cmd, toy, "--preload"])
        assert args.preload is True


def test_serve_preloads_by_default(tmp_path, monkeypatch):
    """A server copies the weights unless told not to (flag, or CORTIQ_PRELOAD=0)."""
    import cortiq.serve
    toy = str(tmp_path / "toy.cmf")
    T.write_toy(toy)
    seen = []
    monkeypatch.setattr(cortiq.serve, "serve", lambda llm, *a, **kw: seen.append(llm.file.preload))
    monkeypatch.setattr(_config, "_preload", None)  # CORTIQ_PRELOAD unset
    for extra in ([], ["--no-preload"], ["--preload"]):
        assert main(["serve", toy] + extra) == 0
    monkeypatch.setattr(_config, "_preload", False)  # CORTIQ_PRELOAD=0
    assert main(["serve", toy]) == 0
    assert seen == [True, False, True, False]
    assert _config.preload_default() is False and _config.config()["preload"] is False


def _thp(tmp_path, text):
    p = tmp_path / f"thp-{text.split('[')[1].split(']')[0]}"
    p.write_text(text)
    return str(p)


def _meminfo(tmp_path, avail_kib):
    p = tmp_path / "meminfo"
    p.write_text(f"MemTotal:       99999999 kB\nMemFree:          1000 kB\n"
                 f"MemAvailable:   {avail_kib} kB\nBuffers:   0 kB\n")
    return str(p)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE here")
def test_worth_preloading_rule(tmp_path):
    """The default copies a file only where huge pages are offered and it takes at most
    half the available memory."""
    f = tmp_path / "m.bin"
    f.write_bytes(b"\0" * 10240)                                   # 10 KiB
    always, madvise, never = (_thp(tmp_path, t) for t in (
        "[always] madvise never\n", "always [madvise] never\n", "always madvise [never]\n"))
    assert C.worth_preloading(f, always, _meminfo(tmp_path, 20))
    assert C.worth_preloading(f, madvise, _meminfo(tmp_path, 20))    # 10 KiB of 20 KiB
    assert not C.worth_preloading(f, madvise, _meminfo(tmp_path, 19))
    assert not C.worth_preloading(f, never, _meminfo(tmp_path, 1 << 30))
    assert not C.worth_preloading(f, str(tmp_path / "absent"), _meminfo(tmp_path, 1 << 30))
    assert not C.worth_preloading(f, madvise, str(tmp_path / "absent"))
    assert not C.worth_preloading(tmp_path / "missing.bin", madvise, _meminfo(tmp_path, 1 << 30))
    assert not C.worth_preloading(tmp_path, madvise, _meminfo(tmp_path, 1 << 30))  # a folder


def test_llm_preload_unset_follows_the_rule(monkeypatch, tmp_path):
    """CORTIQ_PRELOAD unset and no preload=: LLM asks worth_preloading (CPU models), and
    a set variable or an explicit argument wins over it."""
    toy = tmp_path / "toy.cmf"
    T.write_toy(toy)
    monkeypatch.setattr(_config, "_preload", None)
    asked = []
    for answer in (True, False):
        monkeypatch.setattr(C, "worth_preloading", lambda p, a=answer: asked.append(p) or a)
        with cortiq.LLM(toy) as llm:
            assert llm.file.preload is answer
        with cortiq.LLM(toy, preload=not answer) as llm:
            assert llm.file.preload is (not answer)
    assert asked == [str(toy), str(toy)]
    monkeypatch.setattr(_config, "_preload", False)
    with cortiq.LLM(toy) as llm:
        assert llm.file.preload is False and asked == [str(toy), str(toy)]
