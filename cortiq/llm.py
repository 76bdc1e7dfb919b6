"""`cortiq.LLM`: open a CMF model once, serve many sessions from it.

This is the minimal front of the runtime: load, pick the architecture, hand out
sessions. Tokenizer, chat templates, sampling and generation build on it.
"""
from __future__ import annotations

import os

from . import cmf as _cmf
from ._config import set_num_threads
from .errors import ConfigError
from .session import Session


def _model_class(arch_name: str):
    if arch_name == "dory":
        from .models.dory import DoryModel
        return DoryModel
    if arch_name == "deepseek_v4":
        from .models.deepseek_v4 import DeepseekV4Model
        return DeepseekV4Model
    raise ConfigError(f"architecture {arch_name!r} is not supported by this cortiq "
                      "(supported: dory, deepseek_v4)")


class LLM:
    """A loaded model. `LLM(path, n_threads=None, **model_options)`; model options are
    the architecture's keyword options (for Dory: loops, kv_mode, gate, prompt_loops,
    full_window)."""

    def __init__(self, path: str | os.PathLike | None = None, *, n_threads: int | None = None,
                 **model_options):
        if path is None:
            raise ConfigError("no model path given (this build bundles no demo model yet)")
        if n_threads is not None:
            set_num_threads(n_threads)
        self.path = os.fspath(path)
        self.file = _cmf.open(self.path)
        arch = self.file.arch.get("arch_name")
        self.model = _model_class(arch)(self.file, **model_options)

    @property
    def arch(self) -> str:
        return self.model.arch

    @property
    def vocab_size(self) -> int:
        return self.model.vocab

    def session(self) -> Session:
        """A new, empty sequence on this model."""
        return Session(self.model)

    def close(self) -> None:
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
