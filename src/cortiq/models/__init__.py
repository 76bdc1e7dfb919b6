"""Model forwards, one module per architecture (dory, deepseek_v4, llama), and the one
registry that says which architectures this cortiq has.

An architecture is one `ArchSpec`: the `arch.arch_name` values its files carry, its
model class, its Hugging Face converter, its GPU model (if any) and its spec under
docs/models/. Classes and functions are named as lazy "module:attr" strings, so
importing the registry imports no model. `cortiq.LLM`, `cortiq.convert`, the CLI, the
GGUF import and `cortiq.gpu.to_device` all read it: adding an architecture is one model
module, one converter module and one line in `SPECS` (plus a GPU module if it has one).

A user model is added with `register(name, cls)` (a class taking
`(cmf_file, **options)` and implementing the protocol of `cortiq.models.base`), or a
whole spec with `register_arch(spec)`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class ArchSpec:
    """One architecture.

    names: the `arch.arch_name` values of its files (a family of several names shares
        one model and one converter, e.g. Llama, Mistral, Qwen2, Qwen3).
    model: "module:Class" of the model, or the class itself (user registration).
    converter: "module:function" converting a Hugging Face checkpoint directory
        (`convert(hf_dir, out_path, quant=..., progress=...)`); None: no converter.
    gpu_model: "module:Class" of the WebGPU model built from a host model
        (`cls(host_model, device)`); None: the architecture runs on the CPU only.
    docs: the path of its specification, relative to the repository root.
    """

    names: tuple[str, ...]
    model: Any
    converter: str | None = None
    gpu_model: str | None = None
    docs: str | None = None

    def __post_init__(self):
        if (not isinstance(self.names, tuple) or not self.names
                or not all(isinstance(n, str) and n for n in self.names)):
            raise ConfigError(f"ArchSpec.names: expected a non-empty tuple of non-empty "
                              f"strings, got {self.names!r}")
        if not (callable(self.model) or _is_ref(self.model)):
            raise ConfigError(f"ArchSpec {self.names[0]!r}: model must be a class or a "
                              f"'module:attr' string, got {self.model!r}")
        for what in ("converter", "gpu_model"):
            ref = getattr(self, what)
            if ref is not None and not _is_ref(ref):
                raise ConfigError(f"ArchSpec {self.names[0]!r}: {what} must be a "
                                  f"'module:attr' string or None, got {ref!r}")


def _is_ref(ref) -> bool:
    return isinstance(ref, str) and all(ref.partition(":")[::2])


#: the built-in architectures
SPECS: tuple[ArchSpec, ...] = (
    ArchSpec(("dory",), "cortiq.models.dory:DoryModel", "cortiq.convert.hf_dory:convert",
             "cortiq.gpu.dory:GpuDoryModel", "docs/models/dory.md"),
    ArchSpec(("deepseek_v4",), "cortiq.models.deepseek_v4:DeepseekV4Model",
             "cortiq.convert.hf_deepseek_v4:convert",
             "cortiq.gpu.deepseek_v4:GpuDeepSeekV4Model", "docs/models/deepseek-v4.md"),
    ArchSpec(("llama", "mistral", "qwen2", "qwen3"), "cortiq.models.llama:LlamaModel",
             "cortiq.convert.hf_llama:convert", "cortiq.gpu.llama:GpuLlamaModel",
             "docs/models/llama.md"),
)

# arch_name -> its spec: the built-in ones, then what users register
_BY_NAME: dict[str, ArchSpec] = {n: s for s in SPECS for n in s.names}


def resolve(ref, what: str = "object"):
    """The object a "module:attr" string names (anything else is returned as it is);
    ConfigError when the module or attribute is missing from this build."""
    if not isinstance(ref, str):
        return ref
    mod, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what} ({ref}) is not available in this build: {e}") from None


def builtin_spec(name: str) -> ArchSpec:
    """The built-in spec whose names include `name`, whatever users registered (the
    Llama family's names for the GGUF import and the Llama model)."""
    for s in SPECS:
        if name in s.names:
            return s
    raise ConfigError(f"{name!r} is not a built-in architecture "
                      f"(built in: {', '.join(n for s in SPECS for n in s.names)})")


def lookup(name) -> ArchSpec | None:
    """The spec registered for arch_name `name`, or None."""
    return _BY_NAME.get(name)


def arch_spec(name) -> ArchSpec:
    """The spec registered for arch_name `name` (ConfigError when there is none)."""
    spec = _BY_NAME.get(name)
    if spec is None:
        raise ConfigError(f"architecture {name!r} is not supported by this cortiq "
                          f"(supported: {', '.join(registered())})")
    return spec


def register_arch(spec: ArchSpec) -> None:
    """Register every name of `spec` (replacing what those names had)."""
    if not isinstance(spec, ArchSpec):
        raise ConfigError(f"models.register_arch: expected an ArchSpec, got {spec!r}")
    for n in spec.names:
        _BY_NAME[n] = spec


def register(name: str, cls) -> None:
    """Make `cortiq.LLM` open files whose `arch.arch_name` is `name` with `cls`. A
    built-in name keeps its converter and docs (its files are written as before); the
    GPU model, a twin of the built-in model, does not carry over to `cls`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"models.register: name must be a non-empty string, got {name!r}")
    if not callable(cls):
        raise ConfigError(f"models.register: {name!r}: expected a class, got {cls!r}")
    old = _BY_NAME.get(name)
    if old is None:
        _BY_NAME[name] = ArchSpec((name,), cls)
    else:
        _BY_NAME[name] = replace(old, names=(name,), model=cls, gpu_model=None)


def unregister(name: str) -> None:
    _BY_NAME.pop(name, None)


def registered() -> list:
    """Every registered arch_name, sorted."""
    return sorted(_BY_NAME)


def converter_names() -> list:
    """The arch_names a Hugging Face checkpoint can be converted to, in registration
    order."""
    return [n for n, s in _BY_NAME.items() if s.converter is not None]


def gpu_names() -> list:
    """The arch_names that have a GPU model, in registration order."""
    return [n for n, s in _BY_NAME.items() if s.gpu_model is not None]


def model_class(arch_name):
    """The class registered for `arch_name` (ConfigError when there is none)."""
    return resolve(arch_spec(arch_name).model, f"architecture {arch_name!r}: its model")
