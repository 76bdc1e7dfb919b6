"""Converters from Hugging Face checkpoints to CMF v2 files (need the ``convert`` extra)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def from_hf(hf_dir, out_path, quant: str = "q8_row", progress: bool = True,
            experts_quant: str | None = None) -> None:
    """Convert the Hugging Face model in ``hf_dir`` to ``out_path`` (by its config.json's
    ``architectures`` / ``model_type``; a DeepSeek reference ``config.json`` without one
    counts as deepseek_v4). ``experts_quant`` (MoE models only) stores the routed experts
    in another dtype."""
    p = Path(hf_dir) / "config.json"
    try:
        config = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: missing (not a Hugging Face model directory)") from None
    except ValueError as e:
        raise ConfigError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{p}: not a JSON object")
    model_type = config.get("model_type")
    if model_type is None:
        from .hf_deepseek_v4 import is_reference_config
        if is_reference_config(config):
            model_type = "deepseek_v4"
    if experts_quant is not None and model_type != "deepseek_v4":
        raise ConfigError(f"--experts-quant: {model_type!r} has no routed experts")
    from .hf_llama import arch_name_of
    if arch_name_of(config) is not None:
        from .hf_llama import convert as convert_llama
        return convert_llama(hf_dir, out_path, quant=quant, progress=progress)
    if model_type == "dory":
        from .hf_dory import convert as convert_dory
        return convert_dory(hf_dir, out_path, quant=quant, progress=progress)
    if model_type == "deepseek_v4":
        from .hf_deepseek_v4 import convert as convert_dsv4
        return convert_dsv4(hf_dir, out_path, quant=quant, progress=progress,
                            experts_quant=experts_quant)
    raise ConfigError(f"{p}: model_type {model_type!r} (architectures "
                      f"{config.get('architectures')!r}): no converter (supported: dory, "
                      "deepseek_v4, llama, mistral, qwen2, qwen3)")
