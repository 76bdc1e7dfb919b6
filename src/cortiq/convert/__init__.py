"""Converters from Hugging Face checkpoints to CMF v2 files (need the ``convert`` extra).

Which converter runs is the architecture registry's (`cortiq.models.SPECS`): each
architecture names its converter function, called as
``convert(hf_dir, out_path, quant=..., progress=...)``; a converter that serves several
arch_names takes ``expect`` (the name asked for), one for MoE models ``experts_quant``.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

from ..errors import ConfigError
from ..models import converter_names, lookup, resolve


def _read_config(hf_dir) -> tuple[Path, dict]:
    p = Path(hf_dir) / "config.json"
    try:
        config = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: missing (not a Hugging Face model directory)") from None
    except ValueError as e:
        raise ConfigError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{p}: not a JSON object")
    return p, config


def arch_name_of(config: dict) -> str | None:
    """The arch_name of a Hugging Face config.json: the Llama family's by its
    ``architectures`` class, else its ``model_type`` (a DeepSeek reference config
    without one counts as deepseek_v4)."""
    from .hf_llama import arch_name_of as llama_family_name
    name = llama_family_name(config)
    if name is not None:
        return name
    model_type = config.get("model_type")
    if model_type is None:
        from .hf_deepseek_v4 import is_reference_config
        if is_reference_config(config):
            return "deepseek_v4"
    return model_type


def _takes(fn, option: str) -> bool:
    return option in inspect.signature(fn).parameters


def convert_as(arch_name: str, hf_dir, out_path, quant: str = "q8_row", progress: bool = True,
               experts_quant: str | None = None) -> None:
    """Convert ``hf_dir`` with the converter registered for ``arch_name`` (ConfigError
    when there is none, or when ``experts_quant`` is given to a model without routed
    experts)."""
    spec = lookup(arch_name)
    if spec is None or spec.converter is None:
        raise ConfigError(f"--arch {arch_name!r}: no converter (supported: "
                          f"{', '.join(converter_names())}, auto)")
    convert = resolve(spec.converter, f"the {arch_name} converter")
    options: dict = {}
    if experts_quant is not None:
        if not _takes(convert, "experts_quant"):
            raise ConfigError(f"--experts-quant: {arch_name} has no routed experts")
        options["experts_quant"] = experts_quant
    if _takes(convert, "expect"):
        options["expect"] = arch_name
    convert(hf_dir, out_path, quant=quant, progress=progress, **options)


def from_hf(hf_dir, out_path, quant: str = "q8_row", progress: bool = True,
            experts_quant: str | None = None) -> None:
    """Convert the Hugging Face model in ``hf_dir`` to ``out_path`` (by its config.json's
    ``architectures`` / ``model_type``, `arch_name_of`). ``experts_quant`` (MoE models
    only) stores the routed experts in another dtype."""
    p, config = _read_config(hf_dir)
    name = arch_name_of(config)
    spec = None if name is None else lookup(name)
    if name is None or spec is None or spec.converter is None:
        raise ConfigError(f"{p}: model_type {config.get('model_type')!r} (architectures "
                          f"{config.get('architectures')!r}): no converter (supported: "
                          f"{', '.join(converter_names())})")
    convert_as(name, hf_dir, out_path, quant=quant, progress=progress,
               experts_quant=experts_quant)


__all__ = ["arch_name_of", "convert_as", "from_hf"]
