"""The model argument every command takes (`cortiq.pretrained.resolve`), Hub selection
(`cortiq.hub`, with a fake Hub serving files from a local folder: no network), the
model cache (`cortiq models`, `cortiq rm`), progress, and the wrong-file messages."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

import cortiq
from cortiq import hub, model_cache, pretrained
from cortiq.errors import ConfigError
from cortiq.serve.cli import main

sys.path.insert(0, os.path.dirname(__file__))
import toy_model as T
import fake_hub as fake_hub_module

T.register()
huggingface_hub = pytest.importorskip("huggingface_hub")

GGUF_BYTES = b"GGUF\x03\x00\x00\x00" + bytes(24)   # resolve reads the magic only


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    return fake_hub_module.install(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("arg") / "toy.cmf"
    T.write_toy(p)
    return p


GGUF_REPO = {"model-Q4_K_M.gguf": GGUF_BYTES + b"q4km", "model-Q8_0.gguf": GGUF_BYTES + b"q8",
             "model-IQ2_XXS.gguf": GGUF_BYTES + b"iq2", "mmproj-model-f16.gguf": GGUF_BYTES,
             "README.md": b"# model"}


# -- argument forms -------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("Qwen/Qwen3-0.6B", ("Qwen/Qwen3-0.6B", None)),
    ("unsloth/Qwen3-0.6B-GGUF:q4_k_m", ("unsloth/Qwen3-0.6B-GGUF", "q4_k_m")),
    ("org/name:UD-Q4_K_XL", ("org/name", "UD-Q4_K_XL")),
    ("./x.cmf", None), ("x.cmf", None), ("models/x.cmf", None), ("org/x.gguf", None),
    ("a/b/c", None), ("/abs/path", None), ("../up/model", None), ("name", None),
])
def test_hub_id_or_path(text, want):
    assert hub.parse_hub_id(text) == want


@pytest.mark.parametrize("name,quant", [
    ("Qwen3-0.6B-Q4_K_M.gguf", "Q4_K_M"), ("llama-2-7b.q8_0.gguf", "Q8_0"),
    ("model-IQ2_XXS.gguf", "IQ2_XXS"), ("m-BF16.gguf", "BF16"), ("m-f16.gguf", "F16"),
    ("Big-Q4_K_M-00002-of-00003.gguf", "Q4_K_M"), ("Q5_K_S/Big-00001-of-00002.gguf", "Q5_K_S"),
    ("Qwen3-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"), ("plain.gguf", None),
])
def test_quant_of_a_file_name(name, quant):
    assert hub.quant_of(name) == quant


def test_local_files_resolve_to_themselves(tmp_path, toy_path):
    assert pretrained.resolve(toy_path, cache=tmp_path) == toy_path
    g = tmp_path / "m.gguf"
    g.write_bytes(GGUF_BYTES)
    assert pretrained.resolve(str(g), cache=tmp_path / "c") == g      # no conversion
    assert not (tmp_path / "c").exists()
    renamed = tmp_path / "model.bin"                                   # told by its magic
    renamed.write_bytes(GGUF_BYTES)
    assert pretrained.resolve(renamed) == renamed
    with pytest.raises(ConfigError, match="already a CMF file"):
        pretrained.resolve(toy_path, quant="q8_row")
    with pytest.raises(ConfigError, match="filename=.*local path"):
        pretrained.resolve(g, filename="x.gguf")


def test_wrong_files_say_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "fetch", lambda *a, **k: pytest.fail("a path went to the Hub"))
    st = tmp_path / "ckpt" / "model.safetensors"
    st.parent.mkdir()
    st.write_bytes((2).to_bytes(8, "little") + b"{}")
    with pytest.raises(ConfigError, match="safetensors weight file; pass the checkpoint dir"):
        pretrained.resolve(st)
    with pytest.raises(ConfigError, match="no config.json"):
        pretrained.resolve(st.parent)
    (st.parent / "m.gguf").write_bytes(GGUF_BYTES)
    assert pretrained.resolve(st.parent) == st.parent / "m.gguf"   # the one model there
    (st.parent / "n.gguf").write_bytes(GGUF_BYTES)
    with pytest.raises(ConfigError, match="no config.json.*pass one of them"):
        pretrained.resolve(st.parent)
    for missing in ("./x.cmf", "x.gguf", str(tmp_path / "nope"), "models/x.cmf"):
        with pytest.raises(ConfigError, match="no such file or directory"):
            pretrained.resolve(missing)
    bad = tmp_path / "bad.cmf"
    bad.write_bytes(b"PK\x03\x04" + bytes(20))
    with pytest.raises(ConfigError, match="not a CMF file"):
        pretrained.resolve(bad)
    other = tmp_path / "weights.pt"
    other.write_bytes(b"\x80\x02" + bytes(20))
    with pytest.raises(ConfigError, match="expected a .cmf or .gguf file"):
        pretrained.resolve(other)


def test_a_split_part_stands_for_its_set(tmp_path):
    part = tmp_path / "Big-Q4_K_M-00002-of-00003.gguf"
    part.write_bytes(GGUF_BYTES)
    assert pretrained.resolve(part) == part          # cortiq.gguf opens the whole set


def test_a_folder_holding_one_model(tmp_path, toy_path):
    one = tmp_path / "one"
    one.mkdir()
    shutil.copyfile(toy_path, one / "toy.cmf")
    (one / "README.md").write_text("a model")
    assert pretrained.resolve(one) == one / "toy.cmf"
    split = tmp_path / "split"
    split.mkdir()
    for i in (2, 1, 3):
        (split / f"Big-Q8_0-0000{i}-of-00003.gguf").write_bytes(GGUF_BYTES)
    (split / "mmproj-Big-f16.gguf").write_bytes(GGUF_BYTES)     # a projector, no model
    assert pretrained.resolve(split) == split / "Big-Q8_0-00001-of-00003.gguf"
    (split / "Big-Q4_K_M.gguf").write_bytes(GGUF_BYTES)
    with pytest.raises(ConfigError, match=r"holds 2 models: pass one of them "
                                          r"\(Big-Q4_K_M.gguf, Big-Q8_0-00001-of-00003.gguf\)"):
        pretrained.resolve(split)
    with pytest.raises(ConfigError, match="filename=.*local path"):
        pretrained.resolve(one, filename="toy.cmf")


# -- Hub selection ----------------------------------------------------------------------

def test_quant_selector(fake_hub, tmp_path):
    fake_hub.add("org/m-GGUF", GGUF_REPO)
    p = pretrained.resolve("org/m-GGUF:q8_0", progress=False)
    assert p.name == "model-Q8_0.gguf" and p.read_bytes().endswith(b"q8")
    assert p.is_relative_to(tmp_path / "cache")
    with pytest.raises(ConfigError, match=r"no Q5_K_M GGUF file \(quants: IQ2_XXS, Q4_K_M, "
                                          r"Q8_0\)"):
        pretrained.resolve("org/m-GGUF:Q5_K_M", progress=False)
    # without a selector: Q4_K_M (llama.cpp's default); the projector is never a choice
    assert pretrained.resolve("org/m-GGUF", progress=False).name == "model-Q4_K_M.gguf"
    assert pretrained.resolve("org/m-GGUF", filename="model-IQ2_XXS.gguf",
                              progress=False).name == "model-IQ2_XXS.gguf"
    with pytest.raises(ConfigError, match="no file 'model-Q2_K.gguf'"):
        pretrained.resolve("org/m-GGUF", filename="model-Q2_K.gguf", progress=False)


def test_ambiguous_and_quant_less_repos(fake_hub):
    fake_hub.add("org/two", {"a-Q8_0.gguf": GGUF_BYTES, "b-Q8_0.gguf": GGUF_BYTES})
    with pytest.raises(ConfigError, match=r"several GGUF files match \(a-Q8_0.gguf, "
                                          r"b-Q8_0.gguf\).*--filename"):
        pretrained.resolve("org/two:Q8_0", progress=False)
    fake_hub.add("org/nodefault", {"m-Q8_0.gguf": GGUF_BYTES, "m-F16.gguf": GGUF_BYTES})
    with pytest.raises(ConfigError, match=r"no Q4_K_M.*quants: F16, Q8_0"):
        pretrained.resolve("org/nodefault", progress=False)
    fake_hub.add("org/one", {"m-Q6_K.gguf": GGUF_BYTES})
    assert pretrained.resolve("org/one", progress=False).name == "m-Q6_K.gguf"
    fake_hub.add("org/empty", {"README.md": b"x"})
    with pytest.raises(ConfigError, match="neither a checkpoint"):
        pretrained.resolve("org/empty", progress=False)


def test_split_gguf_downloads_every_part(fake_hub, tmp_path):
    fake_hub.add("org/big", {f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf": GGUF_BYTES
                             for i in (1, 2, 3)} | {"Big-Q8_0.gguf": GGUF_BYTES})
    first = pretrained.resolve("org/big:Q4_K_M", progress=False)
    assert first.name == "Big-Q4_K_M-00001-of-00003.gguf"
    got = [c[2] for c in fake_hub.calls if c[0] == "download"]
    assert got == [f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert sorted(p.name for p in first.parent.iterdir()) == [
        f"Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    fake_hub.add("org/broken", {"X-00001-of-00002.gguf": GGUF_BYTES})
    with pytest.raises(ConfigError, match="1 of its 2 parts"):
        pretrained.resolve("org/broken", progress=False)


def test_hub_failures_are_one_line_with_what_to_do(fake_hub, monkeypatch):
    with pytest.raises(ConfigError, match="no such repo on the Hugging Face Hub"):
        pretrained.resolve("org/missing", progress=False)

    def offline(*a, **k):
        from huggingface_hub.errors import OfflineModeIsEnabled
        raise OfflineModeIsEnabled("offline mode is enabled")
    monkeypatch.setattr(huggingface_hub, "list_repo_files", offline)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        pretrained.resolve("org/anything", progress=False)

    def no_network(*a, **k):
        raise ConnectionError("Name or service not known")
    monkeypatch.setattr(huggingface_hub, "list_repo_files", no_network)
    with pytest.raises(ConfigError, match="cannot reach the Hugging Face Hub.*HF_HUB_OFFLINE"):
        pretrained.resolve("org/anything", progress=False)


def test_hub_id_without_huggingface_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "_hub", lambda: None)
    with pytest.raises(ConfigError, match=r"pip install 'cortiq\[hub\]'"):
        pretrained.resolve("some-org/some-model", cache=tmp_path)


def test_a_finished_download_is_reused_offline(fake_hub):
    fake_hub.add("org/m-GGUF", GGUF_REPO)
    first = pretrained.resolve("org/m-GGUF:Q4_K_M", progress=False)
    n = len(fake_hub.calls)
    assert pretrained.resolve("org/m-GGUF:q4_k_m", progress=False) == first
    assert len(fake_hub.calls) == n                     # no Hub call the second time


# -- progress ---------------------------------------------------------------------------

def test_progress_follows_the_terminal_unless_asked(fake_hub, monkeypatch):
    from huggingface_hub.utils import are_progress_bars_disabled

    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

        def write(self, s):
            return len(s)

        def flush(self):
            pass
    monkeypatch.setattr(sys, "stderr", Tty(False))
    assert pretrained.progress_default(None) is False
    assert pretrained.progress_default(True) is True
    monkeypatch.setattr(sys, "stderr", Tty(True))
    assert pretrained.progress_default(None) is True
    assert pretrained.progress_default(False) is False
    before = are_progress_bars_disabled()
    fake_hub.add("org/m-GGUF", GGUF_REPO)
    pretrained.resolve("org/m-GGUF:Q8_0")                     # a terminal: bars on
    monkeypatch.setattr(sys, "stderr", Tty(False))
    pretrained.resolve("org/m-GGUF:IQ2_XXS")                  # not a terminal: off
    pretrained.resolve("org/m-GGUF:Q4_K_M", progress=True)    # asked for: on
    assert main(["info", "org/m-GGUF", "--filename", "mmproj-model-f16.gguf",
                 "--no-progress"]) == 1
    assert fake_hub.bars == [True, False, True, False]
    assert are_progress_bars_disabled() == before             # restored


# -- the cache: cortiq models, cortiq rm --------------------------------------------------

def _models(capsys, *extra):
    capsys.readouterr()
    assert main(["models", "--json", *extra]) == 0
    return {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}


def test_models_lists_and_rm_removes(fake_hub, tmp_path, capsys):
    fake_hub.add("org/m-GGUF", GGUF_REPO)
    pretrained.resolve("org/m-GGUF:Q8_0", progress=False)
    pretrained.resolve("org/m-GGUF:Q4_K_M", progress=False)
    listed = _models(capsys)
    assert set(listed) == {"org--m-GGUF--Q8_0", "org--m-GGUF--Q4_K_M"}
    q8 = listed["org--m-GGUF--Q8_0"]
    assert (q8["source"], q8["source_kind"], q8["format"], q8["quant"]) == \
        ("org/m-GGUF:Q8_0", "hub", "gguf", "Q8_0")
    assert q8["size"] >= len(GGUF_REPO["model-Q8_0.gguf"]) and q8["last_used"] > 0
    assert main(["models"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "SOURCE", "FROM", "FORMAT", "QUANT", "SIZE", "LAST",
                                "USED"]
    assert any(line.startswith("org--m-GGUF--Q8_0") and "org/m-GGUF:Q8_0" in line
               for line in table)
    # an ambiguous prefix lists the candidates and removes nothing
    assert main(["rm", "org--m"]) == 1
    assert "ambiguous" in capsys.readouterr().err and len(_models(capsys)) == 2
    assert main(["rm", "org--m-GGUF--Q8"]) == 0
    assert "removed org--m-GGUF--Q8_0" in capsys.readouterr().out
    assert set(_models(capsys)) == {"org--m-GGUF--Q4_K_M"}
    cache = tmp_path / "cache"
    assert sorted(p.name for p in cache.iterdir()) == ["org--m-GGUF--Q4_K_M",
                                                       "org--m-GGUF--Q4_K_M.manifest.json"]
    assert main(["rm", "--all"]) == 0
    assert list(cache.iterdir()) == []


def test_rm_never_leaves_the_cache(fake_hub, tmp_path, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.cmf").write_bytes(b"CMF\x01")
    (cache / "link").symlink_to(outside, target_is_directory=True)
    for name in ("../precious", str(outside), "..", "link/keep.cmf", "."):
        assert main(["rm", name]) == 1
        assert "not a cache entry name" in capsys.readouterr().err
    assert main(["rm", "nothing"]) == 1
    assert "no such entry" in capsys.readouterr().err
    assert main(["rm", "link"]) == 0                   # the link goes, never its target
    assert not os.path.lexists(cache / "link") and (outside / "keep.cmf").is_file()
    entry = model_cache.Entry(name="../precious", path=outside)
    with pytest.raises(ConfigError, match="not inside the cache"):
        model_cache.remove(entry, cache)
    assert (outside / "keep.cmf").is_file()


def test_rm_without_names(fake_hub, capsys):
    assert main(["rm"]) == 1
    assert "--all" in capsys.readouterr().err
    assert main(["models"]) == 0
    assert "no models in" in capsys.readouterr().out


# -- commands given the wrong kind of file -----------------------------------------------

def test_commands_name_the_right_command(tmp_path, toy_path, capsys):
    g = tmp_path / "m.gguf"
    g.write_bytes(GGUF_BYTES)
    cases = [
        (["convert", str(g), str(tmp_path / "o.cmf")], "cortiq import-gguf"),
        (["convert", str(toy_path), str(tmp_path / "o.cmf")], "already a CMF file"),
        (["convert", str(tmp_path / "ckpt.safetensors"), str(tmp_path / "o.cmf")], None),
        (["import-gguf", str(tmp_path / "hf"), str(tmp_path / "o.cmf")], "cortiq convert"),
        (["import-gguf", str(toy_path), str(tmp_path / "o.cmf")], "already a CMF file"),
        (["convert", str(tmp_path), str(tmp_path / "o.cmf")], "cortiq import-gguf"),
        # a GGUF is described and checked as it is: this one lacks its architecture
        (["info", str(g)], "general.architecture: missing"),
        (["verify", str(g)], "general.architecture: missing"),
        (["run", "./missing.cmf", "-p", "x"], "no such file or directory"),
        (["info", "--quant", "f32"], "--quant needs a MODEL"),
    ]
    st = tmp_path / "ckpt.safetensors"
    st.write_bytes((2).to_bytes(8, "little") + b"{}")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    cases[2] = (cases[2][0], "pass the directory holding config.json")
    cases.append((["run", str(st), "-p", "x"], "pass the checkpoint directory"))
    for argv, needle in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)


def test_llm_says_what_opens_a_folder_or_hub_id(tmp_path):
    from cortiq.errors import FormatError
    with pytest.raises(FormatError, match=r"a directory, not a model file; "
                                          r"LLM.from_pretrained\("):
        cortiq.LLM(tmp_path)
    with pytest.raises(FormatError, match=r"org/name:Q4_K_M: no such file; a Hugging Face "
                                          r"Hub id opens with LLM.from_pretrained\("):
        cortiq.LLM("org/name:Q4_K_M")
    with pytest.raises(FormatError, match=r"no such file$"):
        cortiq.LLM(tmp_path / "missing.cmf")


def test_from_pretrained_passes_filename(fake_hub, monkeypatch):
    fake_hub.add("org/m-GGUF", GGUF_REPO)
    seen = {}

    def fake_init(self, path, **kw):
        seen["path"] = path
    monkeypatch.setattr(cortiq.LLM, "__init__", fake_init)
    cortiq.LLM.from_pretrained("org/m-GGUF", filename="model-Q8_0.gguf", progress=False)
    assert Path(seen["path"]).name == "model-Q8_0.gguf"
