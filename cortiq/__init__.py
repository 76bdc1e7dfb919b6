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
