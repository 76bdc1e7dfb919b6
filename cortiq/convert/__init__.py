"""Converters from Hugging Face checkpoints to CMF v2 files (need the ``convert`` extra)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def from_hf(hf_dir, out_path, quant: str = "q8_row", progress: bool = True,
            experts_quant: str | None = None) -> None:
    """Convert the Hugging Face model in ``hf_dir`` to ``out_path`` (by its model_type;
    a DeepSeek reference ``config.json`` without one counts as deepseek_v4).
    ``experts_quant`` (MoE models only) stores the routed experts in another dtype."""
    p = Path(hf_dir) / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: missing (not a Hugging Face model directory)") from None
    except ValueError as e:
        raise ConfigError(f"{p}: not valid JSON: {e}") from None
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if model_type is None and isinstance(cfg, dict):
        from .hf_deepseek_v4 import is_reference_config
        if is_reference_config(cfg):
            model_type = "deepseek_v4"
    if experts_quant is not None and model_type != "deepseek_v4":
        raise ConfigError(f"--experts-quant: {model_type!r} has no routed experts")
    if model_type == "dory":
        from .hf_dory import convert
        return convert(hf_dir, out_path, quant=quant, progress=progress)
    if model_type == "deepseek_v4":
        from .hf_deepseek_v4 import convert
        return convert(hf_dir, out_path, quant=quant, progress=progress,
                       experts_quant=experts_quant)
    raise ConfigError(f"{p}: model_type {model_type!r}: no converter (supported: dory, "
                      "deepseek_v4)")
