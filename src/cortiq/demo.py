"""The demo model bundled with cortiq: a tiny Dory, so a first command produces text.

``src/cortiq/data/demo.cmf`` is a ~6.6 M-parameter Dory (q8_row, with its byte-level BPE
tokenizer and a ChatML template) trained by ``tools/train_demo.py`` on the docstrings of
the Python standard library. It knows a little about Python and nothing else; it is here
so that ``cortiq.LLM()`` and ``cortiq run --prompt ...`` work with no download.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import ConfigError

DEMO_FILE = "demo.cmf"


def demo_path() -> str:
    """Path of the bundled demo model (ConfigError when this install lacks it)."""
    p = resources.files(__package__).joinpath("data").joinpath(DEMO_FILE)
    if not p.is_file():
        raise ConfigError(f"no model path given and the bundled demo model ({DEMO_FILE}) is "
                          "missing from this install of cortiq")
    if not isinstance(p, Path):              # pragma: no cover - zipped installs only
        raise ConfigError("cortiq is installed as a zip; the bundled demo model must be a "
                          "real file (CMF files are memory-mapped): pass a model path")
    return str(p)
