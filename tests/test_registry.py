"""The architecture registry (cortiq.models: ArchSpec, SPECS): every built-in spec
resolves, and convert, the CLI, the GGUF import and gpu.to_device read their lists from
it (a spec registered here appears in each)."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import cortiq
import cortiq.models as M
from cortiq.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
FAKE_MODULE = "cortiq_test_fake_arch"


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test."""
    monkeypatch.setattr(M, "_BY_NAME", dict(M._BY_NAME))
    return M


@pytest.fixture
def fake(monkeypatch, registry):
    """A registered architecture "fakearch" whose parts live in a module made here."""
    mod = types.ModuleType(FAKE_MODULE)
    mod.calls = []

    class FakeModel:
        def __init__(self, cmf_file, **options):
            self.file = cmf_file

    class FakeGpuModel:
        def __init__(self, host_model, device):
            self.host, self.device = host_model, device

    def convert(hf_dir, out_path, quant="q8_row", progress=True):
        mod.calls.append((str(hf_dir), str(out_path), quant, progress))

    mod.FakeModel, mod.FakeGpuModel, mod.convert = FakeModel, FakeGpuModel, convert
    monkeypatch.setitem(sys.modules, FAKE_MODULE, mod)
    registry.register_arch(M.ArchSpec(("fakearch",), f"{FAKE_MODULE}:FakeModel",
                                      f"{FAKE_MODULE}:convert", f"{FAKE_MODULE}:FakeGpuModel",
                                      "docs/models/fakearch.md"))
    return mod


# ------------------------------------------------------------------ the built-in specs

@pytest.mark.parametrize("spec", M.SPECS, ids=lambda s: s.names[0])
def test_every_builtin_spec_resolves(spec):
    model = M.resolve(spec.model)
    assert isinstance(model, type) and issubclass(model, M.base.ModelBase)
    assert callable(M.resolve(spec.converter))
    if spec.gpu_model is not None:
        assert isinstance(M.resolve(spec.gpu_model), type)
    for name in spec.names:
        assert M.arch_spec(name) is spec and M.model_class(name) is model


@pytest.mark.parametrize("spec", M.SPECS, ids=lambda s: s.names[0])
def test_every_builtin_spec_has_its_docs(spec):
    assert spec.docs.startswith("docs/models/") and spec.docs.endswith(".md")
    assert (REPO / spec.docs).is_file(), f"{spec.names[0]}: {spec.docs} is missing"


def test_names_are_unique_across_specs():
    names = [n for s in M.SPECS for n in s.names]
    assert len(names) == len(set(names))


