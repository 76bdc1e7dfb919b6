"""Model forwards, one module per architecture (dory, deepseek_v4, llama), plus their configs.

`cortiq.LLM` picks the model class by the file's `arch.arch_name` through a small
registry: built-in architectures are imported lazily on first use; anything else can
be added with `register(name, cls)` (a class taking `(cmf_file, **options)` and
implementing the model protocol of `cortiq.session`).
"""
from __future__ import annotations

import importlib

from ..errors import ConfigError

# arch_name -> "module:Class" (imported on first use) or the class itself.
_REGISTRY: dict = {"dory": "cortiq.models.dory:DoryModel",
                    "deepseek_v4": "cortiq.models.deepseek_v4:DeepseekV4Model",
                    **{name: "cortiq.models.llama:LlamaModel"
                       for name in ("llama", "mistral", "qwen2", "qwen3")}}


def register(name: str, cls) -> None:
    """Make `cortiq.LLM` open files whose `arch.arch_name` is `name` with `cls`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"models.register: name must be a non-empty string, got {name!r}")
    if not callable(cls):
        raise ConfigError(f"models.register: {name!r}: expected a class, got {cls!r}")
    _REGISTRY[name] = cls


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered() -> list:
    return sorted(_REGISTRY)


def model_class(arch_name):
    """The class registered for `arch_name` (ConfigError when there is none)."""
    entry = _REGISTRY.get(arch_name)
    if entry is None:
        raise ConfigError(f"architecture {arch_name!r} is not supported by this cortiq "
                          f"(supported: {', '.join(registered())})")
    if isinstance(entry, str):
        mod, _, attr = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"architecture {arch_name!r}: its model ({entry}) is not "
                              f"available in this build: {e}") from None
    return entry
