"""cortiq: run CMF v2 language models (Dory, DeepSeek-V4) fast on the CPU."""
from ._config import __version__, config, get_num_threads, set_num_threads, show_config
from .errors import ConfigError, CortiqError, FormatError, KernelError, TemplateError

__all__ = [
    "ConfigError",
    "CortiqError",
    "FormatError",
    "KernelError",
    "TemplateError",
    "__version__",
    "config",
    "get_num_threads",
    "set_num_threads",
    "show_config",
]


def __getattr__(name):  # [dsv4] cortiq.LLM without importing the runtime at import time
    if name == "LLM":
        from .llm import LLM
        return LLM
    raise AttributeError(f"module 'cortiq' has no attribute {name!r}")
