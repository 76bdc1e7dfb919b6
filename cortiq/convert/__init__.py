"""Converters from Hugging Face checkpoints to CMF v2 files (need the ``convert`` extra)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def from_hf(hf_dir, out_path, quant: str = "q8_row", progress: bool = True) -> None:
    """Convert the Hugging Face model in ``hf_dir`` to ``out_path`` (by its model_type)."""
    p = Path(hf_dir) / "config.json"
    try:
        model_type = json.loads(p.read_text()).get("model_type")
    except FileNotFoundError:
        raise ConfigError(f"{p}: missing (not a Hugging Face model directory)") from None
    if model_type == "dory":
        from .hf_dory import convert
        return convert(hf_dir, out_path, quant=quant, progress=progress)
    if model_type == "deepseek_v4":
        from .hf_deepseek_v4 import convert
        return convert(hf_dir, out_path, quant=quant, progress=progress)
    raise ConfigError(f"{p}: model_type {model_type!r}: no converter (supported: dory, "
                      "deepseek_v4)")
