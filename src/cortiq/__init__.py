"""cortiq: run CMF v2 language models (Dory, DeepSeek-V4) fast on the CPU."""
from .errors import (ConfigError, CortiqError, FormatError, KernelError, ModelError,
                     TemplateError)
from .kernels._config import (__version__, config, get_int8_activations, get_num_threads,
                              get_precision, set_int8_activations, set_num_threads,
                              set_precision)
from .runtime.diagnostics import show_config
from .runtime.llm import LLM
from .runtime.sampling import SamplingParams

__all__ = [
    "LLM",
    "ConfigError",
    "CortiqError",
    "FormatError",
    "KernelError",
    "ModelError",
    "SamplingParams",
    "TemplateError",
    "__version__",
    "config",
    "get_int8_activations",
    "get_num_threads",
    "get_precision",
    "set_int8_activations",
    "set_num_threads",
    "set_precision",
    "show_config",
]