def test_importing_the_registry_imports_no_model():
    # the protocol (models.base) is what the runtime imports; no architecture comes
    code = ("import sys, cortiq.models as M; M.arch_spec('llama'); "
            "print(sorted(m for m in sys.modules if m.startswith(('cortiq.models.', "
            "'cortiq.convert', 'cortiq.gpu')) and m != 'cortiq.models.base'))")
    # the cortiq these tests import (the installed wheel in CI, a source tree by hand)
    env = dict(os.environ, PYTHONPATH=str(Path(cortiq.__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_llama_family_names_come_from_the_spec():
    from cortiq.gguf.llama_meta import architectures
    from cortiq.models.llama import ARCH_NAMES
    assert ARCH_NAMES == architectures() == M.builtin_spec("llama").names
    assert M.builtin_spec("qwen2") is M.builtin_spec("llama")


def test_bad_specs_are_refused():
    with pytest.raises(ConfigError, match="names"):
        M.ArchSpec("llama", "a:B")
    with pytest.raises(ConfigError, match="model"):
        M.ArchSpec(("x",), "no_colon")
    with pytest.raises(ConfigError, match="converter"):
        M.ArchSpec(("x",), "a:B", converter="a:")
    with pytest.raises(ConfigError, match="ArchSpec"):
        M.register_arch(("x",))
    with pytest.raises(ConfigError, match="not a built-in"):
        M.builtin_spec("toy-nonexistent")


# ------------------------------------------------------------------ user registration

def test_register_unregister_and_model_class(registry):
    class Mine:
        def __init__(self, cmf_file):
            pass

    registry.register("mine", Mine)
    assert "mine" in registry.registered() and registry.model_class("mine") is Mine
    assert registry.arch_spec("mine") == M.ArchSpec(("mine",), Mine)
    assert "mine" not in registry.converter_names() and "mine" not in registry.gpu_names()
    registry.unregister("mine")
    with pytest.raises(ConfigError, match="'mine' is not supported"):
        registry.model_class("mine")
    with pytest.raises(ConfigError, match="non-empty string"):
        registry.register("", Mine)
    with pytest.raises(ConfigError, match="expected a class"):
        registry.register("mine", 3)


def test_a_user_model_for_a_builtin_name_keeps_its_converter(registry):
    class Mine:
        pass

    registry.register("dory", Mine)
    spec = registry.arch_spec("dory")
    assert spec.model is Mine and spec.converter == M.builtin_spec("dory").converter
    assert spec.gpu_model is None and "dory" not in registry.gpu_names()


def test_a_model_missing_from_the_build_is_a_config_error(registry):
    registry.register_arch(M.ArchSpec(("ghost",), "cortiq_no_such_module:Model"))
    with pytest.raises(ConfigError, match="not available in this build"):
        registry.model_class("ghost")


# ------------------------------------------------------------------ readers of the registry

def test_convert_runs_the_registered_converter(fake, tmp_path):
    from cortiq.convert import convert_as, from_hf
    from cortiq.models import converter_names
    assert "fakearch" in converter_names()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "fakearch"}))
    from_hf(tmp_path, tmp_path / "o.cmf", quant="f16", progress=False)
    convert_as("fakearch", tmp_path, tmp_path / "p.cmf")
    assert fake.calls == [(str(tmp_path), str(tmp_path / "o.cmf"), "f16", False),
                          (str(tmp_path), str(tmp_path / "p.cmf"), "q8_row", True)]
    with pytest.raises(ConfigError, match="fakearch has no routed experts"):
        convert_as("fakearch", tmp_path, tmp_path / "q.cmf", experts_quant="q4tp")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(ConfigError, match=r"no converter \(supported: .*fakearch"):
        from_hf(tmp_path, tmp_path / "o.cmf")


def test_cli_convert_arch_comes_from_the_registry(fake, tmp_path, capsys):
    from cortiq.serve.cli import main
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{', '.join(M.converter_names())}, or auto" in help_text
    assert "fakearch" in help_text
    assert main(["convert", "--arch", "fakearch", str(tmp_path), str(tmp_path / "o.cmf"),
                 "--quiet"]) == 0
    assert fake.calls == [(str(tmp_path), str(tmp_path / "o.cmf"), "q8_row", False)]
    assert main(["convert", "--arch", "nonesuch", str(tmp_path), str(tmp_path / "o.cmf"),
                 "--quiet"]) == 1
    assert "--arch 'nonesuch': no converter" in capsys.readouterr().err


def test_cli_import_gguf_names_the_llama_family(capsys):
    from cortiq.serve.cli import main
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "/".join(M.builtin_spec("llama").names) in capsys.readouterr().out


def test_gguf_import_takes_the_llama_family_of_the_registry(monkeypatch):
    from cortiq.errors import FormatError
    from cortiq.gguf import llama_meta as G
    meta = G.Meta({"general.architecture": "llama9"})
    with pytest.raises(ConfigError, match="general.architecture: 'llama9'"):
        G.arch_from_gguf(meta, {})
    llama = M.builtin_spec("llama")
    wider = M.ArchSpec(llama.names + ("llama9",), llama.model, llama.converter)
    monkeypatch.setattr(M, "SPECS", tuple(wider if s is llama else s for s in M.SPECS))
    assert "llama9" in G.architectures()
    # past the architecture check: the next missing key is what stops it
    with pytest.raises(FormatError, match="llama9.embedding_length: missing"):
        G.arch_from_gguf(meta, {})


def test_to_device_builds_the_registered_gpu_model(fake):
    from cortiq.gpu import to_device

    class Host:
        arch = "fakearch"

    host, device = Host(), object()
    g = to_device(host, device)
    assert isinstance(g, fake.FakeGpuModel) and g.host is host and g.device is device
    Host.arch = "gpt2"      # no spec: runs nowhere, and the GPU list names fakearch
    with pytest.raises(ConfigError, match=r"gpt2 architecture runs on the CPU only in this cortiq \(GPU: .*fakearch"):
        to_device(Host(), device)
    assert cortiq.models.gpu_names()[-1] == "fakearch"
